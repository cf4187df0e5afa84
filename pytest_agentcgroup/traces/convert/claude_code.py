"""Converter for AgentCgroup's Claude Code runs (`agentcgroup-claude-code`).

Input layout (one *task directory* per agent run, as in yunwei37/agentcgroup
`experiments/all_images_<model>/<task>/attempt_1/`, copied to `<root>/<model>/<task>/`):

- `tool_calls.json`: JSON array of tool calls, each `{timestamp, end_timestamp, tool, id, input,
  result_preview}`; timestamps are ISO-8601 UTC with `Z`.
- `resources.json`: `{samples: [{epoch, timestamp, mem_usage, mem_percent, cpu_percent}], summary}`,
  about 1 Hz docker-stats style samples of the whole task container. Only `epoch` (Unix seconds) is
  used for time: `timestamp` there is naive local time (UTC-8) and would be off by 8 hours.
- `results.json` (optional): run summary; only `model` and `image` are read from it.

`convert(path)` accepts a task directory, its `tool_calls.json`, or any directory holding task
directories below it (e.g. the dataset root `<root>/<model>/<task>/`); it yields one Trace per task,
in sorted path order, with trace_id `claude-code/<model>/<task>` (`<model>` is the parent folder name).

`source`: format, dataset, path (`<model>/<task>`), origin, licence, model (results.json `model`,
else the folder name), image (the SWE-rebench image, when results.json names it). Origin and
licence are the dataset's (yunwei37/agentcgroup@5af9e7b8..., GPL-2.0) only when the dataset README
two levels up lists the task; a run of your own gets "unknown" for both (see _common.py).
`iter_results(path)` yields a Trace or a TraceError per task directory.

Tool mapping (every tool call becomes exactly one step, in order; step_id = tool-call index):

    Bash                                 -> bash   args: command, cwd, timeout_ms, background
    Read                                 -> read   args: file_path, offset, limit
    Edit, Write, MultiEdit, NotebookEdit -> edit   args: file_path (notebook_path), bytes, edits
    Grep, Glob                           -> search args: pattern, path, glob, type, output_mode, ...
    anything else (TodoWrite, Task, BashOutput, KillShell, ExitPlanMode, WebFetch, WebSearch,
    unknown names)                       -> noop   args: a few small identifying strings only

A call whose `result_preview` starts with "<tool_use_error>InputValidationError" was refused by the
agent runtime before anything ran (e.g. an Edit whose old_string is a JSON object): it becomes a
noop with `rejected: true` and its well-typed identifying args; for every other call, wrongly typed
arguments are a TraceError. `native_tool` always keeps the source's tool name. `result_preview`
is dropped (large, not needed).
Edit/Write strings are not kept either (they would make the files large): `bytes` is the UTF-8 size
of the text written (`new_string` / `content` / summed over MultiEdit `edits`, whose count is `edits`).
Bash `cwd` is always "/testbed": the source records no working directory (results.json has no
workdir field, only the host-side `output_dir`), and the SWE-rebench images the runs used keep the
repository in /testbed (commands in the traces `cd /testbed` or use /testbed paths). `timeout_ms`
comes from the Bash tool's `timeout` (Claude Code gives it in milliseconds). `background` is true
for `run_in_background` calls: the recorded duration is then only the launch, and the command's
memory shows up in the steps that follow (e.g. a BashOutput/KillShell noop).

Per step, `duration_ms` = end_timestamp - timestamp, provenance `recorded`.

Resource profile, provenance `derived`, computed from the container samples (all rules use the
samples' `epoch`; samples whose memory limit is 0, i.e. "0B / 0B" after the container stopped, are
ignored; P = the median gap between consecutive samples, 1 s when there are fewer than 2 samples;
memory is in MiB (2^20 bytes), the unit the replay allocates in; the source's "MB"/"GB" are decimal,
so "185.3MB" = 176.7 MiB and "1.862GB" = 1775.7 MiB; KiB/MiB/GiB are taken as binary):

- baseline = memory of the last sample at or before the step start (what the agent and its
  container hold before the call). If no sample precedes the start, the first sample is used when
  it lies within P after the start; otherwise the baseline is unknown.
- window = samples with start <= epoch <= end + P. The extra period is there because a sample's
  epoch is only good to about one period (each stats call takes about a second, hence the ~1.04 s
  gaps), so the sample just after a short call is the only one that can show it. If the window is
  empty (a gap in the samples), the first sample after the start is used alone. Caveat: for calls
  shorter than P this sample mostly shows the agent runtime's own memory moves (tens of MiB; in
  local/sigmavirus24__github3.py-673 the agent oscillates 256<->430 MB, giving ~160-200 MiB peaks on
  Read/Grep/Edit steps).
- peak_mb = max(window memory) - baseline, floored at 0: the memory the call added over the
  baseline. Omitted when the baseline is unknown or there is no sample at or after the start.
- ramp_ms = time from the step start to the (first) peak sample, clamped to [0, duration]; 0 when
  peak_mb is 0. Present exactly when peak_mb is.
- cpu_ms = integral over the step of cpu_percent/100: sample i's cpu_percent is taken as the
  container's CPU rate over (epoch[i-1], epoch[i]] (the first sample covers (epoch[0] - P, epoch[0]]),
  and only the overlap with [start, end] counts. If part of the step lies outside every sample
  interval, the covered part's average rate is applied to the whole step; if none of it is covered
  cpu_ms is omitted. Capped at duration x ncpus, ncpus = ceil(max cpu_percent seen in the task / 100)
  (at least 1). This is the whole container's CPU, the agent runtime included.

Kept strings follow the shared converter rules (_common.check_str): no NUL character, at most
1 MiB, no unpaired surrogate. Malformed input (truncated JSON, NUL bytes, wrong types, missing
fields, bad size or percentage strings, timestamps without a zone, end before start) raises
TraceError naming the file, the record (tool-call index, or sample index in resources.json) and the
field; no other exception type escapes. An empty tool_calls.json is an error too (a trace needs a
step). resources.json samples are sorted by epoch; an empty sample list gives steps without profile.
"""
from __future__ import annotations

