"""Resource-sample alignment for the Claude Code converter (claude_code.py): reading the task
container's ~1 Hz samples (resources.json, or results.json `resource_samples`), parsing their
memory and CPU strings, and deriving each step's profile from the samples around it.

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
  shorter than P this sample mostly shows the agent runtime's own memory moves, which can be far
  larger than the call's (Read/Grep/Edit steps then get peaks of their own).
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
"""
from __future__ import annotations

import bisect
import json
import math
import re
import statistics
from pathlib import Path
from typing import Any

from ..ir import Measure, Profile, TraceError

_MIB = float(1 << 20)
#: Size units -> MiB. "MB"/"GB" are decimal (10^6/10^9 bytes): the sampler prints go-units
#: HumanSize-style decimal sizes (docker's own `docker stats` would print MiB/GiB).
_UNITS = {"B": 1 / _MIB, "kB": 1e3 / _MIB, "KB": 1e3 / _MIB, "MB": 1e6 / _MIB, "GB": 1e9 / _MIB, "TB": 1e12 / _MIB,
          "KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0, "TiB": 1024.0 ** 2}
_NUL = b"\x00"
_MEM_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]+)\s*$")


def load_json(path: Path) -> Any:
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
    data = load_json(path)
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
