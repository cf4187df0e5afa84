"""Run-vs-run comparison: do two results directories agree, test by test (trace × arm × seed ×
params), within a tolerance per metric? The reproducibility check of a seed: run twice, compare.

A tolerance allows |B − A| ≤ max(absolute, relative × |A|), in the metric's unit. Which side of a
difference is worse follows the metric's direction (METRICS: lower is better for latency, memory
and every kernel counter); a metric without a direction (steps) is only "changed". By default any
difference beyond tolerance counts (a reproducibility check); `only_worse` counts only those in the
worse direction (a regression check). A test present in one directory only always counts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .frames import COLUMNS, TEST_KEY, TEST_METRICS, ResultsError, load

KEY = [k for k in TEST_KEY if k != "run"]


@dataclass(frozen=True)
class Tolerance:
    absolute: float = 0.0
    relative: float = 0.0          # a fraction of |A|: 0.5 = 50 %

    def allowed(self, a: float) -> float:
        return max(self.absolute, self.relative * abs(a))

    def __str__(self) -> str:
        terms = ([f"{self.relative * 100:g}%"] if self.relative else []) + \
                ([f"{self.absolute:g}"] if self.absolute or not self.relative else [])
        return ",".join(terms)

    @classmethod
    def parse(cls, spec: str) -> "Tolerance":
        """`N` (absolute, in the metric's unit), `N%` (relative to A), or both: `50%,100`."""
        absolute = relative = 0.0
        for term in (t.strip() for t in spec.split(",")):
            m = re.fullmatch(r"(\d+(?:\.\d+)?)(%?)", term)
            if not m:
                raise ValueError(f"tolerance {spec!r}: expected N, N% or N%,M (non-negative numbers)")
            if m.group(2):
                relative = float(m.group(1)) / 100
            else:
                absolute = float(m.group(1))
        return cls(absolute, relative)


#: Defaults for two runs on one machine. Counts of what the kernel did are exact for the emulator's
#: deterministic profiles — except limit hits (v1 memory.failcnt, v2 `max` events), which count
#: reclaim attempts and so vary with timing: two smoke runs here counted 73 vs 154 and 124 vs 78 on
#: one trace. Latency and CPU time vary with machine load: on a shared 2-core machine, a trace's p95
#: went from 91 to 262 ms between two runs. What a policy arm's controller did (throttles at memcg
#: reclaim, freezes after repeated throttles) and forks refused at pids.max (a fork loop's attempts
#: until it is stopped) follow timing the same way as limit hits (set from the mechanism, not
#: measured twice yet); a controller kill is an outcome, exact like an OOM kill.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "total_steps": Tolerance(0), "executed_steps": Tolerance(0), "failed_steps": Tolerance(0),
    "oom_kills": Tolerance(0), "timeouts": Tolerance(0),
    # soft-limit breaches: v1 counts upward crossings (a few, exact), v2 every reclaim above
    # memory.high (hundreds, timing-dependent); the steps that breached are the same on both
    "mem_high_events_total": Tolerance(50, 2.0), "mem_high_steps": Tolerance(1),
    "mem_max_events_total": Tolerance(50, 2.0),
    "peak_rss_mb": Tolerance(8, 0.10),
    "latency_p50_ms": Tolerance(100, 1.0),
    "latency_p95_ms": Tolerance(250, 1.0),
    "cpu_total_ms": Tolerance(500, 1.0),
    "throttles_total": Tolerance(5, 1.0), "freezes_total": Tolerance(2, 1.0), "policy_kills_total": Tolerance(0),
    "pids_max_events_total": Tolerance(50, 2.0),
}


@dataclass(frozen=True)
class Difference:
    key: dict                      # experiment, trace_id, config, seed, params
    metric: str                    # a metric name, or "test" for a test missing on one side
    a: float | None
    b: float | None
    allowed: float | None
    verdict: str                   # worse | better | changed | only in A | only in B
    beyond: bool                   # outside the tolerance (and counted)

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a


@dataclass
class Comparison:
    a: Path
    b: Path
    tolerances: dict[str, Tolerance]
    tests: int = 0                                     # tests present on both sides
    differences: list[Difference] = field(default_factory=list)

    @property
    def beyond(self) -> list[Difference]:
        return [d for d in self.differences if d.beyond]

    def format(self, show_all: bool = False) -> str:
        rows = [d for d in self.differences if show_all or d.beyond]
        heads = ["experiment", "trace", "arm", "seed", "params", "metric", "A", "B", "Δ", "allowed", "verdict"]
        cells = [[d.key["experiment"], d.key["trace_id"], d.key["config"], str(d.key["seed"]), d.key["params"] or "-",
                  d.metric + (f" ({COLUMNS[d.metric].unit}, {COLUMNS[d.metric].provenance})" if d.metric in COLUMNS else ""),
                  _num(d.a), _num(d.b), _num(d.delta, sign=True), _num(d.allowed, prefix="±"),
                  d.verdict + ("" if d.beyond else " (within)")] for d in rows]
        lines = [f"A = {self.a}", f"B = {self.b}"]
        if cells:
            widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
            lines += ["  ".join(h.ljust(w) for h, w in zip(heads, widths)),
                      "  ".join("-" * w for w in widths),
                      *("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells)]
        within = len(self.differences) - len(self.beyond)
        lines.append(f"{self.tests} test(s) in both; {len(self.beyond)} difference(s) beyond tolerance"
                     + (f", {within} within" if within else "")
                     + "; tolerances: " + ", ".join(f"{k}={v}" for k, v in self.tolerances.items()))
        return "\n".join(lines)


def _num(x, sign: bool = False, prefix: str = "") -> str:
    if x is None:
        return "-"
    s = f"{x:+.3g}" if sign else f"{x:.6g}"
    return prefix + s


def compare(a: str | Path, b: str | Path, tolerances: dict[str, Tolerance] | None = None,
            only_worse: bool = False) -> Comparison:
    """Compare results directory B against A, test by test; raises ResultsError on unreadable input."""
    tol = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    for m in tol:
        if m not in TEST_METRICS:
            raise ValueError(f"no per-test metric {m!r} to compare (metrics: {', '.join(TEST_METRICS)})")
    rows = {}
    for side, d in (("A", a), ("B", b)):
        df = load(d).tests
        rows[side] = {tuple(r[k] for k in KEY): r for r in df.to_dict("records")}
        if not rows[side]:
            raise ResultsError(f"{d}: no step records")
    out = Comparison(Path(a), Path(b), tol)
    for key in list(rows["A"]) + [k for k in rows["B"] if k not in rows["A"]]:
        ra, rb = rows["A"].get(key), rows["B"].get(key)
        kd = dict(zip(KEY, key))
        if ra is None or rb is None:
            out.differences.append(Difference(kd, "test", None, None, None,
                                              "only in A" if rb is None else "only in B", True))
            continue
        out.tests += 1
        for metric, t in tol.items():
            va, vb = _value(ra.get(metric)), _value(rb.get(metric))
            if va == vb:
                continue
            if va is None or vb is None:
                out.differences.append(Difference(kd, metric, va, vb, None, "changed", True))
                continue
            better = COLUMNS[metric].better
            verdict = "changed" if better == "none" else (
                "worse" if (vb > va) == (better == "lower") else "better")
            allowed = t.allowed(va)
            beyond = abs(vb - va) > allowed + 1e-9 and not (only_worse and verdict == "better")
            out.differences.append(Difference(kd, metric, va, vb, allowed, verdict, beyond))
    return out


def _value(x):
    return None if x is None or x != x else float(x)