import bisect
import json
import math
import re
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

from ..ir import Measure, Profile, Step, Trace, TraceError
from ._common import check_str, finish, id_part, short_path

FORMAT = "claude-code"
DATASET = "agentcgroup-claude-code"
ORIGIN = "yunwei37/agentcgroup@5af9e7b8f37a93513206c331c7ec0ff149e89f27"
LICENCE = "GPL-2.0"
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

_MIB = float(1 << 20)
#: Size units -> MiB. "MB"/"GB" are decimal (10^6/10^9 bytes): the sampler prints go-units
#: HumanSize-style decimal sizes (docker's own `docker stats` would print MiB/GiB).
_UNITS = {"B": 1 / _MIB, "kB": 1e3 / _MIB, "KB": 1e3 / _MIB, "MB": 1e6 / _MIB, "GB": 1e9 / _MIB, "TB": 1e12 / _MIB,
          "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "TiB": 1024.0 ** 2}
_NUL = b"\x00"
_REJECTED = "<tool_use_error>InputValidationError"
_MEM_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]+)\s*$")


# ---------------------------------------------------------------------------------------------
# Locating task directories

def _task_dir(path: Path) -> Path | None:
    if path.is_file() and path.name == TOOL_CALLS:
        path = path.parent
    if path.is_dir() and (path / TOOL_CALLS).is_file() and (path / RESOURCES).is_file():
        return path
    return None


def sniff(path: Path) -> bool:
    """A task directory (or its tool_calls.json) holding tool_calls.json and resources.json."""
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
        raise TraceError(f"not a claude-code task directory (needs {TOOL_CALLS} and {RESOURCES})", file=str(path))
    found = sorted({p.parent for p in path.rglob(TOOL_CALLS) if (p.parent / RESOURCES).is_file()})
    if not found:
        raise TraceError(f"no claude-code task directories (with {TOOL_CALLS} and {RESOURCES}) below",
                         file=str(path))
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
# Reading files

def _load_json(path: Path) -> Any:
    name = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror}", file=name) from None
    if b"\x00" in data:
        raise TraceError(f"contains a NUL byte at offset {data.index(_NUL)}", file=name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=name) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", file=name) from None
    except RecursionError:
        raise TraceError("invalid JSON: nested too deeply", file=name) from None


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


def parse_mem_mb(text: Any, *, file: str | None = None, record: int | None = None,
                 field: str = "mem_usage") -> tuple[float, float]:
    """`"185.3MB / 134.5GB"` -> (used, limit) in MiB: (176.71..., 128269.19...)."""
    if not isinstance(text, str):
        raise TraceError(f"expected a string like '185.3MB / 134.5GB', got {type(text).__name__}",
                         file=file, record=record, field=field)
    parts = text.split("/")
    if len(parts) != 2:
        raise TraceError(f"expected 'USED / LIMIT', got {text[:40]!r}", file=file, record=record, field=field)
    out = []
    for part in parts:
        m = _MEM_RE.match(part)
        if not m or m.group(2) not in _UNITS:
            raise TraceError(f"bad memory size {part.strip()[:20]!r} in {text[:40]!r} "
                             f"(units: {', '.join(_UNITS)})", file=file, record=record, field=field)
        val = float(m.group(1)) * _UNITS[m.group(2)]
        if not math.isfinite(val):
            raise TraceError(f"bad memory size {part.strip()[:20]!r}", file=file, record=record, field=field)
        out.append(val)
    return out[0], out[1]


