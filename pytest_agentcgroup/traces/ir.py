"""The trace IR: one agent run as a list of tool-call steps, plus optional replay data.

A trace file is JSON (one trace) or JSONL (one trace per line). Schema, version 1:

    {
      "schema": "agentcgroup-trace/1",
      "trace_id": "claude-code/haiku/RDFLib__rdflib-1117",     # unique, stable: test ids use it
      "source": {"format": "claude-code", "dataset": "...", "path": "...",
                 "origin": "owner/repo@commit", "licence": "GPL-2.0"},
      "steps": [
        {"step_id": 0,
         "tool": "bash",                      # one of TOOLS
         "native_tool": "Bash",               # the tool's name in the source format
         "args": {"command": "pytest -x", "cwd": "/testbed", "timeout_ms": 120000},
         "duration_ms": {"value": 5120.0, "provenance": "recorded"},
         "profile": {                          # what the step consumed; every field optional
           "peak_mb":  {"value": 310.0, "provenance": "derived"},
           "ramp_ms":  {"value": 2000.0, "provenance": "derived"},
           "cpu_ms":   {"value": 4100.0, "provenance": "derived"},
           "io_bytes": {"value": 0, "provenance": "synthetic"},
           "curve":    {"t_ms": [0, 10, 20], "mb": [2.0, 180.5, 40.1], "provenance": "recorded"}
         },
         "outcome": {"status": "ok", "exit_code": 0},          # profiled steps: how the run ended
         "original": {"duration_ms": {...}, "profile": {...}}, # profiled steps: the source's own figures
         "recorded_outcome": {"status": "failed", "exit_code": 1},  # how the step ended in the source run
         "recorded_output": "Traceback (most recent call last): ...", # the head of what it printed there
         "output": "Traceback (most recent call last): ..."   # profiled steps with a recorded_output:
        }                                                        # the head of what it printed here
      ],
      "task": {"instance_id": "RDFLib__rdflib-1117", "path": "/testbed", ...}   # optional: task.py
    }

`curve` is the memory of the step's own cgroup over the step (MiB at t_ms after its start, t_ms
increasing), as `agentcgroup traces profile` samples it; `peak_mb` stays the step's peak (the
kernel's own per-cgroup peak where it has one). `outcome` says how a profiled step ended (OUTCOMES):
a step that failed or timed out is kept, with what was measured until then. `original` keeps the
profile the trace had before it was profiled, for comparison. `recorded_outcome`/`recorded_output`:
what the source recorded of the step's own run (exit code or timeout; its output's head), kept to compare
(metrics/faithfulness.py, metrics/source_faithfulness.py); `output`: the head of what a profiled step
printed here, kept where the source recorded an output to compare it with. `task` names what the trace ran on (task.py).

Every number a trace carries says where it came from (PROVENANCES): `recorded` was measured by the
source itself, `derived` was computed from recorded data (e.g. a step's memory peak from the 1 Hz
container samples that fall inside it), `synthetic` was made up by us (a default, a generator).

Every quantity has one rule by its key (numbers.py), applied wherever it sits: a figure that cannot
be is a TraceError at load naming file, step and field.

Imports only numbers.py, task.py and error.py from the package: it is the bottom of the data flow.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .error import TraceError
from .numbers import PROFILE_FIELDS, number_problem, step_numbers
from .task import Task, check_task, parse_task

SCHEMA = "agentcgroup-trace/1"

#: What a step does. `bash` runs a shell command; `python` runs code in an interpreter the agent
#: keeps (IPython); `edit`/`read`/`search` are file operations the agent runtime performs itself
#: (not shell commands); `browser` is one browser action; `noop` is a step that executes nothing
#: (think, finish, todo lists) but is kept so step numbering matches the source.
TOOLS = ("bash", "python", "edit", "read", "search", "browser", "noop")
PROVENANCES = ("recorded", "derived", "synthetic")
OUTCOMES = ("ok", "failed", "timeout", "oom", "error")   # exit 0 | exit != 0 | killed at its timeout | OOM-killed | did not start

def check_number(value: Any, key: str, *, field: str, where: dict, step: int | None = None,
                 item: int | None = None):
    """`value` if it follows NUMBERS[key] (numbers.py), else a TraceError naming the field (and the list item)."""
    problem = number_problem(value, key)
    if problem is not None:
        raise TraceError(f"item {item}: {problem}" if item is not None else problem, field=field, step=step, **where)
    return value


@dataclass(frozen=True)
class Measure:
    """A number and where it came from."""
    value: float
    provenance: str

    def to_json(self) -> dict:
        return {"value": self.value, "provenance": self.provenance}


@dataclass(frozen=True)
class Curve:
    """Memory over a step: mb[i] MiB at t_ms[i] ms after the step started (t_ms increasing)."""
    t_ms: tuple[float, ...]
    mb: tuple[float, ...]
    provenance: str

    def to_json(self) -> dict:
        return {"t_ms": list(self.t_ms), "mb": list(self.mb), "provenance": self.provenance}


@dataclass(frozen=True)
class Profile:
    peak_mb: Measure | None = None
    ramp_ms: Measure | None = None
    cpu_ms: Measure | None = None
    io_bytes: Measure | None = None
    curve: Curve | None = None

    def to_json(self) -> dict:
        out = {k: getattr(self, k).to_json() for k in PROFILE_FIELDS if getattr(self, k) is not None}
        if self.curve is not None:
            out["curve"] = self.curve.to_json()
        return out

    def provenance(self) -> str:
        """The weakest provenance among the fields present ('none' when the profile is empty)."""
        present = [getattr(self, k).provenance for k in (*PROFILE_FIELDS, "curve") if getattr(self, k) is not None]
        if not present:
            return "none"
        return max(present, key=PROVENANCES.index)


@dataclass(frozen=True)
class Outcome:
    """How a profiled step ended: status one of OUTCOMES, the exit code where the command exited."""
    status: str
    exit_code: int | None = None

    def to_json(self) -> dict:
        return {"status": self.status, "exit_code": self.exit_code}


@dataclass(frozen=True)
class Original:
    """A profiled step's figures from its source, kept beside the recorded ones."""
    duration_ms: Measure | None = None
    profile: Profile = field(default_factory=Profile)

    def to_json(self) -> dict:
        out: dict[str, Any] = {}
        if self.duration_ms is not None:
            out["duration_ms"] = self.duration_ms.to_json()
        out["profile"] = self.profile.to_json()
        return out


