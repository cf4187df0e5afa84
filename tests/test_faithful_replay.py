"""Real commands replayed against what their trace recorded: each executed step's exit and
output beside the recorded ones, a diverging step named with both first lines, a step the arm
kills on purpose not counted, recorded edits applied (sandbox and container) before the commands that use
them, a task's workspace copied in (and its environment on PATH), and a trace whose task has no
workspace failing by name instead of passing in an empty directory."""
from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from helpers import EXP_MODULE
from pytest_agentcgroup.arms import Arm
from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.metrics import faithfulness
from pytest_agentcgroup.metrics.records import step_record
from pytest_agentcgroup.replay import SandboxExecutor, replay
from pytest_agentcgroup.replay.executors.base import Seed, SeedFailed
from pytest_agentcgroup.traces.ir import Outcome, Step, Trace, write_trace
from pytest_agentcgroup.traces.task import Task

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
REPO_PATH = "/workspace/acme__widget__1.0"
TASK = Task(instance_id="acme__widget-7", repository="acme/widget", version="1.0", path=REPO_PATH)


def bash(i, cmd, code=None, head=None, **args):
    outcome = None if code is None else Outcome("ok" if code == 0 else "failed", code)
    return Step(i, "bash", {"command": cmd, "cwd": REPO_PATH, **args}, recorded_outcome=outcome, recorded_output=head)


def edit(i, op, path, status="ok", **args):
    return Step(i, "edit", {"op": op, "path": path, **args}, native_tool="str_replace_editor",
                recorded_outcome=Outcome(status), recorded_output="File created successfully" if op == "create" else "edited")


def run_sandbox(tree, steps, *, arm=None, seed=None, name="t"):
    trace = Trace(f"test/{name}", {"format": "test"}, tuple(steps), task=TASK)
    ex = SandboxExecutor(step_timeout_s=30)
    ex.seed = seed
    results = replay(trace, ex, ArmPlacement(arm or Arm("unlimited"), tree.workload(name), tree.controllers))
    return [step_record(r, s, config=(arm or Arm("unlimited")).name, time_scale=1.0, executor="sandbox")
            for r, s in zip(results, steps)]


@needs_bwrap
def test_a_step_that_ends_otherwise_than_recorded_is_named_with_both_first_lines(tree):
    recs = run_sandbox(tree, [
        bash(0, "echo hello; echo second >&2", 0, "hello\nsecond"),
        bash(1, "no-such-python-here --version", 0, "pytest 8.3.3"),
        bash(2, "exit 3", 3),
        Step(3, "noop", {}),
    ], name="diverge")
    assert [r.get("diverged") for r in recs] == [False, True, False, None]
    assert recs[0]["replayed_head"] == "hello" and recs[0]["recorded_exit"] == recs[0]["replayed_exit"] == 0
    assert (recs[1]["recorded_exit"], recs[1]["replayed_exit"]) == (0, 127)
    assert "not found" in recs[1]["replayed_head"] and recs[1]["recorded_head"] == "pytest 8.3.3"
    assert recs[1]["divergence"] == "exit 127; recorded exit 0"
    assert "diverged" not in recs[3]                      # recorded nothing, executed nothing: not compared
    why = faithfulness.failure(recs, 0.2)
    assert why is not None and "1 of 3 compared steps diverged" in why and "step 1 (bash: 'no-such-python-here" in why
    assert "recorded: pytest 8.3.3" in why and "replayed: " in why and "not found" in why.split("replayed: ")[1]
    assert faithfulness.failure(recs, 0.5) is None        # 33 % is within a share of 50 %
    # emulate runs no recorded command: nothing is compared there
    assert "diverged" not in step_record(_result_of(recs[1]), bash(1, "x", 0), config="u", time_scale=1.0,
                                         executor="emulate")


def _result_of(rec):
    from pytest_agentcgroup.replay.replayer import StepResult
    return StepResult(rec["trace_id"], rec["step_id"], rec["tool"], rec["cmd"], rec["executed"], rec["latency_ms"],
                      rec["exit_code"], rec["signal"], rec["timed_out"], rec["profile_source"])


