"""swe-agent-rows converter: concrete steps of the 3 real HF rows, ACI mapping, cwd, bad input, fuzzing.

The expected steps were read off `rows_1-3.json` by hand: the last fenced block of every `ai` turn.
"""
from __future__ import annotations

import copy
import json
from functools import partial
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from pytest_agentcgroup.traces import convert as registry
from pytest_agentcgroup.traces.convert import _swe_agent, swe_agent_rows as conv
from pytest_agentcgroup.traces.ir import TraceError, parse_trace
from converter_checks import (DATASETS, FUZZ, check_converter, expect_trace_error, json_values,
                              maybe_cut, mutated, real_sample)

SAMPLE = DATASETS / "swe-agent-hf-rows" / "rows_1-3.json"


@pytest.fixture(scope="module")
def traces():
    real_sample(SAMPLE)
    return list(conv.convert(SAMPLE))


@pytest.fixture(scope="module")
def rows():
    real_sample(SAMPLE)
    return json.loads(SAMPLE.read_text())


def test_sniff(traces):
    assert conv.sniff(SAMPLE) and registry.sniff(SAMPLE) == "swe-agent-rows"


def test_plumbum_row_step_by_step(traces):
    t = traces[0]
    assert t.trace_id == "swe-agent-rows/tomerfiliba__plumbum-366_17/0"
    assert [(s.tool, s.native_tool) for s in t.steps] == [
        ("bash", "bash"),          # ls -F
        ("search", "find_file"),   # find_file "image.py" plumbum
        ("read", "open"),          # open plumbum/cli/image.py
        ("edit", "edit"),          # edit 5:5 ... end_of_edit
        ("bash", "bash"),          # python -c "import plumbum.cli.image"
        ("noop", "submit")]
    assert t.steps[0].args == {"command": "ls -F", "cwd": "/plumbum"}   # cwd from the task turn's footer
    assert t.steps[2].args == {"op": "open", "action": "open plumbum/cli/image.py",
                               "path": "plumbum/cli/image.py", "cwd": "/plumbum"}
    # edit 5:5 in the replay editor's terms (SWE-agent 0.x's bash function: each line written back with
    # its newline); the user turn after it (`[File: ...` ... File updated) says the tool applied it
    assert t.steps[3].args == {"op": "replace_lines", "action": "edit 5:5\nimport plumbum.cli as cli\nend_of_edit",
                               "start_line": 5, "end_line": 5, "path": "/plumbum/plumbum/cli/image.py",
                               "cwd": "/plumbum", "new_str": "import plumbum.cli as cli\n", "line_ends": True}
    assert t.steps[3].recorded_outcome.status == "ok"
    assert t.steps[3].recorded_output.startswith("[File: /plumbum/plumbum/cli/image.py (99 lines total)]")
    assert t.steps[4].command == 'python -c "import plumbum.cli.image"'
    assert t.source == {"format": "swe-agent-rows", "dataset": "nebius/SWE-agent-trajectories",
                        "path": "swe-agent-hf-rows/rows_1-3.json", "licence": "CC-BY-4.0",
                        "origin": "zhu-yiqi/agent-data-protocol@05546b4fc77edbd6adeb297721592bb64dd03d02"}


def test_counts(traces):
    assert [len(t.steps) for t in traces] == [6, 14, 5]        # = the ai turns: 6/14/5 of 13/29/11 turns
    assert [Counter(s.tool for s in t.steps) for t in traces] == [
        {"bash": 2, "search": 1, "read": 1, "edit": 1, "noop": 1},
        # create reproduce.py, edit 1:1, python x4, find_file, open, edit x3, rm x2, submit
        {"bash": 6, "edit": 5, "search": 1, "read": 1, "noop": 1},
        # grep x2, open, edit 53:61, submit
        {"bash": 2, "read": 1, "edit": 1, "noop": 1}]
    assert [s.command for s in traces[2].steps if s.tool == "bash"] == [
        'grep -r "class OpenAPIConverter" src',
        'grep -r "openapi_version" src/apispec/ext/marshmallow/openapi.py']
    for t in traces:
        parse_trace(t.to_json())
        assert all(s.duration_ms is None for s in t.steps)
        assert all("command" not in s.args for s in t.steps if s.tool != "bash")


