"""openhands-rows converter: concrete counts on the real HF rows, cwd carry-over, bad input, fuzzing.

Counts were taken by reading `sample_raw.json` directly (json.load + counting `tool_calls` by function
name and `str_replace_editor` sub-command) and agree with the dataset README's per-row table.
"""
from __future__ import annotations

import copy
import json
from functools import partial
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from pytest_agentcgroup.traces import convert as registry
from pytest_agentcgroup.traces.convert import _common, openhands_rows as conv
from pytest_agentcgroup.traces.ir import TraceError, parse_trace
from converter_checks import (DATASETS, FUZZ, check_converter, expect_trace_error, json_values,
                              maybe_cut, mutated, real_sample)

SAMPLE = DATASETS / "openhands-swe-rebench-row" / "sample_raw.json"
needs_sample = pytest.mark.skipif(not SAMPLE.is_file(), reason=f"real sample not present: {SAMPLE}")


@pytest.fixture(scope="module")
def traces():
    real_sample(SAMPLE)
    return list(conv.convert(SAMPLE))


@pytest.fixture(scope="module")
def rows():
    real_sample(SAMPLE)
    return json.loads(SAMPLE.read_text())


# ---------------------------------------------------------------------------------------------
# The real sample

@needs_sample
def test_sniff_and_registry():
    assert conv.sniff(SAMPLE)
    assert registry.sniff(SAMPLE) == "openhands-rows"


def test_step_counts_and_kinds(traces):
    assert [t.trace_id for t in traces] == [
        "openhands-rows/tianocore__edk2-pytool-library-372/0",
        "openhands-rows/PyPSA__linopy-79/1",
        "openhands-rows/numpy__numpydoc-101/2"]
    # one step per tool call: execute_bash / str_replace_editor / think / finish = 27/14/3/1, 45/30/2/1, 30/33/1/1
    assert [len(t.steps) for t in traces] == [45, 78, 65]
    assert [Counter(s.native_tool for s in t.steps) for t in traces] == [
        {"execute_bash": 27, "str_replace_editor": 14, "think": 3, "finish": 1},
        {"execute_bash": 45, "str_replace_editor": 30, "think": 2, "finish": 1},
        {"execute_bash": 30, "str_replace_editor": 33, "think": 1, "finish": 1}]
    # str_replace_editor: view -> read; create/str_replace -> edit (no insert/undo_edit in the sample)
    assert [Counter(s.tool for s in t.steps) for t in traces] == [
        {"bash": 27, "read": 9, "edit": 5, "noop": 4},     # edits: 4 create + 1 str_replace
        {"bash": 45, "read": 15, "edit": 15, "noop": 3},   # edits: 9 create + 6 str_replace
        {"bash": 30, "read": 19, "edit": 14, "noop": 2}]   # edits: 6 create + 8 str_replace
    for t in traces:
        assert [s.step_id for s in t.steps] == list(range(len(t.steps)))
        assert t.steps[-1].native_tool == "finish" and t.steps[-1].tool == "noop"
        assert all(s.duration_ms is None for s in t.steps)  # the rows carry no timing
        parse_trace(t.to_json())


def test_first_steps_of_row_0(traces):
    t = traces[0]
    assert t.steps[0].to_json() == {"step_id": 0, "tool": "noop", "native_tool": "think", "args": {}}
    assert {k: v for k, v in t.steps[1].to_json().items() if not k.startswith("recorded_")} == {
        "step_id": 1, "tool": "read", "native_tool": "str_replace_editor", "args": {"op": "view", "path": "/workspace"}}
    assert t.steps[1].recorded_output.startswith("Here's the files and directories up to 2 levels deep in /workspace")
    # the first command's cwd is unknown (no tool result has reported one yet)
    assert t.steps[2].args == {"command": "cd /workspace/tianocore__edk2-pytool-library__0.15 && pwd"}
    # ... and its result's footer is the cwd of everything after it
    assert t.steps[3].args["cwd"] == "/workspace/tianocore__edk2-pytool-library__0.15"
    assert t.steps[4].args["cwd"] == "/workspace/tianocore__edk2-pytool-library__0.15"


def test_editor_is_never_a_shell_command(traces):
    for t in traces:
        for s in t.steps:
            if s.native_tool == "str_replace_editor":
                assert "command" not in s.args and s.args["op"] in ("view", "create", "str_replace")
                assert s.tool == ("read" if s.args["op"] == "view" else "edit")
            if s.tool == "bash":
                assert isinstance(s.command, str) and s.command