def test_a_profiled_outcome_is_compared_only_in_a_trace_whose_source_recorded_none():
    """A trace profiled here (recorded-here) is compared with its profile's outcomes; a public
    trajectory's step that recorded no outcome (mini-swe-agent's last `git diff --cached`) is not
    compared with the profile this machine added to it: that would measure this machine, not the
    trajectory."""
    from pytest_agentcgroup.replay.replayer import StepResult
    step = Step(0, "bash", {"command": "git diff --cached"}, outcome=Outcome("failed", 128))
    ran = StepResult("t", 0, "bash", "git diff --cached", True, 5.0, 128, None, False, "recorded")
    alone = step_record(ran, step, config="u", time_scale=1.0, executor="sandbox")
    assert alone["diverged"] is False and alone["recorded_exit"] == 128
    assert "diverged" not in step_record(ran, step, config="u", time_scale=1.0, executor="sandbox",
                                         source_recorded=True)


def test_a_comparison_with_the_profiling_run_is_named_reproducibility_not_faithfulness():
    """Compared with the profile's outcome (this machine's earlier run), the line and the failure
    say reproducibility; compared with the source's record, `as recorded` and `from the trace`."""
    from pytest_agentcgroup.replay.replayer import StepResult
    ran = StepResult("t", 0, "bash", "exit 1", True, 5.0, 1, None, False, "recorded")
    mine = step_record(ran, Step(0, "bash", {"command": "exit 1"}, outcome=Outcome("ok", 0)), config="u",
                       time_scale=1.0, executor="sandbox")
    theirs = step_record(ran, bash(0, "exit 1", 0), config="u", time_scale=1.0, executor="sandbox")
    assert (mine["against"], theirs["against"]) == ("profile", "source")
    (line,) = faithfulness.summary_lines([mine])
    assert "0/1 compared steps as in its profiling run here (reproducibility, not faithfulness)" in line
    assert "diverged from its profiling run here (reproducibility)" in faithfulness.failure([mine], 0.2)
    assert "compared steps as recorded" in faithfulness.summary_lines([theirs])[0]
    assert "diverged from the trace" in faithfulness.failure([theirs], 0.2)
    # mini-swe-agent's submit step: its recorded diff is its outcome (an ok exit 0), as in the one rule
    submit = Step(1, "bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git diff --cached"},
                  recorded_output="diff --git a/x b/x\n")
    failed = StepResult("t", 1, "bash", "git diff", True, 5.0, 128, None, False, "recorded")
    rec = step_record(failed, submit, config="u", time_scale=1.0, executor="sandbox", source_recorded=True)
    assert (rec["against"], rec["recorded_exit"], rec["diverged"]) == ("source", 0, True)


@needs_bwrap
def test_a_step_the_arm_kills_on_purpose_is_not_a_divergence_and_a_timeout_is(tree):
    """The arm's OOM kill (a 48 MiB hard limit under a 200 MiB allocation) ends a step the trajectory
    recorded as exit 0: said, not counted against the replay. A step that runs into its timeout here
    (it did not there) is a divergence: the arm did not do that."""
    hog = "python3 -c 'b = bytearray(200 * 1024 * 1024); print(len(b))'"
    recs = run_sandbox(tree, [bash(0, hog, 0, "209715200"), bash(1, "sleep 20", 0, timeout_ms=500),
                              bash(2, "true", 0)], arm=Arm("static-toolcall", memory_max_mb=48), name="armkill")
    assert recs[0]["oom_kills"] >= 1 and recs[0]["diverged"] is None, recs[0]
    assert recs[0]["divergence"].startswith("not counted: stopped: this tool call was killed at its memory limit (it had used ")
    assert recs[1]["timed_out"] and recs[1]["diverged"] is True
    assert recs[1]["divergence"] == "killed at its timeout; recorded exit 0"
    assert recs[2]["diverged"] is False
    assert faithfulness.tally(recs)[:3] == (2, 1, 1) and "step 1" in faithfulness.failure(recs, 0.0)
    assert faithfulness.failure(recs, 0.5) is None


