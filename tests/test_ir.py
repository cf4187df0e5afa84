"""The trace IR: JSON round trip (property test) and TraceError messages for malformed traces."""
from __future__ import annotations

import json
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_agentcgroup.traces.ir import (OUTCOMES, PROFILE_FIELDS, PROVENANCES, SCHEMA, TOOLS, Curve, Measure,
                                          Original, Outcome, Profile, Step, Trace, TraceError, parse_trace,
                                          read_traces, write_trace)
from pytest_agentcgroup.traces.task import TASK_KEYS, Task, task_of

# Text without lone surrogates (those cannot be written as UTF-8; see test_surrogates_are_not_writable).
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
json_scalar = st.none() | st.booleans() | st.integers(-2**53, 2**53) | text \
    | st.floats(allow_nan=False, allow_infinity=False)
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(text, inner, max_size=3), max_leaves=8)
# up to 1e9: within every measure's bound (traces/numbers.py: time 1e9 ms, memory 4 PiB, io 64 TiB)
measure = st.builds(Measure, st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False),
                    st.sampled_from(PROVENANCES))
number = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
curve = st.lists(st.tuples(number, number), min_size=1, max_size=5).flatmap(
    lambda pts: st.builds(Curve, st.just(tuple(sorted(t for t, _ in pts))), st.just(tuple(m for _, m in pts)),
                          st.sampled_from(PROVENANCES)))
profile = st.builds(Profile, **{k: st.none() | measure for k in PROFILE_FIELDS}, curve=st.none() | curve)
outcome = st.builds(Outcome, st.sampled_from(OUTCOMES), st.none() | st.integers(-255, 255))
task = st.builds(Task, **{k: st.none() | text.filter(lambda s: s.strip() and "\0" not in s) for k in TASK_KEYS})


@st.composite
def steps(draw, step_id: int) -> Step:
    tool = draw(st.sampled_from(TOOLS))
    args = draw(st.dictionaries(text.filter(lambda k: k not in ("command", "cwd", "timeout_ms")), json_value,
                                max_size=3))
    if tool in ("bash", "python") or draw(st.booleans()):
        args["command"] = draw(text)
    if draw(st.booleans()):
        args["cwd"] = draw(text)
    if draw(st.booleans()):
        args["timeout_ms"] = draw(st.integers(0, 10**9) | st.floats(0, 1e9))
    return Step(step_id=step_id, tool=tool, args=args,
                native_tool=draw(st.none() | text),
                duration_ms=draw(st.none() | measure), profile=draw(profile),
                outcome=draw(st.none() | outcome),
                original=draw(st.none() | st.builds(Original, st.none() | measure, profile)))


@st.composite
def traces(draw) -> Trace:
    ids = draw(st.lists(st.integers(-1000, 10**6), min_size=1, max_size=6, unique=True))
    return Trace(trace_id=draw(text.filter(lambda s: s.strip())),
                 source=draw(st.dictionaries(text, json_value, max_size=4)),
                 steps=tuple(draw(steps(i)) for i in ids), task=draw(st.none() | task))


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces())
def test_round_trip(trace):
    assert parse_trace(json.loads(trace.dumps())) == trace
    assert parse_trace(json.loads(json.dumps(trace.to_json(), indent=1))) == trace


@settings(max_examples=30, deadline=None)
@given(st.lists(traces(), min_size=1, max_size=3))
def test_round_trip_through_files(tmp_path_factory, many):
    d = tmp_path_factory.mktemp("rt")
    write_trace(many[0], d / "one.json")
    assert list(read_traces(d / "one.json")) == [many[0]]
    (d / "many.jsonl").write_text("\n".join(t.dumps() for t in many) + "\n\n", encoding="utf-8")
    assert list(read_traces(d / "many.jsonl")) == many
    (d / "list.json").write_text(json.dumps([t.to_json() for t in many]), encoding="utf-8")
    assert list(read_traces(d / "list.json")) == many