def test_edit_payload_kept(traces):
    creates = [s for s in traces[0].steps if s.args.get("op") == "create"]
    assert len(creates) == 4 and all(isinstance(s.args["file_text"], str) for s in creates)
    repl = [s for s in traces[0].steps if s.args.get("op") == "str_replace"]
    assert len(repl) == 1 and {"old_str", "new_str", "path"} <= set(repl[0].args)


def test_every_bash_step_after_the_first_result_has_a_cwd(traces):
    for t in traces:
        bash = [s for s in t.steps if s.tool == "bash"]
        assert "cwd" not in bash[0].args
        assert all(s.args.get("cwd", "").startswith("/workspace/") for s in bash[1:])


def test_source_licence(traces):
    assert traces[0].source == {
        "format": "openhands-rows", "dataset": "nebius/SWE-rebench-openhands-trajectories",
        "path": "openhands-swe-rebench-row/sample_raw.json", "licence": "CC-BY-4.0",
        "origin": "neulab/agent-data-protocol@57c3046fb43ac059e7a52b7dea8016caabe6cb07"}


def test_jsonl_and_parquet_give_the_same_traces(rows, traces, tmp_path):
    jl = tmp_path / "rows.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = list(conv.convert(jl))
    assert [[s.to_json() for s in t.steps] for t in got] == [[s.to_json() for s in t.steps] for t in traces]
    assert [t.trace_id for t in got] == [f"openhands-rows/{r['instance_id']}/{i}" for i, r in enumerate(rows, 1)]
    assert registry.sniff(jl) == "openhands-rows"

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pf = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), pf, row_group_size=1)
    assert conv.sniff(pf) and registry.sniff(pf) == "openhands-rows"
    got = list(conv.convert(pf))
    assert [[s.to_json() for s in t.steps] for t in got] == [[s.to_json() for s in t.steps] for t in traces]


# ---------------------------------------------------------------------------------------------
# Hand-built rows

def _call(name, args, cid="c1"):
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}]}


def _result(text, cid="c1", name="execute_bash"):
    return {"role": "tool", "name": name, "tool_call_id": cid, "content": text}


def _row(*msgs, instance="o__r-1"):
    return {"instance_id": instance, "trajectory": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, *msgs]}


def _write(tmp_path, rows, name="rows.json"):
    p = tmp_path / name
    p.write_text(json.dumps(rows))
    return p


def test_bash_args_timeout_is_input_and_cwd_carry(tmp_path):
    p = _write(tmp_path, [_row(
        _call("execute_bash", {"command": "cd /repo && make", "timeout": 30}),
        _result("ok\n[Current working directory: /repo]\n[Command finished with exit code 0]"),
        _call("execute_bash", {"command": "C-c", "is_input": "true"}, "c2"), _result("^C", "c2"),
        _call("str_replace_editor", {"command": "insert", "path": "a.py", "insert_line": 3, "new_str": "x"}, "c3"),
        _call("str_replace_editor", {"command": "undo_edit", "path": "a.py"}, "c4"),
        _call("execute_bash", {"command": "cd sub"}, "c5"), _result("[Current working directory: /repo/sub]", "c5"),
        _call("execute_bash", {"command": "ls", "timeout": "2.5"}, "c6"),
        _call("task_tracker", {"command": "view"}, "c7"),
        _call("finish", {"message": "done"}, "c8"))])
    (t,) = conv.convert(p)
    assert [s.tool for s in t.steps] == ["bash", "bash", "edit", "edit", "bash", "bash", "noop", "noop"]
    assert t.steps[0].args == {"command": "cd /repo && make", "timeout_ms": 30000.0}
    assert t.steps[1].args == {"command": "C-c", "cwd": "/repo", "is_input": True}
    assert t.steps[2].args == {"op": "insert", "path": "a.py", "new_str": "x", "insert_line": 3, "cwd": "/repo"}
    assert t.steps[3].args == {"op": "undo_edit", "path": "a.py", "cwd": "/repo"}
    assert t.steps[4].args["cwd"] == "/repo"
    assert t.steps[5].args == {"command": "ls", "cwd": "/repo/sub", "timeout_ms": 2500.0}
    assert [s.native_tool for s in t.steps[6:]] == ["task_tracker", "finish"]


