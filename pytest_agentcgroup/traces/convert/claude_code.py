"""Converter for AgentCgroup's Claude Code runs (`agentcgroup-claude-code`): a task directory
(tool_calls.json, resources.json, optional results.json) becomes one Trace. docs/traces.md ("The
Claude Code format") describes the input files, the layouts that convert and the tool mapping.

`convert(path)` takes a task directory, its tool_calls.json (or results.json when there is no
tool_calls.json), or a directory with task directories below it; it yields one Trace per task in
sorted path order, trace_id `claude-code/<model>/<task>` (`<model>`: the parent folder's name).
`iter_results(path)` yields a Trace or a TraceError per task directory.

Every tool call becomes one step, in order (step_id = its index; TOOL_MAP, anything else `noop`),
with duration_ms = end_timestamp - timestamp (`recorded`) and a profile derived from the container
samples around it (claude_code_samples.py); a Bash or edit step's `recorded_outcome` is what its
`result_preview` tells (claude_code_outcomes.py; None where it does not). Origin and licence are the dataset's only for a task its
README lists (_from_dataset), else "unknown". Kept strings follow _common.check_str; malformed input
raises TraceError naming the file, the record (tool-call index, or sample index) and the field.
"""
from __future__ import annotations

import json
import math
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from ..ir import Measure, Outcome, Profile, Step, Trace, TraceError
from ._common import check_str, finish, id_part, short_path
from .claude_code_edits import edit_args
from .claude_code_outcomes import bash_outcome, edit_outcome
from .claude_code_samples import (Samples, container_summary, derive_profile, load_json, parse_samples, read_samples,
                                  step_baseline)

FORMAT = "claude-code"
DATASET = "agentcgroup-claude-code"
ORIGIN = "yunwei37/agentcgroup@5af9e7b8f37a93513206c331c7ec0ff149e89f27"
LICENCE = "GPL-2.0"
#: Bash steps' cwd: the source records no working directory, and the SWE-rebench images the runs
#: used keep the repository in /testbed (the commands `cd /testbed` or use /testbed paths).
CWD = "/testbed"

TOOL_CALLS = "tool_calls.json"
RESOURCES = "resources.json"
RESULTS = "results.json"

TOOL_MAP = {"Bash": "bash", "Read": "read",
            "Edit": "edit", "Write": "edit", "MultiEdit": "edit", "NotebookEdit": "edit",
            "Grep": "search", "Glob": "search"}

#: Small, identifying input keys kept for each native tool (copied when present, type-checked).
_KEEP: dict[str, dict[str, tuple[type, ...]]] = {
    "Read": {"file_path": (str,), "offset": (int, float), "limit": (int, float)},
    "Edit": {"file_path": (str,), "replace_all": (bool,)},
    "Write": {"file_path": (str,)},
    "MultiEdit": {"file_path": (str,)},
    "NotebookEdit": {"notebook_path": (str,), "cell_id": (str,), "edit_mode": (str,)},
    "Grep": {"pattern": (str,), "path": (str,), "glob": (str,), "type": (str,), "output_mode": (str,),
             "-i": (bool,), "-n": (bool,), "-A": (int, float), "-B": (int, float), "-C": (int, float),
             "multiline": (bool,), "head_limit": (int, float)},
    "Glob": {"pattern": (str,), "path": (str,)},
    "BashOutput": {"bash_id": (str,), "filter": (str,)},
    "KillShell": {"shell_id": (str,)},
    "KillBash": {"shell_id": (str,)},
    "Task": {"subagent_type": (str,), "description": (str,)},
    "WebFetch": {"url": (str,)},
    "WebSearch": {"query": (str,)},
}

_TOOL_ERROR = "<tool_use_error>"
_REJECTED = _TOOL_ERROR + "InputValidationError"


# ---------------------------------------------------------------------------------------------
# Locating task directories

_TOOL_CALLS_HEAD = re.compile(rb'^\s*\[\s*\{')
_RESULTS_KEYS = re.compile(rb'"(?:resource_samples|claude_output|claude_time)"\s*:')


def _looks_like_tool_calls(path: Path) -> bool:
    head = _head(path)
    return bool(_TOOL_CALLS_HEAD.match(head)) and b'"tool"' in head and b'"timestamp"' in head


def _looks_like_results(path: Path) -> bool:
    return bool(_RESULTS_KEYS.search(_head(path)))