@needs_bwrap
def test_recorded_edits_are_applied_before_the_commands_that_run_them(tree):
    script = f"{REPO_PATH}/greet.py"
    recs = run_sandbox(tree, [
        edit(0, "create", script, file_text="print('hello from the agent')\n"),
        bash(1, "python3 greet.py", 0, "hello from the agent"),
        edit(2, "str_replace", script, old_str="hello from", new_str="goodbye from"),
        bash(3, "python3 greet.py", 0, "goodbye from the agent"),
        edit(4, "insert", script, insert_line=0, new_str="print('first')"),
        bash(5, "head -1 greet.py", 0, "print('first')"),
        edit(6, "str_replace", script, old_str="text the file never had", new_str="x"),
        edit(7, "undo_edit", script),
        bash(8, "python3 greet.py", 0, "goodbye from the agent"),
        edit(9, "create", script, status="failed", file_text="again"),
        Step(10, "edit", {"op": "edit", "path": script, "bytes": 10}, native_tool="Edit"),
    ], name="edits")
    assert [r["executed"] for r in recs] == [True] * 10 + [False]    # an edit recorded without its text: not applied
    assert recs[1]["replayed_head"] == "hello from the agent" and recs[3]["replayed_head"] == "goodbye from the agent"
    assert recs[5]["replayed_head"] == "print('first')"
    assert recs[8]["replayed_head"] == "goodbye from the agent"      # the insert undone
    assert recs[6]["diverged"] and recs[6]["divergence"] == "the edit did not apply (exit 1); recorded ok"
    assert "did not appear verbatim" in recs[6]["replayed_head"]
    assert recs[9]["diverged"] is False and "already exists" in recs[9]["replayed_head"]     # failed as recorded
    assert [r["step_id"] for r in recs if r.get("diverged")] == [6]


@needs_bwrap
def test_claude_codes_write_edit_and_multi_edit_apply_as_that_tool_does(tree):
    """The claude-code converter's edit steps (Write, Edit with replace_all, MultiEdit) applied for real:
    Write overwrites, replace_all replaces every occurrence, and a MultiEdit whose second edit does
    not apply leaves the file as it was (Claude Code applies all of them or none)."""
    script = f"{REPO_PATH}/count.py"

    def cc(i, op, native, status="ok", **args):
        return Step(i, "edit", {"op": op, "path": script, **args}, native_tool=native,
                    recorded_outcome=Outcome(status), recorded_output="updated")
    recs = run_sandbox(tree, [
        cc(0, "write", "Write", file_text="count = 1\nprint(count, count)\n"),
        cc(1, "write", "Write", file_text="count = 2\nprint(count, count)\n"),                      # over an existing file
        bash(2, "python3 count.py", 0, "2 2"),
        cc(3, "str_replace", "Edit", old_str="count", new_str="total"),                     # several: refused
        cc(4, "str_replace", "Edit", old_str="count", new_str="total", replace_all=True),
        bash(5, "python3 count.py", 0, "2 2"),
        cc(6, "multi_edit", "MultiEdit", edits=[{"old_str": "total = 2", "new_str": "total = 3"},
                                                {"old_str": "print(total, total)",
                                                 "new_str": "print(total * total)"}]),
        bash(7, "python3 count.py", 0, "9"),
        cc(8, "multi_edit", "MultiEdit", status="failed",
           edits=[{"old_str": "total = 3", "new_str": "total = 4"}, {"old_str": "never there", "new_str": "x"}]),
        bash(9, "python3 count.py", 0, "9"),                                              # nothing of step 8 written
        cc(10, "str_replace", "Edit", status="failed", old_str="total = 3", new_str="total = 3"),   # no change: refused
    ], name="cc-edits")
    assert all(r["executed"] for r in recs), recs
    assert [r["step_id"] for r in recs if r.get("diverged")] == [3]
    assert "Multiple occurrences" in recs[3]["replayed_head"]
    assert recs[8]["diverged"] is False and "edit 2 of 2" in recs[8]["replayed_head"]
    assert recs[10]["diverged"] is False and "are the same" in recs[10]["replayed_head"]
    assert [recs[i]["replayed_head"] for i in (2, 5, 7, 9)] == ["2 2", "2 2", "9", "9"]


