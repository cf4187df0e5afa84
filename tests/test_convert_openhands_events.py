"""openhands-events converter: concrete counts on the real event streams, cwd, durations, bad input,
fuzzing.

Counts were taken by reading the files directly: per file/record, the (source, action) pairs of the
action events. Agent actions are steps except the `system` prompt; user `message`s, `recall` and
`change_agent_state` are not.
"""
from __future__ import annotations

import json
from functools import partial
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from pytest_agentcgroup.traces import convert as registry
from pytest_agentcgroup.traces.convert import openhands_events as conv
from pytest_agentcgroup.traces.ir import TraceError, parse_trace
from converter_checks import (DATASETS, FUZZ, check_converter, expect_trace_error, json_values,
                              maybe_cut, mutated, only_trace, real_sample)

FOLDER = DATASETS / "openhands-events"
GUI, WRONG, MULTI = (FOLDER / n for n in ("basic_gui_mode.json", "wrong_initial_state.json", "multiswe_output.jsonl"))
needs_data = pytest.mark.skipif(not FOLDER.is_dir(), reason=f"real samples not present: {FOLDER}")


_one = partial(only_trace, conv)


# ---------------------------------------------------------------------------------------------
# The real samples

@needs_data
@pytest.mark.parametrize("path", [GUI, WRONG, MULTI], ids=lambda p: p.name)
def test_sniff(path):
    assert conv.sniff(path) and registry.sniff(path) == "openhands-events"


@needs_data
def test_basic_gui_mode():
    t = _one(GUI)
    assert t.trace_id == "openhands-events/basic_gui_mode"
    # 18 events: agent actions run(7), edit(9), edit(11), run(13), message(15)
    assert [(s.tool, s.native_tool) for s in t.steps] == [
        ("bash", "run"), ("edit", "edit"), ("edit", "edit"), ("bash", "run"), ("noop", "message")]
    assert t.steps[0].args == {"command": "mkdir -p /workspace/todo-app", "is_input": False}
    # the cwd the first command's observation reported carries to the later steps
    assert t.steps[1].args == {"op": "edit", "path": "/workspace/todo-app/index.html", "cwd": "/workspace"}
    assert t.steps[3].args["cwd"] == "/workspace"
    # durations: action timestamp -> observation timestamp (cause), recorded
    assert t.steps[0].duration_ms.to_json() == {"value": 658.357, "provenance": "recorded"}  # 20:29:35.040676 -> 35.699033
    assert t.steps[3].duration_ms.value == 30580.23                                        # the 30 s no-output timeout
    assert all(s.duration_ms.provenance == "recorded" for s in t.steps)


@needs_data
def test_wrong_initial_state():
    t = _one(WRONG)
    assert [(s.tool, s.native_tool) for s in t.steps] == [
        ("read", "read"), ("bash", "run"), ("read", "read"), ("noop", "finish")]
    assert t.steps[1].args == {"command": "mv /workspace/game_2048.py /workspace/2048.py",
                               "timeout_ms": 120000.0, "is_input": False}
    assert t.steps[2].args == {"op": "view", "path": "/workspace", "cwd": "/workspace"}
    assert [s.duration_ms.value if s.duration_ms else None for s in t.steps] == [35.473, 648.763, 20.823, None]
    assert t.source == {"format": "openhands-events",
                        "dataset": "All-Hands-AI/OpenHands test fixtures and evaluation examples",
                        "path": "openhands-events/wrong_initial_state.json", "licence": "MIT",
                        "origin": "All-Hands-AI/OpenHands@156d0686c46aafb0fa9d291da6421fb6f64dddc0"}


@needs_data
def test_multiswe_records():
    traces = list(conv.convert(MULTI))
    assert [t.trace_id for t in traces] == ["openhands-events/ponylang__ponyc-4595/1",
                                            "openhands-events/ponylang__ponyc-4593/2",
                                            "openhands-events/ponylang__ponyc-4588/3"]
    # 49/70/103 events -> agent actions minus the system prompt
    assert [len(t.steps) for t in traces] == [23, 33, 49]
    assert [Counter(s.native_tool for s in t.steps) for t in traces] == [
        {"run": 13, "read": 6, "edit": 2, "think": 1, "finish": 1},
        {"run": 12, "edit": 11, "read": 9, "finish": 1},
        {"run": 24, "edit": 16, "read": 8, "think": 1}]          # this one hit max iterations: no finish
    assert [Counter(s.tool for s in t.steps) for t in traces] == [
        {"bash": 13, "read": 6, "edit": 2, "noop": 2},
        {"bash": 12, "edit": 11, "read": 9, "noop": 1},
        {"bash": 24, "edit": 16, "read": 8, "noop": 1}]
    # every action but the unanswered `finish` has a recorded duration
    assert [sum(s.duration_ms is not None for s in t.steps) for t in traces] == [22, 32, 49]
    for t in traces:
        parse_trace(t.to_json())
        edits = [s for s in t.steps if s.tool == "edit"]
        assert all("command" not in s.args and s.args["op"] in ("str_replace", "create", "insert", "undo_edit", "edit")
                   for s in edits)