def test_edit_path_is_the_open_file(traces):
    edits = [s for s in traces[1].steps if s.native_tool == "edit"]
    assert [s.args.get("path") for s in edits] == [
        "/OQuPy/reproduce.py", "/OQuPy/oqupy/process_tensor.py", "/OQuPy/oqupy/process_tensor.py",
        "/OQuPy/oqupy/process_tensor.py"]
    assert [(s.args["start_line"], s.args["end_line"]) for s in edits] == [(1, 1), (536, 536), (536, 536), (539, 539)]
    assert {s.args["op"] for s in edits} == {"replace_lines"} and all(s.recorded_outcome.status == "ok" for s in edits)
    create = traces[1].steps[0]     # `create reproduce.py`, relative: made absolute from the step's directory
    assert (create.args["op"], create.args["path"], create.args["file_text"]) == ("create", "/OQuPy/reproduce.py", "\n")


# ---------------------------------------------------------------------------------------------
# The ACI mapping and the fence rule

@pytest.mark.parametrize("action, tool, native", [
    ("open foo.py 20", "read", "open"), ("goto 40", "read", "goto"), ("scroll_up", "read", "scroll_up"),
    ("scroll_down", "read", "scroll_down"), ("create new.py", "edit", "create"),
    ("edit 1:3\nx = 1\nend_of_edit", "edit", "edit"), ("search_dir foo src", "search", "search_dir"),
    ("search_file bar", "search", "search_file"), ("find_file x.py", "search", "find_file"),
    ("submit", "noop", "submit"), ("exit_forfeit", "noop", "exit_forfeit"),
    ("str_replace_editor view /a.py", "read", "str_replace_editor"),
    ("str_replace_editor str_replace /a.py --old_str x --new_str y", "edit", "str_replace_editor"),
    ("grep -rn open src", "bash", "bash"), ("python -m pytest -x", "bash", "bash"),
    ("opener.sh", "bash", "bash"), ("cd src && ls", "bash", "bash"),
])
def test_aci_mapping(action, tool, native):
    t, n, args = _swe_agent.aci_step_fields(action)
    assert (t, n) == (tool, native)
    assert ("command" in args) == (tool == "bash")


def test_last_fenced_block():
    assert _swe_agent.last_fenced_block("a\n```\nls\n```\nthen\n```bash\npwd\n```\n") == "pwd\n"
    nested = "x\n```\nedit 1:1\n```python\nprint(1)\n```\nend_of_edit\n```\n"
    assert _swe_agent.last_fenced_block(nested) == "edit 1:1\n```python\nprint(1)\n```\nend_of_edit\n"
    assert _swe_agent.last_fenced_block("no block here") is None
    assert _swe_agent.last_fenced_block("```\nunclosed") is None


def _row(*turns, instance="o__r-1_1"):
    return {"instance_id": instance, "trajectory": [
        {"role": "system", "system_prompt": "s", "text": None},
        {"role": "user", "text": "task\n(Open file: n/a)\n(Current directory: /repo)\nbash-$"}, *turns]}


def _ai(cmd):
    return {"role": "ai", "text": f"thinking\n```\n{cmd}\n```"}


def _user(cwd, opened="n/a"):
    return {"role": "user", "text": f"out\n(Open file: {opened})\n(Current directory: {cwd})\nbash-$"}


def _write(tmp_path, rows, name="rows.json"):
    p = tmp_path / name
    p.write_text(json.dumps(rows))
    return p