@needs_bwrap
def test_swe_agents_edits_apply_as_its_tools_did_and_one_its_linter_refused_is_not_applied(tree, tmp_path):
    """A SWE-agent .traj (v1: state after each action) through its converter, then replayed: `create`,
    `insert` at the end, `edit N:M`, `edit SEARCH REPLACE` and `str_replace_editor` write the script
    the agent then runs; the edit its linter refused (the tool's answer says so) is not applied here
    either, and the commands' outputs say so."""
    from dataclasses import replace as with_
    from pytest_agentcgroup.traces.convert import swe_agent_traj

    def act(action, observation=""):
        return {"action": action, "observation": observation, "response": "", "thought": "",
                "state": {"open_file": f"{REPO_PATH}/reproduce.py", "working_dir": REPO_PATH}}
    lint = "Your proposed edit has introduced new syntax error(s).\nYour changes have NOT been applied."
    traj = {"trajectory": [
        act("create reproduce.py", f"[File: {REPO_PATH}/reproduce.py (1 lines total)]\n1:"),
        act("insert 'print(\"hello\")\nprint(\"x\")\n'", f"[File: {REPO_PATH}/reproduce.py (3 lines total)]"),
        act("python3 reproduce.py"),
        act("edit 3:3\nprint(\"y\")\nend_of_edit", f"[File: {REPO_PATH}/reproduce.py (3 lines total)]\nFile updated."),
        act("python3 reproduce.py"),
        act("edit 'print(\"hello\")' 'print(\"bye\")'", "Text replaced. Please review the changes"),
        act("edit 3:3\n  print(\"broken\"\nend_of_edit", lint),
        act(f"str_replace_editor str_replace {REPO_PATH}/reproduce.py   --old_str 'print(\"y\")' --new_str 'print(\"z\")'",
            f"The file {REPO_PATH}/reproduce.py has been edited."),
        act("python3 reproduce.py"),
        act("tr '\\n' '|' < reproduce.py"),
    ], "history": [{"role": "user", "content": f"the task\n(Open file: n/a)\n(Current directory: {REPO_PATH})\nbash-$"}],
        "info": {}}
    (tmp_path / "t.traj").write_text(json.dumps(traj))
    steps = list(next(swe_agent_traj.convert(tmp_path / "t.traj")).steps)
    # what each command printed first there; the file: create's empty line, then the edits
    heads = {2: "hello", 4: "hello", 8: "bye", 9: '|print("bye")|print("z")'}
    steps = [with_(s, recorded_outcome=Outcome("ok", 0), recorded_output=heads[s.step_id]) if s.tool == "bash" else s
             for s in steps]
    recs = run_sandbox(tree, steps, name="swe-edits")
    assert [r["executed"] for r in recs] == [True] * 6 + [False, True, True, True], recs
    assert [r.get("diverged") for r in recs] == [False] * 6 + [None] + [False] * 3, recs
    assert recs[0]["replayed_head"].startswith("File created successfully")
    assert recs[3]["replayed_head"].startswith("File updated")
    assert [recs[i]["replayed_head"] for i in (2, 4, 8, 9)] == ["hello", "hello", "bye", '|print("bye")|print("z")']