def _head(path: Path, n: int = 1 << 20) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def _task_dir(path: Path) -> Path | None:
    """The task directory `path` names (the directory, its tool_calls.json, or its results.json when
    there is no tool_calls.json), or None. Known layouts: tool_calls.json + resources.json (any
    content: errors are reported by convert), or tool_calls.json / results.json alone when their
    content looks like AgentCgroup's (a tool-call array; a run summary with resource_samples)."""
    if path.is_file() and path.name == TOOL_CALLS:
        path = path.parent
    elif path.is_file() and path.name == RESULTS:
        if (path.parent / TOOL_CALLS).is_file():
            return None          # the task is converted through its tool_calls.json
        path = path.parent
    if not path.is_dir():
        return None
    tc, res, rs = path / TOOL_CALLS, path / RESOURCES, path / RESULTS
    if tc.is_file():
        return path if res.is_file() or rs.is_file() or _looks_like_tool_calls(tc) else None
    return path if rs.is_file() and _looks_like_results(rs) else None


def sniff(path: Path) -> bool:
    """A task directory (or its tool_calls.json, or its results.json when that is the only record of
    the tool calls) in a known AgentCgroup layout."""
    try:
        return _task_dir(Path(path)) is not None
    except OSError:
        return False


def task_dirs(path: Path) -> list[Path]:
    """The task directories at or below `path`, sorted."""
    path = Path(path)
    single = _task_dir(path)
    if single is not None:
        return [single]
    if not path.is_dir():
        raise TraceError(f"not a claude-code task directory (needs {TOOL_CALLS}, or {RESULTS} with the tool calls)",
                         file=str(path))
    found = sorted({d for p in (*path.rglob(TOOL_CALLS), *path.rglob(RESULTS))
                    if (d := _task_dir(p.parent)) is not None})
    if not found:
        raise TraceError(f"no claude-code task directories (with {TOOL_CALLS}, or {RESULTS} holding the tool "
                         "calls) below", file=str(path))
    return found


def convert(path: Path) -> Iterator[Trace]:
    """One Trace per task directory at or below `path`; the first bad task raises TraceError."""
    for task in task_dirs(Path(path)):
        yield convert_task(task)


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    """Like `convert`, but a bad task yields its TraceError and the others still convert."""
    for task in task_dirs(Path(path)):
        try:
            yield convert_task(task)
        except TraceError as exc:
            yield exc


# ---------------------------------------------------------------------------------------------
# Timestamps

def _epoch_of(value: Any, file: str, record: int, fld: str) -> float:
    if not isinstance(value, str):
        raise TraceError(f"expected an ISO-8601 timestamp string, got {type(value).__name__}",
                         file=file, record=record, field=fld)
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise TraceError(f"not an ISO-8601 timestamp: {value[:40]!r}", file=file, record=record, field=fld) from None
    if dt.tzinfo is None:
        raise TraceError(f"timestamp {value!r} has no time zone (expected UTC with 'Z')",
                         file=file, record=record, field=fld)
    return dt.timestamp()


# ---------------------------------------------------------------------------------------------
# Tool calls -> steps

def _args(native: str, tool: str, inp: dict, file: str, record: int, *, strict: bool = True) -> dict[str, Any]:
    def bad(key: str, expected: str, val: Any) -> TraceError:
        return TraceError(f"expected {expected}, got {type(val).__name__}", file=file, record=record,
                          field=f"input.{key}")

    args: dict[str, Any] = {}
    where = {"file": file, "record": record}
    if tool == "bash":
        cmd = inp.get("command")
        if cmd is None:
            raise TraceError("missing", file=file, record=record, field="input.command")
        if not isinstance(cmd, str):
            raise bad("command", "str", cmd)
        args["command"] = check_str(cmd, where, field="input.command")
        args["cwd"] = CWD
        timeout = inp.get("timeout")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
                    or timeout < 0:
                raise TraceError(f"expected milliseconds (a number >= 0), got {timeout!r}"[:120], file=file,
                                 record=record, field="input.timeout")
            args["timeout_ms"] = timeout            # Claude Code gives the Bash timeout in milliseconds
        bg = inp.get("run_in_background")
        if bg is not None:
            if not isinstance(bg, bool):
                raise bad("run_in_background", "bool", bg)
            if bg:
                args["background"] = True
        return args
    for key, types in _KEEP.get(native, {}).items():
        if key in inp and inp[key] is not None:
            val = inp[key]
            if not isinstance(val, types) or (isinstance(val, bool) and bool not in types):
                if not strict:
                    continue
                raise bad(key, " or ".join(t.__name__ for t in types), val)
            if isinstance(val, float) and not math.isfinite(val):
                if not strict:
                    continue
                raise TraceError(f"expected a finite number, got {val!r}", file=file, record=record,
                                 field=f"input.{key}")
            if isinstance(val, str):
                val = check_str(val, where, field=f"input.{key}")
            args[key] = val
    if tool == "edit":
        args = edit_args(native, inp, args, where)
    return args