@dataclass(frozen=True)
class Step:
    step_id: int
    tool: str
    args: dict[str, Any] = field(default_factory=dict)
    native_tool: str | None = None
    duration_ms: Measure | None = None
    profile: Profile = field(default_factory=Profile)
    outcome: Outcome | None = None
    original: Original | None = None
    recorded_outcome: Outcome | None = None
    recorded_output: str | None = None
    output: str | None = None

    @property
    def command(self) -> str | None:
        return self.args.get("command")

    def to_json(self) -> dict:
        out: dict[str, Any] = {"step_id": self.step_id, "tool": self.tool}
        if self.native_tool is not None:
            out["native_tool"] = self.native_tool
        out["args"] = self.args
        if self.duration_ms is not None:
            out["duration_ms"] = self.duration_ms.to_json()
        prof = self.profile.to_json()
        if prof:
            out["profile"] = prof
        if self.outcome is not None:
            out["outcome"] = self.outcome.to_json()
        if self.original is not None:
            out["original"] = self.original.to_json()
        if self.recorded_outcome is not None:
            out["recorded_outcome"] = self.recorded_outcome.to_json()
        if self.recorded_output is not None:
            out["recorded_output"] = self.recorded_output
        if self.output is not None:
            out["output"] = self.output
        return out


@dataclass(frozen=True)
class Trace:
    trace_id: str
    source: dict[str, Any]
    steps: tuple[Step, ...]
    task: Task | None = None

    def to_json(self) -> dict:
        out = {"schema": SCHEMA, "trace_id": self.trace_id, "source": self.source,
               "steps": [s.to_json() for s in self.steps]}
        return out if self.task is None else {**out, "task": self.task.to_json()}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Validation: parse a decoded JSON object into a Trace, or raise TraceError naming the field.