@needs_bwrap
def test_swe_agent_0x_edit_writes_every_line_back_and_str_replace_editor_expands_tabs(tree, tmp_path):
    """SWE-agent 0.x (.traj state as a JSON string, taken before each action): its bash `edit N:M`
    writes every line back with a newline, one empty replacement line stays a line; then
    str_replace_editor finds spaces where the file has a tab, as that tool (it expands tabs) did."""
    from dataclasses import replace as with_
    from pytest_agentcgroup.traces.convert import swe_agent_traj
    script = f"{REPO_PATH}/t.py"

    def act(action, observation, opened=script):
        return {"action": action, "observation": observation, "response": "", "thought": "",
                "state": json.dumps({"open_file": opened, "working_dir": REPO_PATH})}
    traj = {"trajectory": [
        act("create t.py", f"[File: {script} (1 lines total)]\n1:", opened="n/a"),
        act("edit 1:1\nif x:\n\treturn 1\nend_of_edit", f"[File: {script} (2 lines total)]\nFile updated."),
        act("edit 3:3\n\nend_of_edit", f"[File: {script} (3 lines total)]\nFile updated."),
        act(f"str_replace_editor str_replace {script} --old_str '        return 1' --new_str '        return 2'",
            f"The file {script} has been edited."),
        act("tr '\\n\\t' '|T' < t.py", ""),
    ], "history": [], "info": {}}
    (tmp_path / "t.traj").write_text(json.dumps(traj))
    steps = list(next(swe_agent_traj.convert(tmp_path / "t.traj")).steps)
    steps[4] = with_(steps[4], recorded_outcome=Outcome("ok", 0), recorded_output="if x:|        return 2||")
    recs = run_sandbox(tree, steps, name="swe-v0")
    assert [r.get("diverged") for r in recs] == [False] * 5, recs
    assert recs[4]["replayed_head"] == "if x:|        return 2||"


@pytest.mark.parametrize("text, edit, after", [
    # SWE-agent 0.x's bash `edit N:M`: lines[0:N-1] + new + lines[M:], each written with a newline
    ("1\n2\n3\n4\n5\n6\n", {"start_line": 5, "end_line": 3, "new_str": "X\n"}, "1\n2\n3\n4\nX\n4\n5\n6\n"),
    ("1\n2", {"start_line": 1, "end_line": 2, "new_str": ""}, "\n"),          # printf "%s\n" of nothing
    ("a\nb", {"start_line": 3, "end_line": 3, "new_str": "c\n"}, "a\nb\nc\n"),
])
def test_the_editor_follows_swe_agent_0x_bash_edit(tmp_path, text, edit, after):
    from pytest_agentcgroup.replay import editor
    f = tmp_path / "f.py"
    f.write_text(text)
    assert editor.apply({"op": "replace_lines", "path": str(f), "line_ends": True, **edit})[0] == 0
    assert f.read_text() == after


def test_the_editor_inserts_past_the_end_only_where_the_tool_did(tmp_path):
    from pytest_agentcgroup.replay import editor
    f = tmp_path / "f.py"
    f.write_text("a\nb\n")
    assert editor.apply({"op": "insert", "path": str(f), "insert_line": 49, "new_str": "Z"})[0] == 1   # OpenHands
    assert editor.apply({"op": "insert", "path": str(f), "insert_line": 49, "new_str": "Z", "clamp_line": True}) \
        == (0, f"The file {f} has been edited.")
    assert f.read_text() == "a\nb\n\nZ"                  # SWE-agent 1.1's windowed insert, list.insert


@needs_bwrap
def test_an_edit_larger_than_one_argument_is_applied_whole_and_one_beyond_arg_max_refused(tree):
    """A file an agent wrote is often bigger than the 128 KiB the kernel passes in one argument: the
    edit goes to the editor in pieces (cut between characters: the text is multi-byte throughout)
    and arrives whole; one beyond what a program's arguments can carry is refused, naming its size."""
    from pytest_agentcgroup.replay.executors.base import EDIT_ARGV_MAX, MAX_ARG_STRLEN
    big = f"{REPO_PATH}/big.txt"
    text = "é€😀 line\n" * 30000                   # 450 KB of UTF-8: four arguments
    assert len(text.encode()) > 3 * MAX_ARG_STRLEN
    digest = __import__("hashlib").sha256(text.encode()).hexdigest()
    recs = run_sandbox(tree, [
        edit(0, "create", big, file_text=text),
        bash(1, "sha256sum big.txt | cut -c1-64", 0, digest),
        edit(2, "str_replace", big, old_str="é€😀 line\n" * 2, new_str=""),
        bash(3, "wc -l < big.txt", 0, str(text.count("\n") - 2)),
        edit(4, "create", f"{REPO_PATH}/huge.txt", file_text="x" * EDIT_ARGV_MAX),
    ], name="bigedit")
    assert recs[0]["executed"] and recs[0]["exit_code"] == 0, recs[0]
    assert recs[1]["replayed_head"] == digest and recs[1]["diverged"] is False
    assert recs[3]["diverged"] is False, recs[3]
    assert not recs[4]["executed"] and "more than a program's arguments can carry" in recs[4]["error"], recs[4]