@needs_data
def test_multiswe_cwd_follows_cd():
    t = list(conv.convert(MULTI))[2]
    # ponyc-4588 walks down with `cd X && ls -l`: each step runs where the previous one left the shell
    assert "cwd" not in t.steps[0].args
    assert [s.args.get("cwd") for s in t.steps[1:4]] == [
        "/workspace/ponylang__ponyc__0.1", "/workspace/ponylang__ponyc__0.1/src",
        "/workspace/ponylang__ponyc__0.1/src/libponyc"]


# ---------------------------------------------------------------------------------------------
# Hand-built streams

def _act(i, action, args, ts, source="agent", **kw):
    return {"id": i, "timestamp": ts, "source": source, "message": "", "action": action, "args": args, **kw}


def _obs(i, cause, kind, ts, wd=None, **kw):
    ev = {"id": i, "timestamp": ts, "source": "agent", "message": "", "cause": cause, "observation": kind,
          "content": "", "extras": {}}
    if wd is not None:
        ev["extras"] = {"metadata": {"working_dir": wd}}
    ev.update(kw)
    return ev


def _write(tmp_path, events, name="events.json"):
    p = tmp_path / name
    p.write_text(json.dumps(events))
    return p


def test_all_action_kinds(tmp_path):
    T = "2025-01-01T00:00:0{}.000000"
    ev = [
        _act(0, "system", {"content": "sys"}, T.format(0)),
        _act(1, "message", {"content": "task"}, T.format(0), source="user"),
        _act(2, "run", {"command": "cd /r", "is_input": "false"}, T.format(1), timeout=7),
        _obs(3, 2, "run", T.format(2), wd="/r"),
        _act(4, "run_ipython", {"code": "print(1)"}, T.format(3)),
        _act(5, "write", {"path": "/r/a", "content": "hi"}, T.format(3)),
        _act(6, "browse", {"url": "http://x"}, T.format(4)),
        _act(7, "browse_interactive", {"browser_actions": "click('1')"}, T.format(4)),
        _act(8, "run", {"command": "ls", "cwd": "/own"}, T.format(5)),
        _act(9, "run", {"command": "echo hi"}, T.format(5), source="user"),   # typed in the GUI terminal: a step
        _act(10, "change_agent_state", {"agent_state": "x"}, T.format(6), source="environment"),
        _act(11, "think", {"thought": "hmm"}, T.format(6)),
        _obs(12, 11, "think", T.format(5)),                                     # before its action: no duration
        _act(13, "finish", {}, T.format(7)),
        _act(14, "write", {"path": "/r/b", "content": "x", "start": 3, "end": 4}, T.format(7)),   # lines 3..4 only
    ]
    t = _one(_write(tmp_path, ev))
    assert [(s.tool, s.native_tool) for s in t.steps] == [
        ("bash", "run"), ("python", "run_ipython"), ("edit", "write"), ("browser", "browse"),
        ("browser", "browse_interactive"), ("bash", "run"), ("bash", "run"), ("noop", "think"), ("noop", "finish"),
        ("edit", "write")]
    assert t.steps[0].args == {"command": "cd /r", "timeout_ms": 7000.0, "is_input": False}
    assert t.steps[0].duration_ms.value == 1000.0
    assert t.steps[1].args == {"command": "print(1)"}
    assert t.steps[2].args == {"op": "write", "path": "/r/a", "file_text": "hi", "cwd": "/r"}
    # a part of a file: its span kept, under an op no replay applies
    assert t.steps[9].args == {"op": "write_lines", "lines": [3, 4], "path": "/r/b", "file_text": "x", "cwd": "/r"}
    assert t.steps[3].args == {"method": "browse", "url": "http://x"}
    assert t.steps[4].args == {"method": "browse_interactive", "actions": "click('1')"}
    assert t.steps[5].args == {"command": "ls", "cwd": "/own"}
    assert t.steps[6].args == {"command": "echo hi", "cwd": "/r"}
    assert t.steps[7].duration_ms is None


def test_records_array_and_single_object(tmp_path):
    stream = [_act(0, "run", {"command": "ls"}, "2025-01-01T00:00:00")]
    p = _write(tmp_path, [{"instance_id": "a/b", "history": stream}, {"history": stream}], "recs.json")
    assert [t.trace_id for t in conv.convert(p)] == ["openhands-events/a_b/0", "openhands-events/record1/1"]
    p = _write(tmp_path, {"instance_id": "solo", "history": stream}, "one.json")
    assert _one(p).trace_id == "openhands-events/solo"