def test_surrogates_are_not_writable(tmp_path):
    # Documented limitation: parse_trace accepts "\ud800" escapes, write_trace cannot encode them.
    # Converters reject such input with a TraceError before building a Trace.
    t = parse_trace({"trace_id": "x", "source": {}, "steps": [{"step_id": 0, "tool": "noop", "args": {"a": "\ud800"}}]})
    with pytest.raises(UnicodeEncodeError):
        write_trace(t, tmp_path / "x.json")


def test_profile_provenance():
    assert Profile().provenance() == "none"
    assert Profile(peak_mb=Measure(1, "recorded"), cpu_ms=Measure(2, "derived")).provenance() == "derived"
    assert Profile(io_bytes=Measure(0, "synthetic"), cpu_ms=Measure(2, "recorded")).provenance() == "synthetic"
    assert Profile(peak_mb=Measure(1, "recorded"), curve=Curve((0.0,), (1.0,), "derived")).provenance() == "derived"


# ---------------------------------------------------------------------------------------------
# TraceError messages

def good() -> dict:
    return {"schema": SCHEMA, "trace_id": "t/1", "source": {"format": "x"},
            "steps": [{"step_id": 0, "tool": "bash", "args": {"command": "ls", "cwd": "/testbed"},
                       "duration_ms": {"value": 5, "provenance": "recorded"},
                       "profile": {"peak_mb": {"value": 1.5, "provenance": "derived"},
                                   "curve": {"t_ms": [0, 10], "mb": [1.0, 1.5], "provenance": "recorded"}},
                       "outcome": {"status": "ok", "exit_code": 0},
                       "original": {"profile": {"peak_mb": {"value": 9, "provenance": "derived"}}}},
                      {"step_id": 1, "tool": "noop"}],
            "task": {"instance_id": "o__r-1", "path": "/testbed"}}