@needs_bwrap
def test_a_seed_is_copied_to_the_tasks_path_with_its_environment_first_on_path(tree, tmp_path):
    src, env = tmp_path / "src", tmp_path / "env"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("VALUE = 42\n")
    (env / "bin").mkdir(parents=True)
    tool = env / "bin" / "python"
    tool.write_text("#!/bin/sh\necho the environment python\n")
    tool.chmod(0o755)
    seed = Seed(path=REPO_PATH, source=src, env_path="/opt/conda/envs/testbed", env_source=env)
    recs = run_sandbox(tree, [bash(0, "python3 -c 'import pkg; print(pkg.VALUE)'", 0, "42"),
                              bash(1, "python --version", 0), bash(2, "touch pkg/new && ls pkg", 0),
                              bash(3, "command -v python", 0)], seed=seed, name="seed")
    assert recs[0]["replayed_head"] == "42" and recs[1]["replayed_head"] == "the environment python"
    assert recs[3]["replayed_head"] == "/opt/conda/envs/testbed/bin/python"
    assert not (src / "pkg" / "new").exists()              # the steps wrote their copy, not the seed


@needs_bwrap
def test_a_seed_that_does_not_fit_the_workspace_tmpfs_fails_the_replay_not_skips_it(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(b"x" * (3 << 20))            # 3 MiB into a 2 MiB tmpfs
    ex = SandboxExecutor(step_timeout_s=30, workspace_mb=2)
    ex.seed = Seed(path=REPO_PATH, source=src)
    with pytest.raises(SeedFailed, match=r"cannot copy the workspace .* into its 2 MiB tmpfs"):
        ex.start(Trace("test/seed-too-big", {"format": "test"}, (bash(0, "true", 0),)))


def docker_executor(engine, tree, work, **kw):
    from pytest_agentcgroup.cgroups.container import cgroup_parent, steps_in_container
    from pytest_agentcgroup.replay import DockerExecutor
    ex = DockerExecutor(engine, cgroup_parent=cgroup_parent(tree, work), step_timeout_s=60, **kw)
    return ex, steps_in_container(tree, work, ex)


def test_under_docker_a_seed_and_the_recorded_edits_are_there_for_the_commands(tree, tmp_path, agentcgroup_docker):
    """The docker executor copies the task's workspace and environment into its container (the local
    image: a read-only root) and applies the recorded edits there, as the sandbox does."""
    src, env = tmp_path / "src", tmp_path / "env"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "__init__.py").write_text("VALUE = 42\n")
    (src / "link").symlink_to("pkg/__init__.py")
    (env / "bin").mkdir(parents=True)
    tool = env / "bin" / "python"
    tool.write_text("#!/bin/sh\necho the environment python\n")
    tool.chmod(0o755)
    script = f"{REPO_PATH}/greet.py"
    steps = [bash(0, "python3 -c 'import pkg; print(pkg.VALUE)'", 0, "42"),
             bash(1, "python --version", 0), bash(2, "command -v python", 0),
             bash(3, "touch pkg/new && readlink link", 0, "pkg/__init__.py"),
             edit(4, "create", script, file_text="print('hello from the agent')\n"),
             bash(5, "python3 greet.py", 0, "hello from the agent"),
             edit(6, "str_replace", script, old_str="hello from", new_str="goodbye from"),
             bash(7, "python3 greet.py", 0, "goodbye from the agent"),
             edit(8, "str_replace", script, old_str="text the file never had", new_str="x")]
    trace = Trace("test/docker-seed", {"format": "test"}, tuple(steps), task=TASK)
    work = tree.workload("docker-seed")
    ex, nest_in = docker_executor(agentcgroup_docker, tree, work)
    ex.seed = Seed(path=REPO_PATH, source=src, env_path="/opt/conda/envs/testbed", env_source=env)
    results = replay(trace, ex, ArmPlacement(Arm("unlimited"), work, tree.controllers, nest_in=nest_in))
    recs = [step_record(r, s, config="unlimited", time_scale=1.0, executor="docker") for r, s in zip(results, steps)]
    assert [r["executed"] for r in recs] == [True] * len(steps), recs
    assert recs[0]["replayed_head"] == "42" and recs[1]["replayed_head"] == "the environment python"
    assert recs[2]["replayed_head"] == "/opt/conda/envs/testbed/bin/python"
    assert recs[3]["replayed_head"] == "pkg/__init__.py"                 # a link stays a link
    assert recs[5]["replayed_head"] == "hello from the agent" and recs[7]["replayed_head"] == "goodbye from the agent"
    assert [r["step_id"] for r in recs if r.get("diverged")] == [8]     # the edit that does not apply
    assert "did not appear verbatim" in recs[8]["replayed_head"]
    assert not (src / "pkg" / "new").exists()                           # the steps wrote their copy


