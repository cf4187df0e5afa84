"""Fidelity of the emulator: replay recorded steps with the `emulate` executor and compare what the
kernel counted for the emulation with what it counted for the real command.

A step is compared when its trace recorded its duration and its peak (`agentcgroup traces profile`
writes such traces). Each is emulated in a cgroup of its own (cgroups/placement.py ArmPlacement, an
unlimited arm) made ahead, with the emulator's launcher already joined to it: pool=True, the spawn
path the experiments replay through. (A spawn that joins in the forked child is slower, the more so
while the kernel tears down another run's cgroups: timed from before the spawn, the emulator would
start that much later with less of the step left.) It is
measured with the counters the recording used: the kernel's per-cgroup peak (v2 memory.peak | v1
memory.max_usage_in_bytes), the cgroup's CPU (cpu.stat usage_usec: user + system over every process
of the step) and the wall time from spawn to reap. The emulator's own exit and reap are measured
right before the replays and taken off each curve step's end (replay/executors/emulate.py: the
recorded duration holds the real command's exit). With `repeat` > 1 each step's figure is the
median of its repetitions.

Durations are only comparable on a host as idle as the recording's: beside the load average, the
report gives the share of the replays' wall time in which some task waited for a CPU (the kernel's
PSI, /proc/pressure/cpu "some", host-wide; None without PSI), so a miss under contention shows it.

Goals (GOALS): peak within ±5 % or 4 MiB (whichever is larger), duration within ±10 %, CPU within
±15 %. The gate: at least 90 % of the compared steps meet both the peak and the duration goal.

Where a step keeps its source's own figures (`original`, e.g. a profile derived from 1 Hz samples),
the same comparison of those against the recording says how wrong the derived profiles were; it is
reported, not gated.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import NamedTuple

from ..arms import Arm
from ..cgroups import RunTree, detect
from ..cgroups.placement import ArmPlacement
from ..replay import EmulateExecutor, replay
from ..replay.executors.base import DEFAULT_TIMEOUT_S
from ..replay.executors.emulate import measure_exit_tail_ms
from ..traces.ir import Step, Trace
from .records import percentile

MB = 1024 * 1024
#: metric -> (relative goal, absolute floor in the metric's unit): met when |error| <= max of the two
GOALS = {"peak_mb": (0.05, 4.0), "duration_ms": (0.10, 0.0), "cpu_ms": (0.15, 0.0)}
GATED = ("peak_mb", "duration_ms")
GATE_SHARE = 0.90
EXIT_OK, EXIT_BAD_INPUT, EXIT_GOALS_MISSED = 0, 1, 3


@dataclass(frozen=True)
class Figures:
    peak_mb: float | None
    duration_ms: float | None
    cpu_ms: float | None


def recorded(step: Step) -> Figures | None:
    """The step's recorded figures, None unless its duration and its peak were recorded."""
    p, d = step.profile, step.duration_ms
    if d is None or d.provenance != "recorded" or p.peak_mb is None or p.peak_mb.provenance != "recorded":
        return None
    cpu = p.cpu_ms.value if p.cpu_ms is not None and p.cpu_ms.provenance == "recorded" else None
    return Figures(p.peak_mb.value, d.value, cpu)


def original(step: Step) -> Figures | None:
    """What the step's source said before it was profiled (any provenance), None without it."""
    o = step.original
    if o is None:
        return None
    val = lambda m: m.value if m is not None else None      # noqa: E731
    figs = Figures(val(o.profile.peak_mb), val(o.duration_ms), val(o.profile.cpu_ms))
    return figs if any(v is not None for v in (figs.peak_mb, figs.duration_ms, figs.cpu_ms)) else None


def errors(want: Figures, got: Figures) -> dict:
    """Per metric: the recorded and the compared figure, the error (relative to the recorded one)
    and whether it meets its goal; a metric either side lacks is left out."""
    out = {}
    for metric, (rel, floor) in GOALS.items():
        w, g = getattr(want, metric), getattr(got, metric)
        if w is None or g is None:
            continue
        diff = g - w
        out[metric] = {"recorded": w, "got": g, "error_pct": 100.0 * diff / w if w > 0 else None,
                       "met": abs(diff) <= max(rel * w, floor)}
    return out


class Emulated(NamedTuple):
    rows: list[dict]                # one per compared step
    exit_tail_ms: float             # the emulator's exit and reap, taken off each curve step's end
    cpu_wait_pct: float | None      # share of the replays' wall time some task waited for a CPU


