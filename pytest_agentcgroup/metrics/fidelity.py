"""Fidelity of the emulator: what the kernel counted for a step's emulation against what it counted
for the real command, per step, and the gate over the compared steps. The emulation itself
runs in profile/fidelity.py (`agentcgroup traces fidelity`).

A step is compared when its trace recorded its duration and its peak (`agentcgroup traces profile`
writes such traces). With `repeat` > 1 each step's figure is the median of its repetitions (its
duration: of those no hypervisor steal disturbed, profile/fidelity.py).

Goals (GOALS): peak within ±5 % or 4 MiB (whichever is larger), duration within ±10 %, CPU within
±15 %. The gate: at least 90 % of the compared steps meet both the peak and the duration goal;
steps timed only under steal count neither way, and a verdict they could turn is not given (gate).

Where a step keeps its source's own figures (`original`, e.g. a profile derived from 1 Hz samples),
the same comparison of those against the recording says how wrong the derived profiles were; it is
reported, not gated.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..traces.ir import Step
from .records import percentile

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


def distribution(rows: list[dict], side: str) -> dict:
    """Per metric over the rows that have it: steps, p50/p90/max of |error| %, median signed error
    % (the bias) and the share of steps meeting the goal."""
    out = {}
    for metric in GOALS:
        # a duration timed only under steal is left out, as the gate leaves it out
        errs = [r[side][metric] for r in rows if metric in r.get(side, {})
                and not (metric == "duration_ms" and side == "emulated" and _stolen(r))]
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
    (checked False, passed False), rather than failed on a figure nobody measured. A step timed only
    in replays the hypervisor's steal disturbed (`duration_stolen`, its peak met) is `stolen`: it
    counts neither way, and the gate is decided only where the stolen steps cannot change the
    verdict (passed even were they all missed, failed even were they all met)."""
    def met(r, metrics):
        return all(r["emulated"].get(m, {}).get("met", False) for m in metrics)
    stolen = sum(1 for r in rows if _stolen(r) and met(r, ("peak_mb",)))
    ok = [met(r, GATED) and not _stolen(r) for r in rows]
    unmeasured = sum(1 for r in rows if not r.get("failed") and any(m not in r["emulated"] for m in GATED))
    n, need = len(ok), GATE_SHARE * len(ok)
    share = sum(ok) / n if n else 0.0
    decided = bool(ok) and not unmeasured and (sum(ok) >= need or sum(ok) + stolen < need)
    return {"steps": n, "met_both": sum(ok), "share": share, "goal_share": GATE_SHARE,
            # the share were every stolen step met: the top of the range a NOT CHECKED gate gives
            "share_max": (sum(ok) + stolen) / n if n else 0.0,
            "unmeasured": unmeasured, "stolen": stolen, "checked": decided,
            "passed": decided and sum(ok) >= need}


def _stolen(row: dict) -> bool:
    """The step's duration was timed only in replays the hypervisor's steal disturbed."""
    return bool(row.get("duration_stolen")) and not row.get("failed")


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
            if m == "duration_ms" and _stolen(r):
                continue
            rel, floor = GOALS[m]
            out = max(out, abs(e["got"] - e["recorded"]) / max(rel * e["recorded"], floor, 1e-9))
        return out
    return sorted(rows, key=badness, reverse=True)[:n]


def result(rows: list[dict], load_before, load_after, repeat: int, exit_tail_ms: float | None = None,
           host: dict | None = None) -> dict:
    """The whole comparison as one dict (`--json`); `host` holds what was measured of the host
    meanwhile (profile/fidelity.py Emulated.host(): CPU wait, steal, replays run again)."""
    return {"goals": {m: {"relative_pct": 100 * rel, "floor": floor} for m, (rel, floor) in GOALS.items()},
            "repeat": repeat, "emulator_exit_ms": exit_tail_ms, **(host or {}),
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


def contention(res: dict) -> str:
    """What was measured of the host's CPUs during the replays, in one clause."""
    wait, steal = res.get("cpu_wait_pct"), res.get("steal_pct")
    out = ["CPU wait not measured (no PSI)" if wait is None else f"some task waited for a CPU {wait:.1f}% of the time",
           "steal not measured" if steal is None else f"the hypervisor took {steal:.1f}% of the CPUs' time (steal)"]
    if res.get("disturbed"):
        kept = res["disturbed_kept"]
        out.append(f"{res['disturbed']} of {res['replays']} trace replay(s) had steal above {res['steal_limit_pct']:g}%: "
                   f"{res['disturbed'] - kept} run again" + (f", {kept} kept (the re-run budget spent)" if kept else ""))
    return "; ".join(out)


def format_report(res: dict) -> str:
    lb, la = res["load_avg_before"], res["load_avg_after"]
    out = [f"emulated vs recorded, {res['gate']['steps']} step(s), median of {res['repeat']} run(s) each "
           "(durations: of the runs no steal disturbed); "
           f"load average {lb[0]:.2f} before, {la[0]:.2f} after, on {res['cpus']} CPU(s); {contention(res)} "
           "(durations and CPU are load-sensitive)"]
    if res.get("emulator_exit_ms") is not None:
        out.append(f"the emulator's own exit and reap, {res['emulator_exit_ms']:.2f} ms measured before the replays, "
                   "end each curve step early (the recorded duration holds the real command's)")
    out += _table(res["emulated"])
    if res["gate"].get("stolen"):
        out.append(f"  ({res['gate']['stolen']} step(s) timed under steal only: their durations are not in the table)")
    if res["original"]:
        out.append("the steps' original (source-derived) figures vs recorded: how wrong the derived profiles were")
        out += _table(res["original"])
    out.append("worst emulated steps (furthest outside a goal):")
    for r in res["worst"]:
        figs = ", ".join(f"{m.removesuffix('_ms').removesuffix('_mb')} {e['recorded']:.1f}->{e['got']:.1f}"
                         + ("" if e["met"] else " MISSED") for m, e in r["emulated"].items())
        failed = f"emulation failed ({r['failed']}); " if r.get("failed") else ""
        stolen = " (duration timed under steal only: not counted)" if _stolen(r) else ""
        out.append(f"  {r['trace_id']} step {r['step_id']}: {failed}{figs}{stolen}  [{r['cmd']}]")
    g = res["gate"]
    if not g["checked"] and g.get("stolen") and not g.get("unmeasured"):
        out.append(f"gate NOT CHECKED: {g['met_both']}/{g['steps']} step(s) meet both goals and {g['stolen']} more "
                   "were timed only while the hypervisor took the CPUs (steal in every replay of their trace): "
                   f"the share is between {100 * g['share']:.0f}% and {100 * g['share_max']:.0f}%, "
                   f"the goal >= {100 * g['goal_share']:.0f}%; "
                   "durations cannot be compared with a recording made on a quiet host")
        return "\n".join(out)
    if g.get("unmeasured"):
        out.append(f"gate NOT CHECKED: {g['unmeasured']} emulated step(s) have no figure for "
                   f"{' or '.join(GATED)} here (a kernel without memory.peak: v2 5.19+); this kernel cannot be gated")
        return "\n".join(out)
    verdict = "PASSED" if g["passed"] else "FAILED"
    stolen = (f" ({g['stolen']} more timed under steal only, counted neither way: they could not turn it)"
              if g.get("stolen") else "")
    out.append(f"gate {verdict}: {g['met_both']}/{g['steps']} step(s) ({100 * g['share']:.0f}%) meet both the peak "
               f"and the duration goal{stolen}; the goal is >= {100 * g['goal_share']:.0f}%")
    return "\n".join(out)
