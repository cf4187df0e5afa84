"""Converter for AgentCgroup's Claude Code runs (`agentcgroup-claude-code`).

Input layout (one *task directory* per agent run, as in yunwei37/agentcgroup
`experiments/all_images_<model>/<task>/attempt_1/`, copied to `<root>/<model>/<task>/`):

- `tool_calls.json`: JSON array of tool calls, each `{timestamp, end_timestamp, tool, id, input,
  result_preview}`; timestamps are ISO-8601 UTC with `Z`.
- `resources.json`: `{samples: [{epoch, timestamp, mem_usage, mem_percent, cpu_percent}], summary}`,
  about 1 Hz docker-stats style samples of the whole task container. Only `epoch` (Unix seconds) is
  used for time: `timestamp` there is naive local time (UTC-8) and would be off by 8 hours.
- `results.json` (optional): run summary; `model`, `image` and `claude_time` (-> `source.agent_time_s`,
  recorded) are read from it, and, when the other files are missing, `resource_samples` (upstream: an
  identical copy of resources.json, `{samples, summary}`; a bare sample list is read too) and
  `traces.tool_calls` (an identical copy of tool_calls.json).

Layouts that convert: tool_calls.json + resources.json (the shipped dataset); tool_calls.json +
results.json (samples from resource_samples); results.json alone (tool calls and samples from it);
tool_calls.json alone (its content must look like a tool-call array: timed steps, no profile, and
`source.profile_note` says why). A tool call without `end_timestamp` (or with null) has no duration
and no profile. When there are samples, `source.container` summarises them (see container_summary).

`convert(path)` accepts a task directory, its `tool_calls.json` (or `results.json` when there is no
tool_calls.json), or any directory holding task
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
    """The samples of a resources.json (`{samples: [...], summary}`)."""
    name = str(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise TraceError(f"expected an object with 'samples', got {type(data).__name__}", file=name)
    return parse_samples(data.get("samples"), name, "samples")


def parse_samples(samples: Any, name: str, field: str) -> Samples:
    """Samples from a decoded sample list; `field` is where that list sits in file `name`."""
    if not isinstance(samples, list):
        raise TraceError("missing" if samples is None else f"expected a list, got {type(samples).__name__}",
                         file=name, field=field)
    rows = []
    prefix = "" if field == "samples" else f"{field}[{{}}]."
    for i, s in enumerate(samples):
        record, pre = (i, "") if not prefix else (None, prefix.format(i))
        if not isinstance(s, dict):
            raise TraceError(f"expected an object, got {type(s).__name__}", file=name, record=record,
                             field=pre.rstrip(".") or None)
        for key in ("epoch", "mem_usage", "cpu_percent"):
            if key not in s:
                raise TraceError("missing", file=name, record=record, field=pre + key)
        epoch = s["epoch"]
        if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) or not math.isfinite(epoch) or epoch < 0:
            raise TraceError(f"expected Unix seconds (a number >= 0), got {epoch!r}"[:120], file=name, record=record,
                             field=pre + "epoch")
        used, limit = parse_mem_mb(s["mem_usage"], file=name, record=record, field=pre + "mem_usage")
        cpu = parse_cpu(s["cpu_percent"], file=name, record=record, field=pre + "cpu_percent")
        if limit == 0:          # "0B / 0B": the container has stopped; not a measurement
            continue
        rows.append((float(epoch), used, cpu))
    return Samples(rows)


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list (numpy's default rule)."""
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


#: A sample counts as "at the peak" when it is within this fraction of the task's maximum memory.
NEAR_PEAK = 0.9


def container_summary(samples: Samples, origin: str, baselines: list[float | None]) -> dict[str, Any]:
    """What the whole-container samples say about the run, for `traces characterize` (the per-step
    profile only keeps deltas over each step's baseline). All values `derived` from the samples:
    absolute memory in MiB (min, sample mean, max), the share of samples at >= NEAR_PEAK x max,
    memory change rates |dmem/dt| between consecutive samples (MiB/s: P50, P95, max), the sample mean
    and max of cpu_percent (100 = one core), and per step the baseline memory its peak_mb is over."""
    t, mem, cpu = samples.t, samples.mem, samples.cpu
    rates = [abs(b - a) / (tb - ta) for a, b, ta, tb in zip(mem, mem[1:], t, t[1:]) if tb > ta]
    top = max(mem)
    return {
        "provenance": "derived", "from": origin, "samples": len(t), "period_s": round(samples.period, 3),
        "seconds": round(t[-1] - t[0], 3),
        "mem_mb_min": round(min(mem), 1), "mem_mb_mean": round(statistics.fmean(mem), 1), "mem_mb_max": round(top, 1),
        "near_peak_share": round(sum(m >= NEAR_PEAK * top for m in mem) / len(mem), 4),
        "mem_rate_mb_s_p50": round(_quantile(rates, 0.5), 2) if rates else None,
        "mem_rate_mb_s_p95": round(_quantile(rates, 0.95), 2) if rates else None,
        "mem_rate_mb_s_max": round(max(rates), 2) if rates else None,
        "cpu_percent_mean": round(statistics.fmean(cpu), 2), "cpu_percent_max": round(max(cpu), 2),
        "step_baseline_mb": [None if b is None else round(b, 1) for b in baselines],
    }


# ---------------------------------------------------------------------------------------------
# Derivation

def step_baseline(samples: Samples, start: float) -> float | None:
    """Container memory before a step starting at `start` (the baseline its peak_mb is over)."""
    if not len(samples):
        return None
    i_before = bisect.bisect_right(samples.t, start) - 1
    if i_before >= 0:
        return samples.mem[i_before]
    return samples.mem[0] if samples.t[0] - start <= samples.period else None


def derive_profile(samples: Samples, start: float, end: float) -> Profile:
    """Profile of a step [start, end] (Unix seconds) from the samples; see the module docstring."""
    if not len(samples):
        return Profile()
    t, mem, cpu, period = samples.t, samples.mem, samples.cpu, samples.period
    duration_ms = (end - start) * 1000.0
    fields: dict[str, Measure] = {}

    # memory
    baseline = step_baseline(samples, start)
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


def _load_results(task: Path) -> dict | None:
    path = task / RESULTS
    if not path.is_file():
        return None
    data = _load_json(path)
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
        return _load_json(tc_path), str(tc_path), ""
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
                          profile=profile))

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