def _need(obj: dict, key: str, types, where: dict, *, step=None) -> Any:
    if not isinstance(obj, dict):
        raise TraceError(f"expected an object, got {type(obj).__name__}", step=step, **where)
    if key not in obj:
        raise TraceError("missing", field=key, step=step, **where)
    val = obj[key]
    if not isinstance(val, types) or isinstance(val, bool) and bool not in _astuple(types):
        raise TraceError(f"expected {_typename(types)}, got {type(val).__name__}", field=key, step=step, **where)
    return val


def _astuple(types):
    return types if isinstance(types, tuple) else (types,)


def _typename(types) -> str:
    return " or ".join(t.__name__ for t in _astuple(types))


def _measure(raw: Any, name: str, where: dict, step: int) -> Measure:
    if not isinstance(raw, dict):
        raise TraceError(f"expected {{value, provenance}}, got {type(raw).__name__}", field=name, step=step, **where)
    value = check_number(raw.get("value"), name.rsplit(".", 1)[-1], field=f"{name}.value", where=where, step=step)
    prov = raw.get("provenance")
    if prov not in PROVENANCES:
        raise TraceError(f"provenance must be one of {', '.join(PROVENANCES)}, got {prov!r}",
                         field=f"{name}.provenance", step=step, **where)
    return Measure(float(value), prov)


def parse_step(raw: Any, index: int, where: dict) -> Step:
    if not isinstance(raw, dict):
        raise TraceError(f"expected an object, got {type(raw).__name__}", step=index, **where)
    step_id = _need(raw, "step_id", int, where, step=index)
    tool = _need(raw, "tool", str, where, step=index)
    if tool not in TOOLS:
        raise TraceError(f"unknown tool {tool!r}; expected one of {', '.join(TOOLS)}", field="tool", step=index, **where)
    args = raw.get("args", {})
    if not isinstance(args, dict):
        raise TraceError(f"expected an object, got {type(args).__name__}", field="args", step=index, **where)
    for key, types in (("command", str), ("cwd", str)):
        if key in args and args[key] is not None and not isinstance(args[key], types):
            raise TraceError(f"expected {_typename(types)}, got {type(args[key]).__name__}",
                             field=f"args.{key}", step=index, **where)
    if args.get("timeout_ms") is not None:
        check_number(args["timeout_ms"], "timeout_ms", field="args.timeout_ms", where=where, step=index)
    if tool in ("bash", "python") and not isinstance(args.get("command"), str):
        raise TraceError(f"a {tool} step needs a command", field="args.command", step=index, **where)
    native = raw.get("native_tool")
    if native is not None and not isinstance(native, str):
        raise TraceError(f"expected str, got {type(native).__name__}", field="native_tool", step=index, **where)
    duration = _measure(raw["duration_ms"], "duration_ms", where, index) if raw.get("duration_ms") is not None else None
    profile = _profile(raw.get("profile"), "profile", where, index)
    outcome = _outcome(raw["outcome"], where, index) if raw.get("outcome") is not None else None
    original = None
    if raw.get("original") is not None:
        orig = raw["original"]
        if not isinstance(orig, dict):
            raise TraceError(f"expected an object, got {type(orig).__name__}", field="original", step=index, **where)
        original = Original(
            duration_ms=_measure(orig["duration_ms"], "original.duration_ms", where, index)
            if orig.get("duration_ms") is not None else None,
            profile=_profile(orig.get("profile"), "original.profile", where, index))
    recorded = (_outcome(raw["recorded_outcome"], where, index, "recorded_outcome")
                if raw.get("recorded_outcome") is not None else None)
    texts = {}
    for key in ("recorded_output", "output"):
        text = raw.get(key)
        if text is not None and not isinstance(text, str):
            raise TraceError(f"expected str, got {type(text).__name__}", field=key, step=index, **where)
        texts[key] = text
    return Step(step_id=step_id, tool=tool, args=args, native_tool=native, duration_ms=duration, profile=profile,
                outcome=outcome, original=original, recorded_outcome=recorded, **texts)