def parse_cpu(value: Any, *, file: str | None = None, record: int | None = None,
              field: str = "cpu_percent") -> float:
    """`"62.21%"` (or a bare number) -> 62.21."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        num = float(value)
    elif isinstance(value, str):
        s = value.strip()
        s = s[:-1] if s.endswith("%") else s
        try:
            num = float(s)
        except ValueError:
            raise TraceError(f"expected a percentage like '62.21%', got {value[:20]!r}",
                             file=file, record=record, field=field) from None
    else:
        raise TraceError(f"expected a percentage like '62.21%', got {type(value).__name__}",
                         file=file, record=record, field=field)
    if not math.isfinite(num) or num < 0:
        raise TraceError(f"percentage must be a finite number >= 0, got {value!r}", file=file, record=record, field=field)
    return num


class Samples:
    """Container samples sorted by epoch: parallel lists t (s), mem (MB), cpu (%)."""

    def __init__(self, rows: list[tuple[float, float, float]]):
        rows = sorted(rows)
        self.t = [r[0] for r in rows]
        self.mem = [r[1] for r in rows]
        self.cpu = [r[2] for r in rows]
        gaps = [b - a for a, b in zip(self.t, self.t[1:]) if b > a]
        self.period = statistics.median(gaps) if gaps else 1.0
        self.ncpus = max(1, math.ceil(max(self.cpu, default=0.0) / 100.0 - 1e-9))

    def __len__(self) -> int:
        return len(self.t)


def read_samples(path: Path) -> Samples:
    name = str(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise TraceError(f"expected an object with 'samples', got {type(data).__name__}", file=name)
    samples = data.get("samples")
    if not isinstance(samples, list):
        raise TraceError("missing" if samples is None else f"expected a list, got {type(samples).__name__}",
                         file=name, field="samples")
    rows = []
    for i, s in enumerate(samples):
        if not isinstance(s, dict):
            raise TraceError(f"expected an object, got {type(s).__name__}", file=name, record=i)
        for key in ("epoch", "mem_usage", "cpu_percent"):
            if key not in s:
                raise TraceError("missing", file=name, record=i, field=key)
        epoch = s["epoch"]
        if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) or not math.isfinite(epoch) or epoch < 0:
            raise TraceError(f"expected Unix seconds (a number >= 0), got {epoch!r}"[:120], file=name, record=i,
                             field="epoch")
        used, limit = parse_mem_mb(s["mem_usage"], file=name, record=i)
        cpu = parse_cpu(s["cpu_percent"], file=name, record=i)
        if limit == 0:          # "0B / 0B": the container has stopped; not a measurement
            continue
        rows.append((float(epoch), used, cpu))
    return Samples(rows)


# ---------------------------------------------------------------------------------------------
# Derivation

def derive_profile(samples: Samples, start: float, end: float) -> Profile:
    """Profile of a step [start, end] (Unix seconds) from the samples; see the module docstring."""
    if not len(samples):
        return Profile()
    t, mem, cpu, period = samples.t, samples.mem, samples.cpu, samples.period
    duration_ms = (end - start) * 1000.0
    fields: dict[str, Measure] = {}

    # memory
    i_before = bisect.bisect_right(t, start) - 1            # last sample at or before start
    baseline = None
    if i_before >= 0:
        baseline = mem[i_before]
    elif t[0] - start <= period:
        baseline = mem[0]
    lo = bisect.bisect_left(t, start)
    hi = bisect.bisect_right(t, end + period)
    window = range(lo, hi)
    if not window and lo < len(t):
        window = range(lo, lo + 1)
    if baseline is not None and window:
        ipeak = max(window, key=lambda j: (mem[j], -j))
        peak = max(0.0, mem[ipeak] - baseline)
        ramp = 0.0 if peak == 0 else min(max((t[ipeak] - start) * 1000.0, 0.0), duration_ms)
        fields["peak_mb"] = Measure(round(peak, 1), "derived")
        fields["ramp_ms"] = Measure(float(round(ramp)), "derived")

    # cpu: sample j covers (t[j-1], t[j]]
    if duration_ms <= 0:
        if t[0] - period <= start <= t[-1]:
            fields["cpu_ms"] = Measure(0.0, "derived")
    else:
        total = covered = 0.0
        j = bisect.bisect_left(t, start)
        while j < len(t):
            a = t[j - 1] if j > 0 else t[0] - period
            b = t[j]
            if a >= end:
                break
            ov = min(b, end) - max(a, start)
            if ov > 0:
                covered += ov
                total += cpu[j] / 100.0 * ov
            j += 1
        if covered > 0:
            cpu_ms = total / covered * (end - start) * 1000.0
            cpu_ms = min(cpu_ms, duration_ms * samples.ncpus)
            fields["cpu_ms"] = Measure(float(round(cpu_ms)), "derived")
    return Profile(**fields)


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
            args["timeout_ms"] = timeout
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
        if native == "MultiEdit":
            edits = inp.get("edits")
            if not isinstance(edits, list):
                raise bad("edits", "list", edits)
            size = 0
            for k, e in enumerate(edits):
                ns = e.get("new_string") if isinstance(e, dict) else None
                if not isinstance(ns, str):
                    raise bad(f"edits[{k}].new_string", "str", ns)
                size += len(ns.encode("utf-8"))
            args["edits"] = len(edits)
        else:
            key = {"Write": "content", "NotebookEdit": "new_source"}.get(native, "new_string")
            if key not in inp and native != "NotebookEdit":
                raise TraceError("missing", file=file, record=record, field=f"input.{key}")
            text = inp.get(key, "")
            if not isinstance(text, str):
                raise bad(key, "str", text)
            size = len(text.encode("utf-8"))
        args["bytes"] = size
    return args


def _model_info(task: Path) -> dict[str, str]:
    path = task / RESULTS
    if not path.is_file():
        return {}
    data = _load_json(path)
    if not isinstance(data, dict):
        raise TraceError(f"expected an object, got {type(data).__name__}", file=str(path))
    out = {}
    for key in ("model", "image"):
        if key in data and data[key] is not None:
            if not isinstance(data[key], str) or not data[key].isprintable():
                raise TraceError(f"expected a printable str, got {data[key]!r}"[:120], file=str(path), field=key)
            out[key] = data[key]
    return out


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
    tc_path = task / TOOL_CALLS
    file = str(tc_path)
    calls = _load_json(tc_path)
    if not isinstance(calls, list):
        raise TraceError(f"expected a JSON array of tool calls, got {type(calls).__name__}", file=file)
    if not calls:
        raise TraceError("no tool calls: a trace needs at least one step", file=file)
    samples = read_samples(task / RESOURCES)
    info = _model_info(task)

    steps = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            raise TraceError(f"expected an object, got {type(call).__name__}", file=file, record=i)
        for key in ("timestamp", "end_timestamp", "tool", "input"):
            if key not in call:
                raise TraceError("missing", file=file, record=i, field=key)
        native = call["tool"]
        if not isinstance(native, str) or not native:
            raise TraceError(f"expected a tool name, got {native!r}"[:120], file=file, record=i, field="tool")
        inp = call["input"]
        if not isinstance(inp, dict):
            raise TraceError(f"expected an object, got {type(inp).__name__}", file=file, record=i, field="input")
        start = _epoch_of(call["timestamp"], file, i, "timestamp")
        end = _epoch_of(call["end_timestamp"], file, i, "end_timestamp")
        if end < start:
            raise TraceError(f"ends {start - end:.3f} s before it starts ({call['end_timestamp']} < {call['timestamp']})",
                             file=file, record=i, field="end_timestamp")
        tool = TOOL_MAP.get(native, "noop")
        preview = call.get("result_preview")
        if isinstance(preview, str) and preview.startswith(_REJECTED):
            # the agent runtime refused the call's arguments: nothing ran
            tool, args = "noop", {"rejected": True, **_args(native, "noop", inp, file, i, strict=False)}
        else:
            args = _args(native, tool, inp, file, i)
        try:
            json.dumps([native, args], ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise TraceError(f"contains an unpaired surrogate {exc.object[exc.start:exc.end]!r} (not writable as UTF-8)",
                             file=file, record=i, field="tool" if not native.isprintable() else "input") from None
        steps.append(Step(step_id=i, tool=tool, native_tool=native, args=args,
                          duration_ms=Measure(float(round((end - start) * 1000.0)), "recorded"),
                          profile=derive_profile(samples, start, end)))

    model_dir = id_part(task.parent.name, "unknown")
    known = _from_dataset(task)
    source = {"format": FORMAT, "dataset": DATASET if known else "AgentCgroup Claude Code run",
              "path": short_path(task), "origin": ORIGIN if known else "unknown",
              "licence": LICENCE if known else "unknown", "model": info.get("model", task.parent.name)}
    if "image" in info:
        source["image"] = info["image"]
    return finish(f"{FORMAT}/{model_dir}/{id_part(task.name, 'task')}", source, steps, {"file": file})