def test_under_docker_a_seed_that_does_not_fit_fails_the_replay_naming_it(tree, tmp_path, agentcgroup_docker):
    src = tmp_path / "src"
    src.mkdir()
    (src / "big").write_bytes(b"x" * (3 << 20))            # 3 MiB into a 2 MiB tmpfs
    work = tree.workload("docker-seed-big")
    ex, _ = docker_executor(agentcgroup_docker, tree, work, tmpfs_mb={"home": 2, "workspace": 2})
    ex.seed = Seed(path=REPO_PATH, source=src)
    with pytest.raises(SeedFailed, match=rf"cannot copy {src} to {REPO_PATH} in its container \(a 2 MiB tmpfs; exit 2\): tar: big: Wrote only"):
        ex.start(Trace("test/seed-too-big", {"format": "test"}, (bash(0, "true", 0),), task=TASK))
    assert ex.container is None                            # stopped: nothing left running
    # a task path over the container's own system places would hide what runs the steps
    ex.seed = Seed(path="/usr/lib/acme", source=src)
    with pytest.raises(SeedFailed, match="cannot put a workspace at /usr/lib/acme: it would hide"):
        ex.start(Trace("test/seed-over-usr", {"format": "test"}, (bash(0, "true", 0),), task=TASK))
    assert ex.container is None


@needs_bwrap
def test_a_seed_over_a_system_place_fails_the_replay_naming_it(tmp_path):
    (tmp_path / "src").mkdir()
    ex = SandboxExecutor(step_timeout_s=30)
    for where in ("/usr/lib/acme", "/etc", "/.agentcgroup-state/x"):
        ex.seed = Seed(path=where, source=tmp_path / "src")
        with pytest.raises(SeedFailed, match=f"the sandbox executor cannot put a workspace at {where}: it would hide"):
            ex.start(Trace("test/seed-over-usr", {"format": "test"}, (bash(0, "true", 0),)))
        assert ex.base is None                             # nothing mounted, nothing left


def _study(root, trace: Trace, *, workspace: str | None = None, max_divergence: float | None = None):
    (root / "traces").mkdir()
    write_trace(trace, root / "traces" / "t.json")
    (root / "traces" / "manifest.json").write_text(json.dumps({
        "schema": "agentcgroup-manifest/1", "subsets": {"smoke": [trace.trace_id]},
        "traces": [{"trace_id": trace.trace_id, "file": "t.json"}]}))
    extra = (f"workspace = {json.dumps(workspace)}\n" if workspace else "") + \
        (f"max_divergence = {max_divergence}\n" if max_divergence is not None else "")
    (root / "study.toml").write_text(textwrap.dedent("""
        traces = "traces"
        [defaults]
        executor = "sandbox"
        time_scale = 1.0
        step_timeout_s = 30
        """) + extra + "[arms.unlimited]\n[experiments.exp1]\nsubset = \"smoke\"\n")