def recorded_outcome(tool: str, args: dict, preview) -> Outcome | None:
    """How the call ended as its preview tells (claude_code_outcomes.py); a refused edit: failed."""
    if tool == "bash":
        return bash_outcome(args["command"], preview)
    if tool == "edit":
        return Outcome("failed") if args.get("refused") else edit_outcome(preview)
    return None


def _load_results(task: Path) -> dict | None:
    path = task / RESULTS
    if not path.is_file():
        return None
    data = load_json(path)
    if not isinstance(data, dict):
        raise TraceError(f"expected an object, got {type(data).__name__}", file=str(path))
    return data


def _model_info(results: dict | None, path: Path) -> dict[str, str]:
    out = {}
    for key in ("model", "image"):
        if results and key in results and results[key] is not None:
            if not isinstance(results[key], str) or not results[key].isprintable():
                raise TraceError(f"expected a printable str, got {results[key]!r}"[:120], file=str(path), field=key)
            out[key] = results[key]
    return out


def _tool_calls(task: Path, results: dict | None) -> tuple[Any, str, str]:
    """(decoded tool calls, file they came from, field prefix): tool_calls.json, else results.json
    `traces.tool_calls` (upstream keeps an identical copy there)."""
    tc_path = task / TOOL_CALLS
    if tc_path.is_file() or results is None:
        return load_json(tc_path), str(tc_path), ""
    name = str(task / RESULTS)
    traces = results.get("traces")
    if not isinstance(traces, dict) or "tool_calls" not in traces:
        raise TraceError(f"no {TOOL_CALLS} in the task directory and no tool calls here", file=name,
                         field="traces.tool_calls")
    return traces["tool_calls"], name, "traces.tool_calls"


def _samples(task: Path, results: dict | None) -> tuple[Samples | None, str]:
    """(samples, where they came from) or (None, why there are none)."""
    if (task / RESOURCES).is_file():
        return read_samples(task / RESOURCES), f"{RESOURCES} samples"
    if results is not None and results.get("resource_samples") is not None:
        rs = results["resource_samples"]
        name = str(task / RESULTS)
        if isinstance(rs, list):        # a bare sample list
            return parse_samples(rs, name, "resource_samples"), f"{RESULTS} resource_samples"
        if not isinstance(rs, dict):
            raise TraceError(f"expected an object with 'samples', got {type(rs).__name__}", file=name,
                             field="resource_samples")
        return parse_samples(rs.get("samples"), name, "resource_samples.samples"), \
            f"{RESULTS} resource_samples"
    return None, (f"no resource samples: the task directory has no {RESOURCES}"
                  + (f" and its {RESULTS} no resource_samples" if results is not None else f" and no {RESULTS}")
                  + "; steps carry recorded durations but no profile")


def _from_dataset(task: Path) -> bool:
    """Is `task` one of the shipped dataset's tasks? (the dataset README, two levels up, names it)"""
    readme = task.parent.parent / "README.md"
    try:
        text = readme.read_text(encoding="utf-8", errors="replace")[:400_000]
    except OSError:
        return False
    return DATASET in text and f"{task.parent.name}/{task.name}/" in text


