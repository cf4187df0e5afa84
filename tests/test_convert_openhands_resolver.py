"""openhands-resolver converter: concrete counts on the hand-written fixture (both history shapes),
sniffing against the other formats, bad input, fuzzing.

Counts were taken by reading tests/data/openhands-resolver/output.jsonl: record 1 (flat) has 10
actions: the instruction message (user), run, run_ipython, run, run_ipython, the agent's question,
the scripted fake-user reply, run, read, write, run, finish -> 8 executed actions + 2 agent noops
(question, finish). Record 2 (pairs) has 10 pairs: user instruction, run, read, edit, browse, agent
message, user message, run_ipython, run, finish -> 6 executed + 2 agent noops.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from pytest_agentcgroup.cli import main
from pytest_agentcgroup.traces import convert as registry
from pytest_agentcgroup.traces.convert import openhands_resolver as conv
from pytest_agentcgroup.traces.ir import TraceError, parse_trace
from converter_checks import DATASETS, FUZZ, check_converter, json_values, maybe_cut, mutated

FIXTURE = Path(__file__).parent / "data" / "openhands-resolver" / "output.jsonl"
EXECUTING = {"bash", "python", "edit", "read", "browser", "search"}


def test_sniffed_as_resolver_and_not_the_others():
    assert conv.sniff(FIXTURE) and registry.sniff(FIXTURE) == "openhands-resolver"


@pytest.mark.skipif(not DATASETS.is_dir(), reason=f"real samples not present: {DATASETS}")
def test_other_formats_are_not_claimed():
    for p in sorted(DATASETS.rglob("*.json*")):
        assert not conv.sniff(p), p        # the newer event streams (with `source`) stay openhands-events
    assert registry.sniff(DATASETS / "openhands-events" / "multiswe_output.jsonl") == "openhands-events"


def test_flat_history_record():
    t1, _ = conv.convert(FIXTURE)
    assert t1.trace_id == "openhands-resolver/acme__widgets-12/1"
    assert t1.source == {"format": "openhands-resolver", "dataset": "OpenHands resolver output",
                         "path": "openhands-resolver/output.jsonl", "licence": "unknown", "origin": "unknown",
                         "issue": "acme/widgets#12"}
    assert [(s.tool, s.native_tool) for s in t1.steps] == [
        ("bash", "run"), ("python", "run_ipython"), ("bash", "run"), ("python", "run_ipython"), ("noop", "message"),
        ("bash", "run"), ("read", "read"), ("edit", "write"), ("bash", "run"), ("noop", "finish")]
    assert sum(s.tool in EXECUTING for s in t1.steps) == 8
    assert [s.step_id for s in t1.steps] == list(range(10))
    # cwd: unknown before the first prompt; then what the shell prompt / Jupyter line reported
    assert "cwd" not in t1.steps[0].args
    assert t1.steps[2].args == {"command": "cd widgets && grep -n '_SIZE' units.py", "cwd": "/workspace"}
    assert t1.steps[5].args["cwd"] == "/workspace/widgets"
    assert t1.steps[6].args == {"op": "view", "path": "/workspace/tests/test_units.py", "cwd": "/workspace/widgets"}
    # a FileWriteAction of line 9 only: its span kept, under an op no replay applies (not a whole-file write)
    assert t1.steps[7].args["path"] == "/workspace/widgets/units.py" and t1.steps[7].args["op"] == "write_lines"
    assert t1.steps[7].args["lines"] == [9, 9]
    assert all(s.duration_ms is None for s in t1.steps)          # no timestamps in this shape
    assert all(s.profile.to_json() == {} for s in t1.steps)


def test_pairs_history_record():
    _, t2 = conv.convert(FIXTURE)
    assert t2.trace_id == "openhands-resolver/acme__widgets-13/2" and t2.source["instance_id"] == "acme__widgets-13"
    assert Counter(s.tool for s in t2.steps) == {"bash": 2, "read": 1, "edit": 1, "browser": 1, "python": 1, "noop": 2}
    assert [s.native_tool for s in t2.steps] == ["run", "read", "edit", "browse", "message", "run_ipython", "run",
                                                 "finish"]
    assert t2.steps[2].args == {"op": "str_replace", "path": "/workspace/widgets/widgets/cli.py",
                                "old_str": "metadata['Version']", "new_str": "metadata.get('Version', '0+unknown')",
                                "cwd": "/workspace/widgets"}
    # durations from the action's to the observation's timestamp, recorded; none for unanswered noops
    assert [s.duration_ms.value if s.duration_ms else None for s in t2.steps] == [
        760.5, 31.25, 250.0, 2500.0, None, 2750.0, 4125.0, None]
    assert {s.duration_ms.provenance for s in t2.steps if s.duration_ms} == {"recorded"}
    for t in conv.convert(FIXTURE):
        parse_trace(t.to_json())


def test_cli_converts_the_fixture(tmp_path, capsys):
    assert main(["traces", "convert", str(FIXTURE), "-o", str(tmp_path / "out"), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert (rep["traces"], rep["steps"], rep["files"][0]["format"]) == (2, 18, "openhands-resolver")


def _rec(history, **kw):
    return {"issue": {"owner": "o", "repo": "r", "number": 1}, "instruction": "fix it", "git_patch": "",
            "history": history, **kw}


def _write(tmp_path, recs, name="output.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


RUN = {"command": "ls", "action": "run"}


@pytest.mark.parametrize("history, expect", [
    ([], ["field 'history'", "empty history"]),
    ([5], ["field 'history[0]'", "expected dict"]),
    ([{"content": "x"}], ["field 'history[0].action'", "neither"]),
    ([{"action": "run"}], ["step 0", "field 'history[0].command'", "missing"]),
    ([{"action": "run", "command": 3}], ["field 'history[0].command'", "expected str, got int"]),
    ([{"action": "teleport"}], ["field 'history[0].action'", "unknown action 'teleport'"]),
    ([[{"action": "run", "args": {"command": "ls"}}]], ["field 'history[0]'", "pair"]),
    ([[{"action": "run", "args": "ls"}, None]], ["field 'history[0][0].args'", "expected dict"]),
    ([[{"args": {}}, None]], ["field 'history[0][0].action'", "missing"]),
    ([[{"action": "run", "args": {"command": "ls"}, "timestamp": "noon"}, {"observation": "run", "timestamp": "x"}]],
     ["field 'history[0][0].timestamp'", "ISO"]),
    ([RUN, {"observation": "run", "content": "", "extras": {"metadata": {"working_dir": 7}}}, RUN],
     ["field 'history[1].extras.metadata.working_dir'"]),
    ([{"action": "message", "content": "fix it"}], ["field 'history'", "empty trajectory"]),
    ([{"action": "run", "command": "l\u0000s"}], ["field 'history[0].command'", "NUL"]),
])
def test_bad_history(tmp_path, history, expect):
    p = _write(tmp_path, [_rec([{"action": "message", "content": "fix it"}, RUN]), _rec(history)])
    results = list(conv.iter_results(p))
    assert not isinstance(results[0], TraceError)            # the good record still converts
    err = results[1]
    assert isinstance(err, TraceError) and err.record == 2
    for m in expect:
        assert m in str(err), str(err)


def test_bad_records(tmp_path):
    p = tmp_path / "output.jsonl"
    p.write_text('{"history": [], "git_patch": ""\n[1]\n')
    out = list(conv.iter_results(p))
    assert "invalid JSON" in str(out[0]) and "expected a record object" in str(out[1])
    p = tmp_path / "one.json"
    p.write_text(json.dumps(_rec([RUN])))
    (t,) = conv.convert(p)
    assert t.trace_id == "openhands-resolver/o__r-1/0" and t.steps[0].args == {"command": "ls"}
    p.write_text("3")
    with pytest.raises(TraceError, match="expected resolver records"):
        list(conv.convert(p))


# ---------------------------------------------------------------------------------------------
# Fuzzing

json_value = json_values(
    ["run", "run_ipython", "message", "finish", "read", "ls", "root@x:/w # ", "2024-08-02T10:15:00"],
    ["history", "action", "observation", "command", "code", "path", "args", "content", "source", "timestamp",
     "instruction", "issue", "instance_id"], width=3, max_leaves=15)


@FUZZ
@given(doc=json_value, jsonl=st.booleans())
def test_fuzz_generated(fuzz_dir, doc, jsonl):
    p = fuzz_dir / ("gen.jsonl" if jsonl else "gen.json")
    p.write_text(json.dumps(doc))
    check_converter(conv, p)


@pytest.fixture(scope="module", params=[0, 1], ids=["flat", "pairs"])
def fixture_record(request):
    rec = json.loads(FIXTURE.read_text().splitlines()[request.param])
    rec["instruction"] = rec["instruction"][:40]
    return rec


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_fuzz_mutated_fixture(fuzz_dir, fixture_record, data):
    p = fuzz_dir / "mut.jsonl"
    p.write_text(maybe_cut(data, json.dumps(mutated(data, fixture_record, json_value))))
    check_converter(conv, p)