def test_what_each_step_recorded_is_its_outcome_and_the_row_names_its_task(traces, tmp_path):
    """The real rows: every command's exit from OpenHands' footer, with the head of its output
    without the footers; every edit's and view's status; the task of each row."""
    linopy = traces[1]
    assert linopy.task.to_json() == {"instance_id": "PyPSA__linopy-79", "repository": "PyPSA/linopy", "version": "0.0",
                                     "path": "/workspace/PyPSA__linopy__0.0",
                                     "python": "/opt/conda/envs/testbed/bin/python"}
    step7 = linopy.steps[7]
    assert step7.command == "cd /workspace/PyPSA__linopy__0.0 && python -m pytest --version"
    assert step7.recorded_outcome.to_json() == {"status": "ok", "exit_code": 0}
    assert step7.recorded_output == "pytest 8.3.3" and step7.outcome is None      # `outcome`: a profile's
    counts = [Counter((s.tool, s.recorded_outcome.exit_code if s.recorded_outcome else "none") for s in t.steps
                      if s.tool == "bash") for t in traces]
    assert counts == [{("bash", 0): 23, ("bash", 1): 4}, {("bash", 0): 41, ("bash", 1): 3, ("bash", 4): 1},
                      {("bash", 0): 29, ("bash", 1): 1}]
    assert all(s.recorded_outcome is not None and s.recorded_outcome.status == "ok" for t in traces for s in t.steps
               if s.tool == "edit")
    assert [t.task.version for t in traces] == ["0.15", "0.0", "0.7"]
    # hand-built: a failing command, one still running when OpenHands stopped waiting (-1), input to
    # a running process (no exit of its own), an editor error
    p = _write(tmp_path, [_row(
        _call("execute_bash", {"command": "false"}), _result("oops\n[The command completed with exit code 1.]\n"
                                                             "[Current working directory: /r]\n[Command finished with exit code 1]"),
        _call("execute_bash", {"command": "sleep 99"}, "c2"),
        _result("[The command has no new output after 30 seconds.]\n[Command finished with exit code -1]", "c2"),
        _call("execute_bash", {"command": "C-c", "is_input": "true"}, "c3"), _result("^C\n[Command finished with exit code 130]", "c3"),
        _call("str_replace_editor", {"command": "str_replace", "path": "/r/a.py", "old_str": "x"}, "c4"),
        _result("ERROR:\nNo replacement was performed", "c4", name="str_replace_editor"))])
    (t,) = conv.convert(p)
    assert [(s.recorded_outcome.to_json(), s.recorded_output) if s.recorded_outcome else None for s in t.steps] == [
        ({"status": "failed", "exit_code": 1}, "oops"),
        ({"status": "timeout", "exit_code": None}, "[The command has no new output after 30 seconds.]"),
        None, ({"status": "failed", "exit_code": None}, "ERROR:\nNo replacement was performed")]
    assert t.task.to_json() == {"instance_id": "o__r-1"}


def test_rejected_editor_subcommand_is_a_noop(tmp_path):
    p = _write(tmp_path, [_row(_call("str_replace_editor", {"command": "delete", "path": "/a"}))])
    (t,) = conv.convert(p)
    assert t.steps[0].to_json() == {"step_id": 0, "tool": "noop", "native_tool": "str_replace_editor",
                                    "args": {"op": "delete", "path": "/a", "rejected": True}}


_err = partial(expect_trace_error, conv)


@pytest.mark.parametrize("row, expect", [
    # wrong types / missing fields
    ({"instance_id": "x"}, ["record 0", "field 'trajectory'", "missing"]),
    ({"trajectory": 5}, ["record 0", "field 'trajectory'", "expected list or str"]),
    (_row({"content": "no role"}), ["record 0", "field 'trajectory[2].role'", "missing"]),
    (_row(_call("execute_bash", {"cmd": "ls"})),
     ["record 0", "step 0", "field 'trajectory[2].tool_calls[0].function.arguments.command'", "missing"]),
    (_row(_call("execute_bash", {"command": ["ls"]})), ["step 0", "arguments.command'", "expected str, got list"]),
    (_row(_call("execute_bash", {"command": "ls", "timeout": -1})), ["step 0", "arguments.timeout'", ">= 0"]),
    (_row(_call("execute_bash", {"command": "ls", "is_input": "maybe"})), ["step 0", "arguments.is_input'"]),
    (_row({"role": "assistant", "tool_calls": {"not": "a list"}}), ["step 0", "field 'trajectory[2].tool_calls'"]),
    # arguments that are not JSON (truncated) or not an object
    (_row(_call("execute_bash", '{"command": "ls')), ["step 0", "field 'trajectory[2].tool_calls[0].function.arguments'", "invalid JSON"]),
    (_row(_call("execute_bash", "[1, 2]")), ["step 0", "arguments'", "expected a JSON object"]),
    # unknown tools
    (_row(_call("rm_rf_everything", {})), ["step 0", "field 'trajectory[2].tool_calls[0].function.name'", "unknown tool 'rm_rf_everything'"]),
    # NUL bytes inside a kept string
    (_row(_call("execute_bash", {"command": "ls\u0000-la"})), ["step 0", "arguments.command'", "NUL"]),
    (_row(_call("str_replace_editor", {"command": "view", "path": "/a\u0000b"})), ["step 0", "arguments.path'", "NUL"]),
    # empty trajectories
    ({"instance_id": "x", "trajectory": []}, ["record 0", "field 'trajectory'", "empty"]),
    (_row({"role": "assistant", "content": "just talk"}), ["record 0", "field 'trajectory'", "no tool calls"]),
])
def test_bad_rows(tmp_path, row, expect):
    _err(_write(tmp_path, [row]), expect)