def cpu_wait_us() -> int | None:
    """The kernel's running total of time (us) in which some task waited for a CPU, host-wide
    (/proc/pressure/cpu "some"); None without PSI (CONFIG_PSI off, or psi=0 on the command line)."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
        return int(some[-1].removeprefix("total=")) if some and some[0] == "some" else None
    except (OSError, ValueError, IndexError):
        return None


def emulate(traces: list[Trace], *, repeat: int = 1, on_step=None) -> Emulated:
    """Emulate every recorded step `repeat` times in a cgroup of its own: one row per step, the
    emulator's exit and reap (ms, measured first) taken off each curve step's end, and how much of
    the time the host's CPUs were contended meanwhile."""
    tree = RunTree(detect())        # no cgroups: said before the emulator is built and probed
    rows = []
    try:
        tail_ms = measure_exit_tail_ms()
        wait0, t0 = cpu_wait_us(), time.monotonic()
        for trace in traces:
            steps = tuple(s for s in trace.steps if recorded(s) is not None)
            if not steps:
                continue
            runs = []
            # a long recorded step is not cut at the executor's default timeout (a recorded
            # timeout_ms still applies, as it did to the real command)
            timeout_s = max(DEFAULT_TIMEOUT_S, 2 * max(s.duration_ms.value for s in steps) / 1000.0 + 10.0)
            for i in range(repeat):
                work = tree.workload(f"fidelity-{i}")
                runs.append(replay(Trace(trace.trace_id, trace.source, steps),
                                   EmulateExecutor(time_scale=1.0, step_timeout_s=timeout_s, exit_tail_ms=tail_ms),
                                   # pooled, as the experiments replay: the joins are off the step's clock
                                   ArmPlacement(Arm("unlimited"), work, tree.controllers, pool=True)))
            for k, step in enumerate(steps):
                rows.append(_row(trace, step, [r[k] for r in runs]))
                if on_step:
                    on_step(rows[-1])
        wait1, t1 = cpu_wait_us(), time.monotonic()
    finally:
        tree.close()
    waited = (100.0 * (wait1 - wait0) / ((t1 - t0) * 1e6) if wait0 is not None and wait1 is not None and t1 > t0
              else None)
    return Emulated(rows, tail_ms, waited)


def _row(trace: Trace, step: Step, results) -> dict:
    failed = [r for r in results if not r.executed or r.exit_code != 0 or r.timed_out]
    row = {"trace_id": trace.trace_id, "step_id": step.step_id, "cmd": " ".join((step.command or "").split())[:80],
           "repeats": len(results)}
    if failed:                  # the emulator is ours: a failed emulation meets no goal
        r = failed[0]
        row["failed"] = r.error or ("timed out" if r.timed_out else f"exit {r.exit_code}, signal {r.signal}")
    med = lambda xs: statistics.median(xs) if xs and None not in xs else None      # noqa: E731
    got = Figures(med([r.counters.get("peak_bytes") for r in results if r.executed]) / MB
                  if all(r.executed and r.counters.get("peak_bytes") is not None for r in results) else None,
                  med([r.latency_ms for r in results if r.executed]),
                  # cpu.stat not read (None) is no CPU figure, not a CPU miss blamed on the emulator
                  med([r.counters["cpu_usec"] / 1000.0 if r.counters.get("cpu_usec") is not None else None
                       for r in results if r.executed]))
    want = recorded(step)
    row["emulated"] = errors(want, got)
    if failed:
        for e in row["emulated"].values():
            e["met"] = False
    orig = original(step)
    if orig is not None:
        row["original"] = errors(want, orig)
    return row


def distribution(rows: list[dict], side: str) -> dict:
    """Per metric over the rows that have it: steps, p50/p90/max of |error| %, median signed error
    % (the bias) and the share of steps meeting the goal."""
    out = {}
    for metric in GOALS:
        errs = [r[side][metric] for r in rows if metric in r.get(side, {})]
        if not errs:
            continue
        absolute = [abs(e["error_pct"]) for e in errs if e["error_pct"] is not None]
        out[metric] = {"steps": len(errs), "p50_abs_pct": percentile(absolute, 50),
                       "p90_abs_pct": percentile(absolute, 90), "max_abs_pct": max(absolute, default=None),
                       "bias_pct": percentile([e["error_pct"] for e in errs if e["error_pct"] is not None], 50),
                       "met_share": sum(e["met"] for e in errs) / len(errs)}
    return out


def gate(rows: list[dict]) -> dict:
    """The share of steps meeting both gated goals. A step whose emulation ran but has no figure for
    a gated metric (a kernel without memory.peak) is `unmeasured`: then the gate cannot be decided
    (checked False, passed False), rather than failed on a figure nobody measured."""
    ok = [all(r["emulated"].get(m, {}).get("met", False) for m in GATED) for r in rows]
    unmeasured = sum(1 for r in rows if not r.get("failed") and any(m not in r["emulated"] for m in GATED))
    share = sum(ok) / len(ok) if ok else 0.0
    return {"steps": len(ok), "met_both": sum(ok), "share": share, "goal_share": GATE_SHARE,
            "unmeasured": unmeasured, "checked": bool(ok) and not unmeasured,
            "passed": bool(ok) and not unmeasured and share >= GATE_SHARE}


