"""swe-agent-traj converter: the 4 real .traj files (v0 string state, v1 dict state + execution_time),
cwd from state, bad input, fuzzing.

Expected steps were read off each file's `trajectory[].action` by hand.
"""
from __future__ import annotations

import json
from collections import Counter
from functools import partial

import pytest
from hypothesis import given, settings, strategies as st

from pytest_agentcgroup.traces import convert as registry
from pytest_agentcgroup.traces.convert import swe_agent_traj as conv
from pytest_agentcgroup.traces.ir import parse_trace
from converter_checks import (DATASETS, FUZZ, check_converter, expect_trace_error, json_values,
                              maybe_cut, mutated, only_trace, real_sample)

FOLDER = DATASETS / "swe-agent-traj"
V0_REPO, V0_CTF = FOLDER / "v0_test-repo-i1.traj", FOLDER / "v0_ctf_networking_1.traj"
V1_REPO, V1_MARSH = FOLDER / "v1_test-repo-6e44b9.traj", FOLDER / "v1_marshmallow_fc_replace_src.traj"
needs_data = pytest.mark.skipif(not FOLDER.is_dir(), reason=f"real samples not present: {FOLDER}")


_one = partial(only_trace, conv)


@needs_data
@pytest.mark.parametrize("path", [V0_REPO, V0_CTF, V1_REPO, V1_MARSH], ids=lambda p: p.name)
def test_sniff(path):
    assert conv.sniff(path) and registry.sniff(path) == "swe-agent-traj"


@needs_data
def test_v0_test_repo():
    t = _one(V0_REPO)
    assert t.trace_id == "swe-agent-traj/v0_test-repo-i1"
    assert [(s.tool, s.native_tool) for s in t.steps] == [
        ("search", "find_file"), ("read", "open"), ("edit", "edit"), ("bash", "bash"), ("noop", "submit")]
    assert t.steps[3].args == {"command": "python tests/missing_colon.py", "cwd": "/klieret__swe-agent-test-repo"}
    # v0: no timing at all
    assert all(s.duration_ms is None for s in t.steps)
    # step 0's cwd is the task prompt's footer, not the demonstration's (/marshmallow-code__marshmallow)
    assert t.steps[0].args["cwd"] == "/klieret__swe-agent-test-repo"
    assert t.source["licence"] == "MIT"
    assert t.source["origin"] == "SWE-agent/SWE-agent@3ea751c087f32b16e039a2233dd6eefecef325d5"
    # `edit 4:4` on the open file, in the replay editor's terms; the tool said "File updated"
    edit = t.steps[2]
    assert {k: edit.args[k] for k in ("op", "path", "start_line", "end_line", "new_str", "line_ends")} == {
        "op": "replace_lines", "path": "/klieret__swe-agent-test-repo/tests/missing_colon.py", "start_line": 4,
        "end_line": 4, "new_str": "def division(a: float, b: float) -> float:\n", "line_ends": True}
    assert edit.recorded_outcome.status == "ok" and "not_kept" not in edit.args


@needs_data
def test_v0_ctf():
    t = _one(V0_CTF)
    assert [(s.tool, s.native_tool) for s in t.steps] == [
        ("bash", "bash"), ("bash", "bash"), ("bash", "bash"), ("noop", "submit")]
    assert t.steps[0].command == "tshark -n -r networking.pcap -q -z io,phs "   # trailing newline dropped
    cwd = "/__Users__talora__LLM_CTF_Dataset_Dev__2013__CSAW-Quals__misc__Networking-1"
    assert all(s.args["cwd"] == cwd for s in t.steps)


@needs_data
def test_v1_test_repo_durations():
    t = _one(V1_REPO)
    assert [(s.tool, s.native_tool) for s in t.steps] == [
        ("search", "find_file"), ("read", "open"), ("edit", "edit"), ("bash", "bash"), ("noop", "submit")]
    # execution_time (s) -> duration_ms, recorded
    assert [s.duration_ms.value for s in t.steps] == [281.413, 296.753, 493.579, 292.579, 269.165]
    assert {s.duration_ms.provenance for s in t.steps} == {"recorded"}
    # v1 `edit '<search>' '<replace>' False` edits the open file; its third argument goes through
    # argparse's type=bool, so "False" means every occurrence (the tool answered "Replaced 1 occurrences")
    edit = t.steps[2]
    assert {k: edit.args[k] for k in ("op", "path", "old_str", "new_str", "replace_all")} == {
        "op": "str_replace", "path": "/SWE-agent__test-repo/tests/missing_colon.py",
        "old_str": "def division(a: float, b: float) -> float", "new_str": "def division(a: float, b: float) -> float:",
        "replace_all": True}
    assert edit.recorded_outcome.status == "ok" and edit.recorded_output.startswith("Replaced 1 occurrences")