OPENHANDS_LIKE = Trace("openhands-rows/acme__widget-7/0", {"format": "openhands-rows"}, (
    bash(0, "cd /workspace/acme__widget__1.0 && python3 -c 'import widget; print(widget.NAME)'", 0, "widget"),
    edit(1, "create", f"{REPO_PATH}/reproduce.py", file_text="import widget\nprint('reproduced', widget.NAME)\n"),
    bash(2, "python3 reproduce.py", 0, "reproduced widget"),
), task=TASK)


@needs_bwrap
def test_a_trace_whose_task_has_no_workspace_fails_naming_it(pytester, tree):
    _study(pytester.path, OPENHANDS_LIKE)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                        "--agentcgroup-out", "out", timeout=300)
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    assert "trace openhands-rows/acme__widget-7/0 ran on task acme__widget-7 (repository acme/widget, version 1.0, " \
           f"at {REPO_PATH}), and its workspace is missing here" in out
    assert "--agentcgroup-workspace DIR" in out and "agentcgroup traces lock" in out
    assert not (pytester.path / "out" / "latest" / "metrics.jsonl").exists() or \
        not (pytester.path / "out" / "latest" / "metrics.jsonl").read_text().strip()    # nothing replayed


@needs_bwrap
def test_a_users_own_workspace_replays_as_recorded_and_the_summary_says_so(pytester, tree):
    checkout = pytester.path / "checkout"
    (checkout / "widget").mkdir(parents=True)
    (checkout / "widget" / "__init__.py").write_text("NAME = 'widget'\n")
    _study(pytester.path, OPENHANDS_LIKE, workspace="checkout")
    pytester.makepyfile(test_exp1=EXP_MODULE)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                        "--agentcgroup-out", "out", timeout=300)
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*agentcgroup faithfulness*",
                              f"exp1  unlimited  openhands-rows/acme__widget-7/0: 3/3 compared steps as recorded (100%); "
                              f"workspace directory {checkout} at {REPO_PATH}"])
    recs = [json.loads(x) for x in (pytester.path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()]
    assert [r["diverged"] for r in recs] == [False, False, False]
    assert recs[0]["workspace_chosen_by"] == "--agentcgroup-workspace" and recs[2]["replayed_head"] == "reproduced widget"


@needs_bwrap
def test_a_replay_diverging_beyond_the_configured_share_fails_naming_the_first_step(pytester, tree):
    checkout = pytester.path / "checkout"
    checkout.mkdir()                         # no widget package: steps 0 and 2 end with exit 1
    _study(pytester.path, OPENHANDS_LIKE, workspace="checkout", max_divergence=0.5)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                        "--agentcgroup-out", "out", timeout=300)
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    assert "the replay is not faithful to its trace: openhands-rows/acme__widget-7/0: 2 of 3 compared steps " \
           "diverged from the trace (67%, more than max_divergence 50%); the first:" in out
    assert "step 0 (bash: \"cd /workspace/acme__widget__1.0 && python3 -c 'import widget; print(widget.NA...\"): " \
           "exit 1; recorded exit 0" in out
    assert "recorded: widget" in out
    assert "replayed: Traceback (most recent call last): ... ModuleNotFoundError: No module named 'widget'" in out
    # the option wins over the config: a share of 1 lets every step diverge
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                        "--agentcgroup-out", "out", "--agentcgroup-max-divergence", "1", timeout=300)
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*openhands-rows/acme__widget-7/0: 1/3 compared steps as recorded (33%)*"
                              "first divergence: step 0: exit 1; recorded exit 0"])