def convert_task(task: Path) -> Trace:
    task = Path(task)
    results = _load_results(task)
    calls, file, prefix = _tool_calls(task, results)
    info = _model_info(results, task / RESULTS)
    if not isinstance(calls, list):
        raise TraceError(f"expected a JSON array of tool calls, got {type(calls).__name__}", file=file,
                         field=prefix or None)
    if not calls:
        raise TraceError("no tool calls: a trace needs at least one step", file=file, field=prefix or None)
    samples, samples_from = _samples(task, results)

    def where(i: int, key: str | None) -> dict:
        """record/field of call i: the array index in tool_calls.json, a field path in results.json."""
        if not prefix:
            return {"file": file, "record": i, "field": key}
        return {"file": file, "field": f"{prefix}[{i}]" + (f".{key}" if key else "")}

    steps = []
    baselines: list[float | None] = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            raise TraceError(f"expected an object, got {type(call).__name__}", **where(i, None))
        for key in ("timestamp", "tool", "input"):
            if key not in call:
                raise TraceError("missing", **where(i, key))
        native = call["tool"]
        if not isinstance(native, str) or not native:
            raise TraceError(f"expected a tool name, got {native!r}"[:120], **where(i, "tool"))
        inp = call["input"]
        if not isinstance(inp, dict):
            raise TraceError(f"expected an object, got {type(inp).__name__}", **where(i, "input"))
        w = where(i, None)
        rec, fprefix = (w.get("record"), "") if not prefix else (None, f"{prefix}[{i}].")
        start = _epoch_of(call["timestamp"], file, rec, fprefix + "timestamp")
        # An older/interrupted tool_calls.json may lack end_timestamp (a call still running when the
        # run stopped): the step then has no duration and no profile, rather than an invented one.
        end = None
        if call.get("end_timestamp") is not None:
            end = _epoch_of(call["end_timestamp"], file, rec, fprefix + "end_timestamp")
            if end < start:
                raise TraceError(f"ends {start - end:.3f} s before it starts ({call['end_timestamp']} < "
                                 f"{call['timestamp']})", **where(i, "end_timestamp"))
        tool = TOOL_MAP.get(native, "noop")
        preview = call.get("result_preview")
        try:
            if isinstance(preview, str) and preview.startswith(_REJECTED):
                # the agent runtime refused the call's arguments: nothing ran
                tool, args = "noop", {"rejected": True, **_args(native, "noop", inp, file, i, strict=False)}
            elif tool == "edit" and isinstance(preview, str) and preview.startswith(_TOOL_ERROR):
                # the runtime refused the edit (the file not read first, nothing to change, the text
                # not found): the file stayed as it was, so a replay leaves it too (no op: not applied)
                args = {k: v for k, v in _args(native, tool, inp, file, i).items()
                        if k in ("path", "notebook_path", "bytes")}
                args["refused"] = True
            else:
                args = _args(native, tool, inp, file, i)
        except TraceError as exc:
            if not prefix:
                raise
            raise TraceError(exc.reason, file=file, field=f"{prefix}[{i}].{exc.field}") from None
        try:
            json.dumps([native, args], ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TraceError(f"contains an unpaired surrogate {exc.object[exc.start:exc.end]!r} (not writable as UTF-8)",
                             **where(i, "tool" if not native.isprintable() else "input")) from None
        has_end = end is not None
        profile = derive_profile(samples, start, end) if samples is not None and has_end else Profile()
        baselines.append(step_baseline(samples, start) if samples is not None and profile.peak_mb else None)
        steps.append(Step(step_id=i, tool=tool, native_tool=native, args=args,
                          duration_ms=Measure(float(round((end - start) * 1000.0)), "recorded") if has_end else None,
                          profile=profile, recorded_outcome=recorded_outcome(tool, args, preview)))

    model_dir = id_part(task.parent.name, "unknown")
    known = _from_dataset(task)
    source = {"format": FORMAT, "dataset": DATASET if known else "AgentCgroup Claude Code run",
              "path": short_path(task), "origin": ORIGIN if known else "unknown",
              "licence": LICENCE if known else "unknown", "model": info.get("model", task.parent.name)}
    if "image" in info:
        source["image"] = info["image"]
    agent_time = results.get("claude_time") if results else None
    if isinstance(agent_time, (int, float)) and not isinstance(agent_time, bool) and math.isfinite(agent_time) \
            and agent_time > 0:
        # the agent's whole run (model time + tool time), as results.json timed it
        source["agent_time_s"] = {"value": round(float(agent_time), 3), "provenance": "recorded"}
    if samples is not None and len(samples):
        source["container"] = container_summary(samples, samples_from, baselines)
    else:
        source["profile_note"] = samples_from if samples is None else f"{samples_from}: no usable sample"
    return finish(f"{FORMAT}/{model_dir}/{id_part(task.name, 'task')}", source, steps, {"file": file})