def exit_code(res: dict, unreadable: int) -> int:
    """0 the gate passed; 3 it failed; 1 input was unreadable or the gate could not be checked."""
    if unreadable or not res["gate"]["checked"]:
        return EXIT_BAD_INPUT
    return EXIT_OK if res["gate"]["passed"] else EXIT_GOALS_MISSED


def worst(rows: list[dict], n: int = 5) -> list[dict]:
    """The n steps furthest outside their goals (error / goal, largest first)."""
    def badness(r):
        if r.get("failed"):
            return float("inf")
        out = 0.0
        for m, e in r["emulated"].items():
            rel, floor = GOALS[m]
            out = max(out, abs(e["got"] - e["recorded"]) / max(rel * e["recorded"], floor, 1e-9))
        return out
    return sorted(rows, key=badness, reverse=True)[:n]


def result(rows: list[dict], load_before, load_after, repeat: int, exit_tail_ms: float | None = None,
           cpu_wait_pct: float | None = None) -> dict:
    return {"goals": {m: {"relative_pct": 100 * rel, "floor": floor} for m, (rel, floor) in GOALS.items()},
            "repeat": repeat, "emulator_exit_ms": exit_tail_ms, "cpu_wait_pct": cpu_wait_pct,
            "load_avg_before": list(load_before), "load_avg_after": list(load_after),
            "cpus": os.cpu_count(), "emulated": distribution(rows, "emulated"),
            "original": distribution(rows, "original"), "gate": gate(rows), "worst": worst(rows), "steps": rows}


def _table(dist: dict) -> list[str]:
    fmt = lambda v: "-" if v is None else f"{v:.1f}"      # noqa: E731
    lines = [f"  {'metric':<12}{'steps':>6}{'p50 |err|%':>12}{'p90 |err|%':>12}{'max |err|%':>12}{'bias %':>9}"
             f"{'met goal':>10}"]
    for m, d in dist.items():
        rel, floor = GOALS[m]
        goal = f"±{100 * rel:.0f}%" + (f" or {floor:g} MiB" if floor else "")
        lines.append(f"  {m:<12}{d['steps']:>6}{fmt(d['p50_abs_pct']):>12}{fmt(d['p90_abs_pct']):>12}"
                     f"{fmt(d['max_abs_pct']):>12}{fmt(d['bias_pct']):>9}{100 * d['met_share']:>9.0f}%  ({goal})")
    return lines


def format_report(res: dict) -> str:
    lb, la = res["load_avg_before"], res["load_avg_after"]
    wait = res.get("cpu_wait_pct")
    contended = ("CPU contention not measured" if wait is None else
                 f"some task waited for a CPU {wait:.1f}% of the time")
    out = [f"emulated vs recorded, {res['gate']['steps']} step(s), median of {res['repeat']} run(s) each; "
           f"load average {lb[0]:.2f} before, {la[0]:.2f} after, on {res['cpus']} CPU(s); {contended} "
           "(durations and CPU are load-sensitive)"]
    if res.get("emulator_exit_ms") is not None:
        out.append(f"the emulator's own exit and reap, {res['emulator_exit_ms']:.2f} ms measured before the replays, "
                   "end each curve step early (the recorded duration holds the real command's)")
    out += _table(res["emulated"])
    if res["original"]:
        out.append("the steps' original (source-derived) figures vs recorded: how wrong the derived profiles were")
        out += _table(res["original"])
    out.append("worst emulated steps (furthest outside a goal):")
    for r in res["worst"]:
        figs = ", ".join(f"{m.removesuffix('_ms').removesuffix('_mb')} {e['recorded']:.1f}->{e['got']:.1f}"
                         + ("" if e["met"] else " MISSED") for m, e in r["emulated"].items())
        failed = f"emulation failed ({r['failed']}); " if r.get("failed") else ""
        out.append(f"  {r['trace_id']} step {r['step_id']}: {failed}{figs}  [{r['cmd']}]")
    g = res["gate"]
    if g.get("unmeasured"):
        out.append(f"gate NOT CHECKED: {g['unmeasured']} emulated step(s) have no figure for "
                   f"{' or '.join(GATED)} here (a kernel without memory.peak: v2 5.19+); this kernel cannot be gated")
        return "\n".join(out)
    verdict = "PASSED" if g["passed"] else "FAILED"
    out.append(f"gate {verdict}: {g['met_both']}/{g['steps']} step(s) ({100 * g['share']:.0f}%) meet both the peak "
               f"and the duration goal; the goal is >= {100 * g['goal_share']:.0f}%")
    return "\n".join(out)