def _profile(raw: Any, name: str, where: dict, step: int) -> Profile:
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise TraceError(f"expected an object, got {type(raw).__name__}", field=name, step=step, **where)
    unknown = set(raw) - {*PROFILE_FIELDS, "curve"}
    if unknown:
        raise TraceError(f"unknown profile field(s) {', '.join(sorted(unknown))}; expected "
                         f"{', '.join(PROFILE_FIELDS)} or curve", field=name, step=step, **where)
    curve = _curve(raw["curve"], f"{name}.curve", where, step) if raw.get("curve") is not None else None
    return Profile(**{k: _measure(v, f"{name}.{k}", where, step) for k, v in raw.items()
                      if v is not None and k != "curve"}, curve=curve)


def _curve(raw: Any, name: str, where: dict, step: int) -> Curve:
    if not isinstance(raw, dict):
        raise TraceError(f"expected {{t_ms, mb, provenance}}, got {type(raw).__name__}", field=name, step=step, **where)
    cols = []
    for key in ("t_ms", "mb"):
        col = raw.get(key)
        if not isinstance(col, list):
            raise TraceError(f"must be a list of numbers, got {type(col).__name__}", field=f"{name}.{key}",
                             step=step, **where)
        for i, v in enumerate(col):
            check_number(v, key, field=f"{name}.{key}", where=where, step=step, item=i)
        cols.append(tuple(float(v) for v in col))
    curve = Curve(cols[0], cols[1], raw.get("provenance"))
    _check_curve(curve, name, where, step)
    return curve


def _check_curve(curve: Curve, name: str, where: dict, step: int) -> None:
    if len(curve.t_ms) != len(curve.mb) or not curve.t_ms:
        raise TraceError(f"t_ms and mb must be non-empty and of one length, got {len(curve.t_ms)} and "
                         f"{len(curve.mb)}", field=name, step=step, **where)
    if any(b < a for a, b in zip(curve.t_ms, curve.t_ms[1:])):
        raise TraceError("must not decrease", field=f"{name}.t_ms", step=step, **where)
    if curve.provenance not in PROVENANCES:
        raise TraceError(f"provenance must be one of {', '.join(PROVENANCES)}, got {curve.provenance!r}",
                         field=f"{name}.provenance", step=step, **where)


def _outcome(raw: Any, where: dict, step: int, name: str = "outcome") -> Outcome:
    if not isinstance(raw, dict) or raw.get("status") not in OUTCOMES:
        got = raw.get("status") if isinstance(raw, dict) else raw
        raise TraceError(f"status must be one of {', '.join(OUTCOMES)}, got {got!r}", field=f"{name}.status",
                         step=step, **where)
    code = check_number(raw.get("exit_code"), "exit_code", field=f"{name}.exit_code", where=where, step=step)
    return Outcome(raw["status"], code)


def parse_trace(raw: Any, *, file: str | None = None, record: int | None = None) -> Trace:
    where = {"file": file, "record": record}
    if not isinstance(raw, dict):
        raise TraceError(f"expected a trace object, got {type(raw).__name__}", **where)
    schema = raw.get("schema", SCHEMA)
    if schema != SCHEMA:
        raise TraceError(f"unsupported schema {schema!r}; this version reads {SCHEMA!r}", field="schema", **where)
    trace_id = _need(raw, "trace_id", str, where)
    if not trace_id.strip():
        raise TraceError("must not be empty", field="trace_id", **where)
    source = _need(raw, "source", dict, where)
    steps_raw = _need(raw, "steps", list, where)
    if not steps_raw:
        raise TraceError("a trace needs at least one step", field="steps", **where)
    steps = tuple(parse_step(s, i, where) for i, s in enumerate(steps_raw))
    seen: set[int] = set()
    for i, s in enumerate(steps):
        if s.step_id in seen:
            raise TraceError(f"duplicate step_id {s.step_id}", field="step_id", step=i, **where)
        seen.add(s.step_id)
    return Trace(trace_id=trace_id, source=source, steps=steps, task=parse_task(raw.get("task"), where))