def mutated(path: str, value):
    raw = good()
    *parents, last = path.split("/")
    node = raw
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if value is KeyError:
        del node[int(last) if isinstance(node, list) else last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return raw


MALFORMED = [
    # (path to change, new value, step, field, text)
    ("trace_id", KeyError, None, "trace_id", "missing"),
    ("trace_id", "  ", None, "trace_id", "must not be empty"),
    ("trace_id", 7, None, "trace_id", "expected str, got int"),
    ("schema", "agentcgroup-trace/2", None, "schema", "unsupported schema"),
    ("source", [], None, "source", "expected dict, got list"),
    ("steps", [], None, "steps", "at least one step"),
    ("steps", {}, None, "steps", "expected list, got dict"),
    ("steps/1", "noop", 1, None, "expected an object, got str"),
    ("steps/1/step_id", KeyError, 1, "step_id", "missing"),
    ("steps/1/step_id", True, 1, "step_id", "expected int, got bool"),
    ("steps/1/step_id", 0, 1, "step_id", "duplicate step_id 0"),
    ("steps/1/tool", "shell", 1, "tool", "unknown tool 'shell'"),
    ("steps/0/args", "ls", 0, "args", "expected an object"),
    ("steps/0/args/command", KeyError, 0, "args.command", "needs a command"),
    ("steps/0/args/cwd", 3, 0, "args.cwd", "expected str, got int"),
    ("steps/0/args/timeout_ms", "1s", 0, "args.timeout_ms", "expected int or float"),
    ("steps/1/native_tool", 5, 1, "native_tool", "expected str"),
    ("steps/0/duration_ms", 5, 0, "duration_ms", "expected {value, provenance}"),
    ("steps/0/duration_ms/value", -1, 0, "duration_ms.value", "finite number >= 0"),
    ("steps/0/duration_ms/value", True, 0, "duration_ms.value", "finite number >= 0"),
    ("steps/0/duration_ms/provenance", "guessed", 0, "duration_ms.provenance", "provenance must be one of"),
    ("steps/0/profile", [], 0, "profile", "expected an object, got list"),
    ("steps/0/profile/rss_mb", {"value": 1, "provenance": "derived"}, 0, "profile", "unknown profile field(s) rss_mb"),
    ("steps/0/profile/peak_mb/value", float("inf"), 0, "profile.peak_mb.value", "finite number"),
    ("steps/0/profile/curve/t_ms", [0, "a"], 0, "profile.curve.t_ms", "item 1: expected int or float"),
    ("steps/0/profile/curve/mb", [1.0], 0, "profile.curve", "of one length"),
    ("steps/0/profile/curve/t_ms", [10, 0], 0, "profile.curve.t_ms", "must not decrease"),
    ("steps/0/profile/curve/provenance", "measured", 0, "profile.curve.provenance", "provenance must be one of"),
    ("steps/0/outcome/status", "killed", 0, "outcome.status", "status must be one of"),
    ("steps/0/outcome/exit_code", "0", 0, "outcome.exit_code", "expected int or null"),
    ("task", "o__r-1", None, "task", "expected an object, got str"),
    ("task/colour", "red", None, "task", "unknown key(s) colour"),
    ("task/image", "", None, "task.image", "expected a non-empty string"),
    ("task/path", 7, None, "task.path", "expected a non-empty string"),
    ("steps/0/original", 3, 0, "original", "expected an object"),
    ("steps/0/original/profile/peak_mb/value", -2, 0, "original.profile.peak_mb.value", "finite number >= 0"),
]


@pytest.mark.parametrize("path, value, step, field, text", MALFORMED,
                         ids=[f"{m[0]}={m[1]!r}"[:40] for m in MALFORMED])
def test_parse_trace_errors(path, value, step, field, text):
    with pytest.raises(TraceError) as info:
        parse_trace(mutated(path, value), file="f.json", record=3)
    err = info.value
    assert (err.file, err.record, err.step, err.field) == ("f.json", 3, step, field)
    msg = str(err)
    assert msg.startswith("f.json, record 3") and text in msg
    if step is not None:
        assert f"step {step}" in msg
    if field is not None:
        assert f"field '{field}'" in msg


def test_parse_trace_not_an_object():
    with pytest.raises(TraceError, match=r"^expected a trace object, got list$"):
        parse_trace([])


def test_read_traces_errors(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(good()) + "\n" + '{"trace_id": \n', encoding="utf-8")
    with pytest.raises(TraceError, match=r"bad.jsonl, record 2: invalid JSON"):
        list(read_traces(p))
    p = tmp_path / "nul.json"
    p.write_bytes(b'{"a":\x00}')
    with pytest.raises(TraceError, match=r"nul.json: contains a NUL byte at offset 5"):
        list(read_traces(p))
    p = tmp_path / "latin.json"
    p.write_bytes(b'{"a": "\xe9"}')
    with pytest.raises(TraceError, match=r"latin.json: not UTF-8"):
        list(read_traces(p))
    p = tmp_path / "list.json"
    bad = good()
    bad["steps"][0]["tool"] = "nope"
    p.write_text(json.dumps([good(), bad]), encoding="utf-8")
    with pytest.raises(TraceError, match=r"list.json, record 1, step 0, field 'tool'"):
        list(read_traces(p))
    with pytest.raises(TraceError, match="cannot read"):
        list(read_traces(tmp_path / "missing.json"))


def test_trace_error_without_location():
    assert str(TraceError("boom")) == "boom"
    assert str(TraceError("boom", field="x")) == "field 'x': boom"
    assert set(string.ascii_letters) and issubclass(TraceError, ValueError)


def test_check_trace_applies_parse_traces_rules_to_objects():
    """Converters validate what they emit with check_trace (no JSON round trip); it must refuse what
    parse_trace refuses, naming the same field and step."""
    from pytest_agentcgroup.traces.ir import Measure, Outcome, Profile, Step, Trace, check_trace, parse_trace
    ok = Step(step_id=0, tool="bash", args={"command": "ls", "cwd": "/t"}, duration_ms=Measure(5.0, "recorded"),
              profile=Profile(peak_mb=Measure(1.0, "derived")))
    assert check_trace(Trace("t", {}, (ok,))) is not None
    bad = [
        (Step(step_id=0, tool="shell", args={"command": "ls"}), "tool"),
        (Step(step_id=0, tool="bash", args={}), "args.command"),
        (Step(step_id=0, tool="python", args={"command": 3}), "args.command"),
        (Step(step_id=0, tool="read", args={"cwd": ["/"]}), "args.cwd"),
        (Step(step_id=0, tool="read", args={"timeout_ms": True}), "args.timeout_ms"),
        (Step(step_id=0, tool="noop", duration_ms=Measure(-1.0, "recorded")), "duration_ms.value"),
        (Step(step_id=0, tool="noop", duration_ms=Measure(float("nan"), "recorded")), "duration_ms.value"),
        (Step(step_id=0, tool="noop", profile=Profile(cpu_ms=Measure(1.0, "guessed"))), "profile.cpu_ms.provenance"),
        (Step(step_id=0, tool="noop", recorded_outcome=Outcome("fine", 0)), "recorded_outcome.status"),
        (Step(step_id=0, tool="noop", recorded_outcome=Outcome("failed", 300)), "recorded_outcome.exit_code"),
        (Step(step_id=0, tool="noop", recorded_output=5), "recorded_output"),
    ]
    for step, field in bad:
        trace = Trace("t", {}, (step,))
        with pytest.raises(TraceError) as a:
            check_trace(trace, file="f")
        with pytest.raises(TraceError) as b:
            parse_trace(json.loads(json.dumps(trace.to_json())), file="f")
        assert (a.value.field, a.value.step) == (b.value.field, b.value.step) == (field, 0)
    dup = Trace("t", {}, (ok, ok))
    with pytest.raises(TraceError, match="duplicate step_id"):
        check_trace(dup)
    with pytest.raises(TraceError, match="at least one step"):
        check_trace(Trace("t", {}, ()))


def test_the_task_a_trace_names_is_its_own_or_read_from_its_older_fields():
    t = parse_trace(good())
    assert t.task == Task(instance_id="o__r-1", path="/testbed") and task_of(t) is t.task
    assert t.to_json()["task"] == {"instance_id": "o__r-1", "path": "/testbed"}
    older = Trace("claude-code/haiku/dask__dask-2205", {"image": "swerebench/sweb.eval.x86_64.dask_1776_dask-2205"},
                  (Step(0, "bash", {"command": "ls"}),))
    assert task_of(older) == Task(instance_id="dask__dask-2205", repository="dask/dask",
                                  image="swerebench/sweb.eval.x86_64.dask_1776_dask-2205")
    openhands = Trace("x/1", {}, (Step(0, "bash", {"command": "ls", "cwd": "/workspace/PyPSA__linopy__0.0/test"}),))
    assert task_of(openhands) == Task(repository="PyPSA/linopy", version="0.0", path="/workspace/PyPSA__linopy__0.0")
    assert task_of(Trace("synthetic/noisy-cpu", {"format": "synthetic"}, (Step(0, "bash", {"command": "ls", "cwd": "/w"}),))) is None
    assert Task(instance_id="a__b-1", repository="a/b", version="1.0", path="/workspace/a__b__1.0").describe() == \
        "a__b-1 (repository a/b, version 1.0, at /workspace/a__b__1.0)"


def test_a_profiled_steps_output_round_trips_and_a_bad_one_is_named(tmp_path):
    step = Step(0, "bash", {"command": "echo hi"}, outcome=Outcome("ok", 0), recorded_output="hi\n", output="hi\n")
    path = tmp_path / "t.json"
    write_trace(Trace("t/x", {"format": "test"}, (step,)), path)
    (back,) = read_traces(path)
    assert back.steps[0].output == "hi\n" and back.steps[0] == step
    raw = json.loads(path.read_text())
    raw["steps"][0]["output"] = 3
    path.write_text(json.dumps(raw))
    with pytest.raises(TraceError, match="expected str, got int") as exc:
        list(read_traces(path))
    assert exc.value.field == "output" and exc.value.step == 0
