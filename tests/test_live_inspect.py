"""Inspect (the real package, pinned in the `inspect` extra) on the live runtime, end to end: a task with
`sandbox="agentcgroup"` found through Inspect's entry point (live/inspect_sandbox.py), its own agent
loop (basic_agent with the bash tool) driven by its own mock model (mockllm) on a git workspace,
each command in a cgroup of its own under the arm: a normal sample, a command killed at its limit
whose note is in the model's next input, and the trace written, accepted by `agentcgroup traces
validate`."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from helpers import cgroups_or_skip, git_workspace
from pytest_agentcgroup.notes import stopped_note
from pytest_agentcgroup.traces.ir import read_traces

inspect_ai = pytest.importorskip("inspect_ai", reason="inspect-ai not installed (pip install -e '.[inspect]')")

from inspect_ai import Task, eval as inspect_eval                          # noqa: E402
from inspect_ai.dataset import Sample                                      # noqa: E402
from inspect_ai.model import ModelOutput, ModelUsage, get_model                       # noqa: E402
from inspect_ai.solver import basic_agent                                  # noqa: E402
from inspect_ai.tool import bash                                           # noqa: E402
from inspect_ai.util import SandboxEnvironmentSpec                         # noqa: E402

REPO = Path(__file__).resolve().parents[1]
HOG = "python3 -c 'b = bytearray(200 * 1024 * 1024); print(len(b))'"


TASK_BY_NAME = """
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import basic_agent
from inspect_ai.tool import bash
outputs = [ModelOutput.for_tool_call("mockllm/model", "bash", {"command": "cat /proc/self/cgroup"}),
           ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"})]
for o in outputs:
    o.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
task = Task(dataset=[Sample(input="where do you run?")], solver=basic_agent(tools=[bash()]),
            sandbox=("agentcgroup", "static-toolcall"))
log, = eval(task, model=get_model("mockllm/model", custom_outputs=outputs), log_dir="logs", display="none")
assert log.status == "success", log.error
print(next(m.text for m in log.samples[0].messages if m.role == "tool"))
"""


@pytest.mark.slow
def test_a_task_names_the_sandbox_and_inspect_finds_it_by_its_entry_point(host, tmp_path):
    """Nothing of this package imported first: Inspect loads it through the entry point that installing
    the package registers (pyproject.toml); a config string is the arm's name."""
    found = {e.name: e.value for e in entry_points(group="inspect_ai")}
    assert found.get("agentcgroup") == "pytest_agentcgroup.live.inspect_sandbox", (
        f"entry point inspect_ai/agentcgroup not installed ({found}): reinstall the package (make setup)")
    done = subprocess.run([sys.executable, "-c", TASK_BY_NAME], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^0::.*/agentcgroup-live-[0-9a-f]+/s\d+$", done.stdout, re.M), done.stdout


@pytest.fixture
def host():
    return cgroups_or_skip()


@pytest.fixture
def workspace(tmp_path):
    return git_workspace(tmp_path)


def scripted(*commands):
    """mockllm's outputs: a bash call per command, then submit; the input of each turn kept."""
    outputs = [ModelOutput.for_tool_call("mockllm/model", "bash", {"command": c}) for c in commands]
    outputs.append(ModelOutput.for_tool_call("mockllm/model", "submit", {"answer": "done"}))
    for output in outputs:      # given, so that mockllm does not count tokens (its tokenizer is a download)
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    inputs = []

    def generate(input, tools, tool_choice, config):      # each sample's turn n gets output n
        inputs.append(list(input))
        return outputs[sum(m.role == "assistant" for m in input)]
    return get_model("mockllm/model", custom_outputs=generate), inputs


def run_task(tmp_path, workspace, model, arm: str, samples: int = 1) -> tuple[object, Path]:
    # importing the config's type registers the sandbox too; the entry-point test runs without it
    from pytest_agentcgroup.live.inspect_sandbox import AgentCgroupSandboxConfig
    arms = tmp_path / "arms.toml"
    arms.write_text("[arms.small]\nmemory_max_mb = 64\n")
    traces = tmp_path / "traces"
    config = AgentCgroupSandboxConfig(arm=arm, config=str(arms), workspace=str(workspace), trace_dir=str(traces))
    task = Task(dataset=[Sample(input="fix add in calc.py", id=i) for i in range(samples)],
                solver=basic_agent(tools=[bash(timeout=60)]),
                sandbox=SandboxEnvironmentSpec("agentcgroup", config), message_limit=20)
    log, = inspect_eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")
    assert log.status == "success", log.error
    return log, traces


def tool_results(messages) -> list[str]:
    return [m.text for m in messages if m.role == "tool" and m.function == "bash"]


def validate(trace: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_agentcgroup.cli", "traces", "validate", str(trace)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_bad_sandbox_config_is_one_message(tmp_path):
    from pytest_agentcgroup.live import SessionError
    from pytest_agentcgroup.live.inspect_sandbox import _config
    bad = tmp_path / "sandbox.toml"
    bad.write_text('arm = "small"\nimage = "python"\n')
    with pytest.raises(SessionError,
                       match=f"{bad}: not an agentcgroup sandbox config: image: Extra inputs are not permitted$"):
        _config(str(bad))
    good = tmp_path / "good.toml"
    good.write_text('arm = "small"\nconfig = "arms.toml"\n')
    assert _config(str(good)).config == str(tmp_path / "arms.toml")
    assert _config("/task/dir/static-env").arm == "static-env"       # Inspect made the arm's name a path
    import asyncio
    from pytest_agentcgroup.live.inspect_sandbox import AgentCgroupSandboxEnvironment, AgentCgroupSandboxConfig
    missing = AgentCgroupSandboxConfig(arm="static-env", workspace=str(tmp_path / "gone"))
    with pytest.raises(SessionError, match=f"config workspace: {tmp_path / 'gone'} is not a directory$"):
        asyncio.run(AgentCgroupSandboxEnvironment.sample_init("t", missing, {}))


def test_a_task_with_sandbox_agentcgroup_runs_each_command_in_its_own_cgroup(host, workspace, tmp_path):
    model, inputs = scripted("sed -i 's/a - b/a + b/' calc.py && git diff --stat && cat /proc/self/cgroup",
                             "python3 -c 'b = bytearray(20 << 20); print(\"ok\")'")
    log, traces = run_task(tmp_path, workspace, model, "small", samples=2)
    first, second = tool_results(log.samples[0].messages)
    assert tool_results(log.samples[1].messages)[1] == second
    assert "1 file changed" in first, first
    leaves = [re.search(r"/(agentcgroup-live-[0-9a-f]+)/s(\d+)$", line) for line in first.splitlines()
              if line.startswith("0::")]
    assert len(leaves) == 1 and leaves[0], first                       # the call's own cgroup, under the session's
    session, call_id = leaves[0].group(1), int(leaves[0].group(2))
    assert not (host.unified / session).exists()                       # removed at the sample's end
    assert second.strip() == "ok"
    assert workspace.joinpath("calc.py").read_text().endswith("a - b\n")     # each sample edited a copy
    # two samples (Inspect runs them at once), a session and a trace each, both in the directory's manifest
    files = sorted(p for p in traces.glob("*.json") if p.name != "manifest.json")
    ids = {next(read_traces(p)).trace_id: p for p in files}
    listed = json.loads((traces / "manifest.json").read_text())["subsets"]["live"]
    assert len(ids) == 2 and sorted(listed) == sorted(ids)
    for trace_id, trace_file in ids.items():
        trace = next(read_traces(trace_file))
        # Inspect's own probe (who runs the commands) is a call too: the bash calls are the last two
        fix, alloc = trace.steps[-2:]
        assert fix.step_id == call_id and fix.args["command"].startswith("bash --login -c ")
        assert all(s.recorded_outcome.status == "ok" for s in trace.steps) and "ended_at" in trace.source
        assert 15 <= alloc.profile.peak_mb.value <= 64 and alloc.profile.peak_mb.provenance == "recorded"
        assert trace_id.startswith("live/small/inspect/") and validate(trace_file).returncode == 0


def test_a_command_killed_at_its_limit_is_in_the_models_next_input_with_the_note(host, workspace, tmp_path):
    model, inputs = scripted(HOG, "echo still here")
    log, traces = run_task(tmp_path, workspace, model, "small")
    told = [m for m in inputs[1] if m.role == "tool"]               # the turn after the killed command
    assert len(told) == 1 and told[0].text.startswith("stopped: this tool call was killed at its 64 MiB memory limit")
    trace_file = next(p for p in traces.glob("*.json") if p.name != "manifest.json")
    hog, after = next(read_traces(trace_file)).steps[-2:]
    assert told[0].text.startswith(stopped_note("memory", limit_mb=64, used_mb=hog.profile.peak_mb.value))
    assert "209715200" not in told[0].text and hog.recorded_outcome.status == "oom"
    assert "still here" in [m for m in inputs[2] if m.role == "tool"][-1].text and after.recorded_outcome.status == "ok"
    assert validate(trace_file).returncode == 0, validate(trace_file).stderr


def test_exec_past_its_timeout_raises_timeout_error_with_the_note_and_input_reaches_stdin(host, tmp_path):
    """Inspect's contract for exec, without the agent loop: a timeout raises TimeoutError (the note its
    message), `input` is the command's stdin, a relative cwd is the sample's directory."""
    import anyio
    from pytest_agentcgroup.live.inspect_sandbox import AgentCgroupSandboxConfig, AgentCgroupSandboxEnvironment

    async def sample():
        config = AgentCgroupSandboxConfig(arm="static-toolcall", trace_dir=str(tmp_path / "traces"))
        envs = await AgentCgroupSandboxEnvironment.sample_init("t", config, {})
        env = envs["default"]
        try:
            await env.write_file("sub/in.txt", "from a file\n")
            read = await env.exec(["sh", "-c", "cat in.txt; cat"], input="from stdin\n", cwd="sub")
            with pytest.raises(TimeoutError) as late:
                await env.exec(["sleep", "5"], timeout=1)
            failed = await env.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
            return read, late.value, failed, env.directory
        finally:
            await AgentCgroupSandboxEnvironment.sample_cleanup("t", config, envs, False)
    read, late, failed, directory = anyio.run(sample)
    assert read.success and read.stdout == "from a file\nfrom stdin\n" and read.stderr == ""
    assert str(late) == stopped_note("timeout", timeout_s=1)
    assert (failed.success, failed.returncode, failed.stdout) == (False, 3, "out\nerr\n")
    assert not directory.exists()                                     # the sample's directory went with it
    trace = next(read_traces(next(p for p in (tmp_path / "traces").glob("*.json") if p.name != "manifest.json")))
    assert [s.recorded_outcome.status for s in trace.steps] == ["ok", "timeout", "failed"]