@needs_data
def test_v1_marshmallow():
    t = _one(V1_MARSH)
    assert len(t.steps) == 13
    assert [s.native_tool for s in t.steps] == [
        "bash", "open", "bash", "create", "insert", "bash", "bash", "find_file", "open", "edit", "bash", "bash",
        "submit"]
    assert Counter(s.tool for s in t.steps) == {"bash": 6, "edit": 3, "read": 2, "search": 1, "noop": 1}
    assert [s.command for s in t.steps if s.tool == "bash"] == [
        "ls -F", "pip install -e .[dev]", "python reproduce.py", "ls -F", "python reproduce.py", "rm reproduce.py"]
    assert t.steps[2].duration_ms.value == 1951.447   # pip install is the slow one
    assert all(s.args["cwd"] == "/testbed" for s in t.steps)
    create, insert, edit = (t.steps[i].args for i in (3, 4, 9))
    # `create reproduce.py`: one empty line (the tool's answer: "1 lines total"), at the step's directory
    assert (create["op"], create["path"], create["file_text"]) == ("create", "/testbed/reproduce.py", "\n")
    # `insert '<text>'` with no line: after the end of the open file
    assert (insert["op"], insert["path"]) == ("append", "/testbed/reproduce.py")
    assert insert["new_str"].startswith("from marshmallow.fields import TimeDelta\n") and insert["new_str"].endswith(
        'print(td_field.serialize("td_field", obj))')
    assert (edit["op"], edit["path"], edit["replace_all"]) == ("str_replace", "/testbed/src/marshmallow/fields.py", False)
    assert edit["old_str"] == "return int(value.total_seconds() / base_unit.total_seconds())"
    assert [t.steps[i].recorded_outcome.status for i in (3, 4, 9)] == ["ok", "ok", "ok"]
    parse_trace(t.to_json())


# ---------------------------------------------------------------------------------------------
# Hand-built files

def _traj(steps, history=None):
    return {"environment": "main", "trajectory": steps, "history": history or [
        {"role": "system", "content": "(Current directory: <cwd>)"},
        {"role": "user", "content": "task\n(Open file: n/a)\n(Current directory: /start)\nbash-$"}], "info": {}}


def _step(action, wd, opened="n/a", v0=False, t=None):
    state = {"open_file": opened, "working_dir": wd}
    s = {"action": action, "observation": "", "response": "", "thought": "",
         "state": json.dumps(state) if v0 else state}
    if t is not None:
        s["execution_time"] = t
    return s