def test_cwd_carries_from_the_previous_output(tmp_path):
    p = _write(tmp_path, [_row(_ai("cd sub"), _user("/repo/sub"), _ai("ls"), _user("/repo/sub", "/repo/sub/a.py"),
                               _ai("edit 2:2\ny\nend_of_edit"), _user("/repo/sub", "/repo/sub/a.py"),
                               {"role": "ai", "text": "I forgot the block"}, _user("/repo/sub"), _ai("submit"))])
    (t,) = conv.convert(p)
    assert [s.args.get("cwd") for s in t.steps] == ["/repo", "/repo/sub", "/repo/sub", None, "/repo/sub"]
    assert t.steps[2].args["path"] == "/repo/sub/a.py"
    assert t.steps[3].to_json() == {"step_id": 3, "tool": "noop", "native_tool": "(no command)", "args": {}}


_err = partial(expect_trace_error, conv)


@pytest.mark.parametrize("row, expect", [
    ({"instance_id": "x"}, ["record 0", "field 'trajectory'", "missing"]),
    ({"trajectory": {"role": "ai"}}, ["record 0", "field 'trajectory'", "expected list or str"]),
    ({"trajectory": []}, ["record 0", "field 'trajectory'", "empty"]),
    (_row(), ["record 0", "field 'trajectory'", "no ai turns"]),
    (_row({"text": "x"}), ["field 'trajectory[2].role'", "missing"]),
    (_row({"role": "ai", "text": 5}), ["step 0", "field 'trajectory[2].text'", "expected str, got int"]),
    (_row({"role": "ai"}), ["step 0", "field 'trajectory[2].text'", "missing"]),
    (_row(_ai("ls\u0000")), ["step 0", "field 'trajectory[2].text'", "NUL"]),
    (_row(_ai("echo " + "y" * (10 << 20))), ["step 0", "field 'trajectory[2].text'", "limit"]),
    ({"instance_id": 7, "trajectory": [_ai("ls")]}, ["field 'instance_id'", "expected str, got int"]),
    (["not", "a", "row"], ["record 0", "expected a row object"]),
])
def test_bad_rows(tmp_path, row, expect):
    _err(_write(tmp_path, [row]), expect)


def test_truncated_file_and_jsonl_resilience(tmp_path):
    p = tmp_path / "rows.json"
    p.write_text(json.dumps([_row(_ai("ls"))])[:-10])
    _err(p, ["invalid JSON"])
    p = tmp_path / "rows.jsonl"
    p.write_text(json.dumps(_row(_ai("ls"))) + "\n{\"trajectory\": [\n" + json.dumps(_row(_ai("pwd"))) + "\n")
    results = list(conv.iter_results(p))
    assert [type(r).__name__ for r in results] == ["Trace", "TraceError", "Trace"]
    assert "record 2" in str(results[1])


def test_parquet(rows, traces, tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    p = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p)
    assert registry.sniff(p) == "swe-agent-rows"
    assert [[s.to_json() for s in t.steps] for t in conv.convert(p)] == [[s.to_json() for s in t.steps] for t in traces]


# ---------------------------------------------------------------------------------------------
# Fuzzing

json_value = json_values(
    ["ai", "user", "system", "```\nls\n```", "```\nedit 1:2\nx\nend_of_edit\n```", "(Current directory: /x)"],
    ["role", "text", "trajectory", "instance_id", "mask", "system_prompt"])


@FUZZ
@given(doc=st.lists(json_value, max_size=3) | json_value)
def test_fuzz_generated(fuzz_dir, doc):
    p = fuzz_dir / "gen.json"
    p.write_text(json.dumps(doc))
    check_converter(conv, p)


@pytest.fixture(scope="module")
def small_real_row(rows):
    row = copy.deepcopy(rows[0])
    row.pop("eval_logs", None)
    for turn in row["trajectory"]:
        for k in ("text", "system_prompt"):
            if isinstance(turn.get(k), str) and turn["role"] != "ai":
                turn[k] = turn[k][-200:]
    return row


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_real_row(fuzz_dir, small_real_row, data):
    row = mutated(data, small_real_row, json_value, ops=("replace", "delete", "nul", "fence"))
    p = fuzz_dir / "mut.jsonl"
    p.write_text(maybe_cut(data, json.dumps(row) + "\n"))
    check_converter(conv, p)