def check_trace(trace: Trace, *, file: str | None = None, record: int | None = None) -> Trace:
    """`trace` checked against the same rules as parse_trace, on the objects themselves (no JSON
    round trip: converters call this on every trace they emit, so it must be cheap)."""
    where = {"file": file, "record": record}
    if not isinstance(trace.trace_id, str) or not trace.trace_id.strip():
        raise TraceError("must be a non-empty str", field="trace_id", **where)
    if not isinstance(trace.source, dict):
        raise TraceError(f"expected dict, got {type(trace.source).__name__}", field="source", **where)
    if not trace.steps:
        raise TraceError("a trace needs at least one step", field="steps", **where)
    check_task(trace.task, where)
    seen: set[int] = set()
    for i, st in enumerate(trace.steps):
        if not isinstance(st.step_id, int) or isinstance(st.step_id, bool):
            raise TraceError(f"expected int, got {type(st.step_id).__name__}", field="step_id", step=i, **where)
        if st.step_id in seen:
            raise TraceError(f"duplicate step_id {st.step_id}", field="step_id", step=i, **where)
        seen.add(st.step_id)
        if st.tool not in TOOLS:
            raise TraceError(f"unknown tool {st.tool!r}; expected one of {', '.join(TOOLS)}", field="tool", step=i,
                             **where)
        args = st.args
        if not isinstance(args, dict):
            raise TraceError(f"expected an object, got {type(args).__name__}", field="args", step=i, **where)
        for key, types in (("command", str), ("cwd", str)):
            val = args.get(key)
            if val is not None and not isinstance(val, types):
                raise TraceError(f"expected {_typename(types)}, got {type(val).__name__}", field=f"args.{key}",
                                 step=i, **where)
        if st.tool in ("bash", "python") and not isinstance(args.get("command"), str):
            raise TraceError(f"a {st.tool} step needs a command", field="args.command", step=i, **where)
        if st.native_tool is not None and not isinstance(st.native_tool, str):
            raise TraceError(f"expected str, got {type(st.native_tool).__name__}", field="native_tool", step=i,
                             **where)
        for key, field_, value, item in step_numbers(st):
            check_number(value, key, field=field_, where=where, step=i, item=item)
        profiles = [("", st.profile)] + ([("original.", st.original.profile)] if st.original is not None else [])
        measures = [("duration_ms", st.duration_ms)] + [(f"{pre}profile.{k}", getattr(p, k))
                                                        for pre, p in profiles for k in PROFILE_FIELDS]
        if st.original is not None:
            measures.append(("original.duration_ms", st.original.duration_ms))
        for name, m in measures:
            if m is not None and m.provenance not in PROVENANCES:
                raise TraceError(f"provenance must be one of {', '.join(PROVENANCES)}, got {m.provenance!r}",
                                 field=f"{name}.provenance", step=i, **where)
        for pre, p in profiles:
            if p.curve is not None:
                _check_curve(p.curve, f"{pre}profile.curve", where, i)
        for name, oc in (("outcome", st.outcome), ("recorded_outcome", st.recorded_outcome)):
            if oc is not None and oc.status not in OUTCOMES:
                raise TraceError(f"status must be one of {', '.join(OUTCOMES)}, got {oc.status!r}",
                                 field=f"{name}.status", step=i, **where)
        for key in ("recorded_output", "output"):
            text = getattr(st, key)
            if text is not None and not isinstance(text, str):
                raise TraceError(f"expected str, got {type(text).__name__}", field=key, step=i, **where)
    return trace


def read_traces(path: str | Path) -> Iterator[Trace]:
    """Traces in one .json (a trace, or a list of traces) or .jsonl file (a trace per line)."""
    path = Path(path)
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=name) from None
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror}", file=name) from None
    if "\x00" in text:
        raise TraceError(f"contains a NUL byte at offset {text.index(chr(0))}", file=name)
    if path.suffix == ".jsonl":
        for lineno, line in enumerate(text.split("\n"), 1):   # not splitlines(): U+2028, \x85 ... may sit in strings
            if not line.strip():
                continue
            yield parse_trace(_loads(line, name, lineno), file=name, record=lineno)
        return
    data = _loads(text, name, None)
    if isinstance(data, list):
        for i, item in enumerate(data):
            yield parse_trace(item, file=name, record=i)
    else:
        yield parse_trace(data, file=name)


def _loads(text: str, file: str, record: int | None) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})",
                         file=file, record=record) from None


def write_trace(trace: Trace, path: str | Path) -> None:
    Path(path).write_text(json.dumps(trace.to_json(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