def test_huge_command_is_refused(tmp_path):
    p = _write(tmp_path, [_row(_call("execute_bash", {"command": "echo " + "x" * (10 * 1024 * 1024)}))])
    e = _err(p, ["record 0", "step 0", "arguments.command'", "limit"])
    assert e.field.endswith("arguments.command")
    # just under the limit is fine
    p = _write(tmp_path, [_row(_call("execute_bash", {"command": "x" * _common.MAX_ARG_BYTES}))])
    (t,) = conv.convert(p)
    assert len(t.steps[0].command) == _common.MAX_ARG_BYTES


def test_file_level_errors(tmp_path):
    p = tmp_path / "trunc.json"
    p.write_text(json.dumps([_row(_call("execute_bash", {"command": "ls"}))])[:-7])
    _err(p, ["invalid JSON"])
    p.write_bytes(b'[{"instance_id": "a\x00", "trajectory": []}]')
    _err(p, ["NUL byte at byte offset 19"])
    p.write_text('"a string"')
    _err(p, ["expected a JSON array of rows"])
    _err(tmp_path / "missing.json", ["cannot read"])


def test_a_bad_jsonl_line_does_not_stop_the_others(tmp_path):
    good = _row(_call("execute_bash", {"command": "ls"}))
    p = tmp_path / "rows.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps(good)[:40] + "\n\n" + json.dumps(good) + "\n")
    results = list(conv.iter_results(p))
    assert [type(r).__name__ for r in results] == ["Trace", "TraceError", "Trace"]
    assert "record 2" in str(results[1]) and "invalid JSON" in str(results[1])
    assert [r.trace_id for r in results if not isinstance(r, TraceError)] == ["openhands-rows/o__r-1/1", "openhands-rows/o__r-1/4"]
    with pytest.raises(TraceError, match="record 2"):
        list(conv.convert(p))


def test_trace_ids_are_sanitised(tmp_path):
    p = _write(tmp_path, [_row(_call("think", {"thought": "t"}), instance="../../etc/passwd x"),
                          _row(_call("think", {"thought": "t"}), instance="")])
    assert [t.trace_id for t in conv.convert(p)] == ["openhands-rows/etc_passwd_x/0", "openhands-rows/row1/1"]


def test_foreign_file_gets_unknown_origin_but_dataset_licence(tmp_path):
    (t,) = conv.convert(_write(tmp_path, [_row(_call("think", {"thought": "t"}))]))
    assert t.source["licence"] == "CC-BY-4.0" and t.source["origin"] == "hf:nebius/SWE-rebench-openhands-trajectories"
    assert t.source["path"] == f"{tmp_path.name}/rows.json"


# ---------------------------------------------------------------------------------------------
# Fuzzing: only TraceError may escape; whatever converts is a valid trace

json_value = json_values(
    ["execute_bash", "str_replace_editor", "view", "assistant", "tool", "[Current working directory: /x]"],
    ["role", "content", "tool_calls", "function", "name", "arguments", "command", "path", "timeout", "is_input",
     "trajectory", "instance_id", "view_range", "x"])


@FUZZ
@given(rows=st.lists(json_value, max_size=3) | json_value)
def test_fuzz_generated(fuzz_dir, rows):
    p = fuzz_dir / "gen.json"
    p.write_text(json.dumps(rows))
    check_converter(conv, p)


@pytest.fixture(scope="module")
def small_real_row(rows):
    row = copy.deepcopy(rows[0])
    row["trajectory"] = row["trajectory"][:14]
    for m in row["trajectory"]:
        if isinstance(m.get("content"), str):
            m["content"] = m["content"][-300:]
    row.pop("tools", None)
    return row


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_real_row(fuzz_dir, small_real_row, data):
    p = fuzz_dir / "mut.jsonl"
    p.write_text(maybe_cut(data, json.dumps(mutated(data, small_real_row, json_value)) + "\n"))
    check_converter(conv, p)