def _write(tmp_path, doc, name="x.traj"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_v1_state_is_after_the_action_and_v0_state_before_it(tmp_path):
    p = _write(tmp_path, _traj([_step("cd /a\n", "/a"), _step("open f.py", "/a", "/a/f.py"),
                                _step("edit 1:1\nx\nend_of_edit", "/a", "/a/f.py"), _step("", "/a"),
                                _step("cd /b", "/b"), _step("ls", "/b")]))
    t = _one(p)
    assert [s.args.get("cwd") for s in t.steps] == ["/start", "/a", "/a", None, "/a", "/b"]
    assert t.steps[2].args["path"] == "/a/f.py"
    assert t.steps[3].to_json() == {"step_id": 3, "tool": "noop", "native_tool": "(empty)", "args": {}}
    # v0 (a JSON string state, asked for before the action: its `open` shows no open file yet, as in
    # v0_test-repo-i1.traj) runs each step in its own state
    p = _write(tmp_path, _traj([_step("cd /a\n", "/start", v0=True), _step("open f.py", "/a", v0=True),
                                _step("edit 1:1\nx\nend_of_edit", "/a", "/a/f.py", v0=True), _step("ls", "/a", v0=True)]))
    t = _one(p)
    assert [s.args.get("cwd") for s in t.steps] == ["/start", "/a", "/a", "/a"]
    assert t.steps[2].args["path"] == "/a/f.py"


def _observed(action, observation, wd="/a", opened="/a/f.py"):
    return {**_step(action, wd, opened), "observation": observation}


def test_edits_in_the_editors_terms_and_whether_the_tool_applied_them(tmp_path):
    """Each SWE-agent edit tool read as that tool reads its arguments; what the tool answered says
    whether it applied the edit. A windowed edit it refused (its linter, its window) is not kept, so
    a replay does not apply what the agent's tool did not; str_replace_editor's refusals are the
    replay editor's own, so its failed edit is kept and compared."""
    lint = ("Your proposed edit has introduced new syntax error(s). Please read this error message carefully\n"
            "ERRORS:\n- E999 IndentationError\nYour changes have NOT been applied.")
    p = _write(tmp_path, _traj([
        _observed("open f.py", "[File: /a/f.py (9 lines total)]"),
        _observed("edit 2:3\n    x = 1\n\n    y = 2\nend_of_edit", "[File: /a/f.py (9 lines total)]\n1:def f():\nFile updated."),
        _observed("edit 2:2\n  x = (\nend_of_edit", lint),
        _observed("edit 'x = 1' 'x = 3'", "Your edit was not applied (file not modified): Text 'x = 1' not found"),
        _observed("insert 'import os\n' 1", "[File: /a/f.py (10 lines total)]\n1:import os"),
        _observed("create ../b/new.py", "[File: /b/new.py (0 lines total)]", opened="/b/new.py"),
        _observed("str_replace_editor str_replace /a/f.py   --old_str 'y = 2' --new_str 'y = \"two\"'",
                  "The file /a/f.py has been edited. Here's the result of running `cat -n`"),
        # the tool's own refusals (SWE-agent 1.1's edit_anthropic), one quoting words of a success
        _observed("str_replace_editor str_replace /a/f.py --old_str 'File updated' --new_str 'x'",
                  "No replacement was performed, old_str `File updated` did not appear verbatim in /a/f.py."),
        _observed("str_replace_editor create rel.py --file_text 'print(1)'",
                  "The path rel.py is not an absolute path, it should start with `/`. Maybe you meant /a/rel.py?"),
        _observed("edit 'unbalanced", "Usage: edit <search> <replace>"),
        _observed("edit 4:4\nno end of edit", "weird"),
        _observed("append\ntext\nend_of_append", "[File: /a/f.py (11 lines total)]"),
        _observed("insert 'at the top' 0", "[File: /a/f.py (12 lines total)]"),
        _observed("edit 1:" + "9" * 5000 + "\nx\nend_of_edit", "File updated."),      # no int of 5000 digits
        _observed("str_replace_editor undo_edit /a/f.py --view_range 1 2", "Last edit to /a/f.py undone successfully."),
        _observed("insert 'tail' 50", "[File: /a/f.py (13 lines total)]"),        # past the end: at the end, as there
        _observed("str_replace_editor insert /a/f.py --insert_line " + "9" * 4000 + " --new_str x", "Invalid `insert_line`"),
    ]))
    steps = _one(p).steps[1:]
    args = [s.args for s in steps]
    assert [(a["op"], a.get("start_line"), a.get("end_line"), a.get("new_str")) for a in args[:1]] == [
        ("replace_lines", 2, 3, "    x = 1\n\n    y = 2")]        # v1 (a state object): the lines joined
    assert [s.recorded_outcome.status if s.recorded_outcome else None for s in steps] == [
        "ok", "failed", "failed", "ok", "ok", "ok", "failed", "failed", "failed", None, "ok", "ok", "ok", "ok", "ok",
        "failed"]
    kept = ["not_kept" not in a for a in args]
    assert kept == [True, False, False, True, True, True, False, False, False, False, False, False, False, True, True,
                    False]
    assert (args[14]["insert_line"], args[14]["clamp_line"]) == (49, True)
    assert (args[13]["op"], args[13]["path"]) == ("undo_edit", "/a/f.py")     # its --view_range A B: no edit's
    assert args[1]["not_kept"] == "the tool did not apply it there" and "new_str" not in args[1] and args[1]["op"] == "edit"
    # SWE-agent 1.1's insert goes before line N
    assert (args[3]["op"], args[3]["insert_line"], args[3]["new_str"]) == ("insert", 0, "import os")
    assert (args[4]["op"], args[4]["path"], args[4]["file_text"]) == ("create", "/b/new.py", "")   # "0 lines total"
    assert (args[5]["op"], args[5]["old_str"], args[5]["new_str"], args[5]["expand_tabs"]) == (
        "str_replace", "y = 2", 'y = "two"', True)
    assert steps[6].recorded_output.startswith("No replacement was performed")
    assert args[7]["not_kept"] == args[8]["not_kept"] == args[9]["not_kept"] == args[12]["not_kept"] == \
        "its arguments could not be read as that tool reads them"
    assert args[10]["not_kept"] == "the replay editor has no `append`"
    from pytest_agentcgroup.replay.executors.base import edit_argv
    assert [edit_argv(s, "/usr/bin/python3", "/h") is not None for s in steps] == kept    # not kept: not applied


_err = partial(expect_trace_error, conv)


@pytest.mark.parametrize("doc, expect", [
    ([], ["expected a .traj object"]),
    ({"history": []}, ["field 'trajectory'", "missing"]),
    (_traj([]), ["field 'trajectory'", "empty"]),
    (_traj(["ls"]), ["step 0", "field 'trajectory[0]'", "expected a step object"]),
    (_traj([{"observation": ""}]), ["step 0", "field 'trajectory[0].action'", "missing"]),
    (_traj([{"action": ["ls"]}]), ["step 0", "field 'trajectory[0].action'", "expected str, got list"]),
    (_traj([{**_step("ls", "/a"), "state": "{not json"}]), ["step 0", "field 'trajectory[0].state'", "invalid JSON"]),
    (_traj([{**_step("ls", "/a"), "state": 3}]), ["step 0", "field 'trajectory[0].state'", "expected dict"]),
    (_traj([_step("ls", 5)]), ["step 0", "field 'trajectory[0].state.working_dir'", "expected str"]),
    (_traj([_step("ls", "/a", t=-1)]), ["step 0", "field 'trajectory[0].execution_time'", ">= 0"]),
    (_traj([_step("ls", "/a", t="fast")]), ["step 0", "field 'trajectory[0].execution_time'", "expected int or float"]),
    (_traj([_step("ls\u0000", "/a")]), ["step 0", "field 'trajectory[0].action'", "NUL"]),
    (_traj([_step("x" * (10 << 20), "/a")]), ["step 0", "field 'trajectory[0].action'", "limit"]),
])
def test_bad_files(tmp_path, doc, expect):
    _err(_write(tmp_path, doc), expect)


def test_truncated(tmp_path):
    p = tmp_path / "t.traj"
    p.write_text(json.dumps(_traj([_step("ls", "/a")]))[:50])
    _err(p, ["invalid JSON"])
    p.write_bytes(b"{\"trajectory\": [\x00]}")
    _err(p, ["NUL byte"])


# ---------------------------------------------------------------------------------------------
# Fuzzing

json_value = json_values(
    ["open a.py", "edit 1:2\nx\nend_of_edit", "submit", "ls", '{"open_file": "n/a", "working_dir": "/x"}'],
    ["trajectory", "action", "state", "working_dir", "open_file", "execution_time", "history", "role", "content"])


@FUZZ
@given(doc=json_value)
def test_fuzz_generated(fuzz_dir, doc):
    p = fuzz_dir / "gen.traj"
    p.write_text(json.dumps(doc))
    check_converter(conv, p)


@pytest.fixture(scope="module", params=["v0", "v1"])
def small_real_traj(request):
    path = V0_REPO if request.param == "v0" else V1_REPO
    real_sample(path)
    doc = json.loads(path.read_text())
    doc.pop("replay_config", None)
    for s in doc["trajectory"]:
        for k in ("observation", "response", "thought"):
            s[k] = s[k][:50]
    for m in doc["history"]:
        if isinstance(m.get("content"), str):
            m["content"] = m["content"][-200:]
    return doc


@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_fuzz_mutated_real_traj(fuzz_dir, small_real_traj, data):
    p = fuzz_dir / "mut.traj"
    p.write_text(maybe_cut(data, json.dumps(mutated(data, small_real_traj, json_value))))
    check_converter(conv, p)
