"""What 1 Hz sampling hid: each step's profile derived from whole-container samples (about 1 Hz,
the `original` a profiled trace keeps) against the one `agentcgroup traces profile` recorded for
the same command here (its own cgroup, sampled every few ms, the kernel's peak).

    agentcgroup traces sampling [--json] [--missed-mb N] PATHS...

Per executed step that has both (a command the profiling run ran, and an original profile derived
from samples):

* peak: recorded `peak_mb` (the kernel's peak of the step's cgroup: its processes' total) against
  derived `peak_mb` (the container's highest sample during the step, over the sample before it);
* duration: the profiling run's against the trajectory's own (both `recorded`: there and here);
* CPU: recorded `cpu_ms` (the cgroup's user+sys) against derived (the container's CPU share over
  the step's samples);
* for each, P50/P95/max of both sides, and of the ratio recorded/derived where derived > 0;
* missed: steps whose derived peak is under MISSED_BELOW_MB (no sample saw them) while the
  recorded one is at least `missed_mb` — the bursts 1 Hz did not see at all.

What a difference means is limited by where the command ran: here, in a workspace built from PyPI,
not in the task's image, so the same command but not always the same work. Figures are given for
every compared step and for those whose profiling run ended ok (`outcome`), beside the count.
"""
from __future__ import annotations

from typing import Any, Iterable

from .classify import step_kind
from .ir import Trace
from .stats import dist, quantile

MISSED_BELOW_MB = 1.0
MISSED_MB = 50.0
METRICS = (("peak", "MiB"), ("duration", "ms"), ("cpu", "ms"))


def _pair(step, metric: str) -> tuple[float, float] | None:
    """(recorded, derived) of a step for `metric`, or None where either side is missing."""
    prof, orig = step.profile, step.original
    if metric == "duration":
        rec, der = step.duration_ms, orig.duration_ms
    else:
        key = "peak_mb" if metric == "peak" else "cpu_ms"
        rec, der = getattr(prof, key), getattr(orig.profile, key)
    if rec is None or der is None or rec.provenance != "recorded":
        return None
    return float(rec.value), float(der.value)


def _summary(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    ratios = [r / d for r, d in pairs if d > 0]
    return {"steps": len(pairs), "recorded": dist([r for r, _ in pairs]), "derived": dist([d for _, d in pairs]),
            "ratio": {q: (float(f"{v:.3g}") if (v := quantile(ratios, p)) is not None else None)
                      for q, p in (("p5", 0.05), ("p50", 0.5), ("p95", 0.95))} | {"steps": len(ratios)},
            "recorded_higher": sum(r > d for r, d in pairs)}


def peaks(traces: Iterable[Trace]) -> list[tuple[float, float, str]]:
    """(recorded, derived, the step's kind) of every compared step's peak: the figure's points."""
    return [(*pair, step_kind(s)) for t in traces for s in t.steps
            if s.outcome is not None and s.original is not None and (pair := _pair(s, "peak"))]


def compare(traces: Iterable[Trace], *, missed_mb: float = MISSED_MB) -> dict[str, Any]:
    """The comparison (module docstring) over the steps of `traces` that carry both profiles."""
    steps = [(t.trace_id, s) for t in traces for s in t.steps if s.outcome is not None and s.original is not None
             and _pair(s, "peak") is not None]
    out: dict[str, Any] = {"traces": len({tid for tid, _ in steps}), "steps": len(steps),
                           "steps_ok": sum(s.outcome.status == "ok" for _, s in steps), "missed_mb": missed_mb}
    for metric, unit in METRICS:
        every = [p for _, s in steps if (p := _pair(s, metric))]
        ok = [p for _, s in steps if s.outcome.status == "ok" and (p := _pair(s, metric))]
        out[metric] = {"unit": unit, "all": _summary(every), "ok": _summary(ok)}
    missed = []
    for tid, s in steps:
        pair = _pair(s, "peak")
        if pair and pair[1] < MISSED_BELOW_MB and pair[0] >= missed_mb:
            missed.append({"trace_id": tid, "step_id": s.step_id, "kind": step_kind(s), "outcome": s.outcome.status,
                           "recorded_mb": round(pair[0], 1), "derived_mb": round(pair[1], 1),
                           "command": " ".join((s.command or "").split())[:120]})
    out["missed"] = sorted(missed, key=lambda m: -m["recorded_mb"])
    return out


def format_table(res: dict[str, Any], *, show: int = 10) -> str:
    def d3(x):
        return " / ".join("-" if x[k] is None else f"{x[k]:g}" for k in ("p50", "p95", "max"))
    lines = [f"{res['steps']} executed steps of {res['traces']} traces with a derived (1 Hz) and a recorded profile "
             f"({res['steps_ok']} ended ok here)", "",
             f"{'metric':<12} {'steps':<6} {'recorded P50 / P95 / max':<28} {'derived P50 / P95 / max':<28} "
             f"{'recorded/derived P5 / P50 / P95':<32} recorded higher"]
    for metric, unit in METRICS:
        for which in ("all", "ok"):
            x = res[metric][which]
            ratio = " / ".join("-" if x["ratio"][k] is None else f"{x['ratio'][k]:g}x" for k in ("p5", "p50", "p95"))
            label = f"{metric} {unit}" if which == "all" else "  ended ok"
            lines.append(f"{label:<12} {x['steps']:<6} {d3(x['recorded']):<28} {d3(x['derived']):<28} {ratio:<32} "
                         f"{x['recorded_higher']}")
    missed = res["missed"]
    lines += ["", f"missed by 1 Hz: {len(missed)} steps with a derived peak under {MISSED_BELOW_MB:g} MiB and a "
                  f"recorded one of {res['missed_mb']:g} MiB or more"]
    lines += [f"  {m['recorded_mb']:>8.1f} MiB  {m['trace_id']} step {m['step_id']} ({m['kind']}, {m['outcome']}): "
              f"{m['command']}" for m in missed[:show]]
    if len(missed) > show:
        lines.append(f"  ... {len(missed) - show} more (--json lists them all)")
    lines += ["", "recorded: here, the step's own cgroup, the kernel's peak; derived: the trajectory's container, "
                  "~1 Hz samples, over the step's baseline (duration: the trajectory's own, recorded there). The "
                  "commands ran here in workspaces built from PyPI, not the tasks' images: the same command, not "
                  "always the same work."]
    return "\n".join(lines)