_err = partial(expect_trace_error, conv)


RUN = {"command": "ls"}


@pytest.mark.parametrize("events, expect", [
    ([], ["empty event stream"]),
    ([5], ["field '[0]'", "expected an event object"]),
    ([{"id": 1, "source": "agent"}], ["field '[0].action'", "neither"]),
    ([_act(0, "run", {}, "2025-01-01T00:00:00")], ["step 0", "field '[0].args.command'", "missing"]),
    ([_act(0, "run", {"command": 3}, "2025-01-01T00:00:00")], ["step 0", "field '[0].args.command'", "expected str, got int"]),
    ([_act(0, "run", RUN, "2025-01-01T00:00:00", timeout="soon")], ["step 0", "field '[0].timeout'"]),
    ([_act(0, "run", "ls", "2025-01-01T00:00:00")], ["step 0", "field '[0].args'", "expected dict"]),
    ([{**_act(0, "run", RUN, "x"), "source": None}], ["step 0", "field '[0].source'"]),
    ([_act(0, "teleport", {}, "2025-01-01T00:00:00")], ["step 0", "field '[0].action'", "unknown action 'teleport'"]),
    ([_act(0, "run", {"command": "l\u0000s"}, "2025-01-01T00:00:00")], ["step 0", "field '[0].args.command'", "NUL"]),
    ([_act(0, "run", RUN, "yesterday"), _obs(1, 0, "run", "2025-01-01T00:00:01")], ["step 0", "field '[0].timestamp'", "ISO"]),
    ([_act(0, "run", RUN, "2025-01-01T00:00:00"), _obs(1, 0, "run", "2025-01-01T00:00:01", wd=7)],
     ["field '[1].extras.metadata.working_dir'"]),
    ([_act(0, "message", {"content": "hi"}, "2025-01-01T00:00:00", source="user")], ["field 'events'", "empty trajectory"]),
    ([_act(0, "run", {"command": "x" * (10 << 20)}, "2025-01-01T00:00:00")], ["step 0", "field '[0].args.command'", "limit"]),
])
def test_bad_events(tmp_path, events, expect):
    _err(_write(tmp_path, events), expect)


def test_bad_records(tmp_path):
    p = tmp_path / "out.jsonl"
    good = {"instance_id": "ok", "history": [_act(0, "run", RUN, "2025-01-01T00:00:00")]}
    p.write_text("\n".join([json.dumps(good), json.dumps({"instance_id": "nohist"}),
                            json.dumps({"instance_id": "bad", "history": [_act(0, "zap", {}, "t")]}),
                            json.dumps(good)[:30], json.dumps(good)]) + "\n")
    results = list(conv.iter_results(p))
    errs = [str(r) for r in results if isinstance(r, TraceError)]
    assert [r.trace_id for r in results if not isinstance(r, TraceError)] == ["openhands-events/ok/1", "openhands-events/ok/5"]
    assert errs[0].endswith("record 2, field 'history': missing")
    assert "record 3, step 0, field 'history[0].action': unknown action 'zap'" in errs[1]
    assert "record 4: invalid JSON" in errs[2]
    p.write_bytes(b"\x00" + p.read_bytes())
    assert "NUL byte" in str(next(conv.iter_results(p)))


def test_truncated_array_and_wrong_top_level(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps([_act(0, "run", RUN, "2025-01-01T00:00:00")])[:-3])
    _err(p, ["invalid JSON"])
    p.write_text("42")
    _err(p, ["expected an event array"])


# ---------------------------------------------------------------------------------------------
# Fuzzing

json_value = json_values(
    ["run", "read", "edit", "think", "agent", "user", "2025-01-01T00:00:00", "2025-13-01T00:00:00+05:00"],
    ["id", "cause", "action", "observation", "args", "extras", "metadata", "working_dir", "source", "timestamp",
     "command", "path", "timeout", "history", "content"], max_leaves=25)


@FUZZ
@given(doc=json_value, jsonl=st.booleans())
def test_fuzz_generated(fuzz_dir, doc, jsonl):
    p = fuzz_dir / ("gen.jsonl" if jsonl else "gen.json")
    p.write_text(json.dumps(doc))
    check_converter(conv, p)


@pytest.fixture(scope="module")
def small_real_events():
    real_sample(WRONG)
    events = json.loads(WRONG.read_text())
    for e in events:
        e.pop("tool_call_metadata", None)
        if isinstance(e.get("content"), str):
            e["content"] = e["content"][:100]
    return events


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_real_stream(fuzz_dir, small_real_events, data):
    events = mutated(data, small_real_events, json_value)
    text = json.dumps({"instance_id": "fz", "history": events} if data.draw(st.booleans()) else events)
    p = fuzz_dir / "mut.json"
    p.write_text(maybe_cut(data, text))
    check_converter(conv, p)
