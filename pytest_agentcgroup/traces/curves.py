"""The AgentCgroup paper's whole-run figures, recomputed from recorded step curves.

A profiled step (`agentcgroup traces profile`) keeps the memory curve of its own cgroup, sampled
every few ms, from its start to its end. The figures below are taken over *tool time*: the steps'
curves one after the other, each over its recorded duration (the last sample held to the end).
Between tool calls no command runs, so the tools' own memory is zero there; where a trace says how
long the whole agent run took (`source.agent_time_s`), the shares are also given over that time.

What they measure, per trace with at least one recorded curve:

* peak-to-average: the largest recorded point / the time-weighted mean over tool time;
* time near the peak: the share of tool time at >= 90 % of that trace's largest point;
* seconds changing by > 100 MiB, two ways: `ticks`, the curve read once a second from each step's
  start (as a 1 Hz sampler reads it) and a second counted when consecutive readings differ by more
  than CHANGE_MB; `within`, a second counted when the curve's range inside it (max - min) exceeds
  CHANGE_MB, which a 1 Hz sampler cannot see. A step's last, partial second is a window that
  counts by its length (a 200 ms window changing counts 0.2 s); the share is the seconds counted
  over the tool time. Over the agent run, both are pooled over the traces that say its length.
* bursts over BURST_MB: the steps whose recorded peak exceeds it, and how many of those the
  trajectory's own 1 Hz figures (`original`) also put above it.

Every figure is `derived` (computed from the recorded curves). The paper's are over the whole
container (the agent runtime's memory included) from ~1 Hz samples; the differences are said where
they are printed (characterize.RECORDED_DIFFERENCES).
"""
from __future__ import annotations

import math
from typing import Any, Iterable

from .ir import Trace
from .stats import dist

CHANGE_MB = 100.0
BURST_MB = 300.0
NEAR_PEAK = 0.9


def _points(step) -> list[tuple[float, float]]:
    """(t_ms, MiB) of a step's recorded curve over [0, its recorded duration]: the first sample's
    value from 0 (the sampler starts a few ms in), the last one held to the end, cut at the end."""
    c = step.profile.curve
    pts = list(zip(c.t_ms, c.mb))
    end = step.duration_ms.value if step.duration_ms else pts[-1][0]
    if pts[0][0] > 0:
        pts.insert(0, (0.0, pts[0][1]))
    if end < pts[-1][0]:
        kept = [p for p in pts if p[0] <= end]
        pts = kept + ([(end, _at(pts, end))] if kept[-1][0] < end else [])
    elif end > pts[-1][0]:
        pts.append((end, pts[-1][1]))
    return pts


def _at(pts: list[tuple[float, float]], t: float) -> float:
    """The curve at time t (linear between samples; before the first sample, its value)."""
    if t <= pts[0][0]:
        return pts[0][1]
    for (t0, m0), (t1, m1) in zip(pts, pts[1:]):
        if t <= t1:
            return m0 if t1 == t0 else m0 + (m1 - m0) * (t - t0) / (t1 - t0)
    return pts[-1][1]


def _seconds(pts: list[tuple[float, float]]) -> tuple[float, float]:
    """Seconds (a partial window by its length) whose readings at both ends differ by > CHANGE_MB,
    and seconds whose range exceeds it."""
    end = pts[-1][0]
    ticks = within = 0.0
    for i in range(max(1, math.ceil(end / 1000.0))):
        a, b = i * 1000.0, min((i + 1) * 1000.0, end)
        if abs(_at(pts, b) - _at(pts, a)) > CHANGE_MB:
            ticks += (b - a) / 1000.0
        inside = [m for t, m in pts if a <= t <= b] + [_at(pts, a), _at(pts, b)]
        if max(inside) - min(inside) > CHANGE_MB:
            within += (b - a) / 1000.0
    return ticks, within


def _area_and_near(pts: list[tuple[float, float]], level: float) -> tuple[float, float]:
    """(∫ MiB dt, time at or above `level`), in MiB·ms and ms, over linear segments."""
    area = near = 0.0
    for (t0, m0), (t1, m1) in zip(pts, pts[1:]):
        dt = t1 - t0
        area += (m0 + m1) / 2 * dt
        if m0 >= level and m1 >= level:
            near += dt
        elif (m0 >= level) != (m1 >= level) and m1 != m0:
            frac = (level - m0) / (m1 - m0)          # where the segment crosses the level
            near += dt * (1 - frac) if m1 >= level else dt * frac
    return area, near


def recorded_figures(traces: Iterable[Trace]) -> dict[str, Any] | None:
    """The figures of the module docstring over the traces' recorded curves; None without any."""
    p2a, near_share, pooled = [], [], {"seconds": 0.0, "ticks": 0.0, "within": 0.0, "agent_seconds": 0.0,
                                       "agent_ticks": 0.0, "agent_within": 0.0, "agent_traces": 0}
    per_trace_ticks, per_trace_within = [], []
    bursts, bursts_seen, curves, n = 0, 0, 0, 0
    for t in traces:
        steps = [s for s in t.steps if s.profile.curve is not None and s.profile.curve.provenance == "recorded"
                 and len(s.profile.curve.t_ms) >= 1]
        if not steps:
            continue
        n += 1
        curves += len(steps)
        every = [_points(s) for s in steps]
        top = max(m for pts in every for _, m in pts)
        area = near = span = 0.0
        ticks = within = 0.0
        for s, pts in zip(steps, every):
            a, nr = _area_and_near(pts, NEAR_PEAK * top) if top > 0 else (0.0, 0.0)
            area, near, span = area + a, near + nr, span + pts[-1][0]
            c, w = _seconds(pts)
            ticks, within = ticks + c, within + w
            peak = s.profile.peak_mb.value if s.profile.peak_mb else max(m for _, m in pts)
            if peak > BURST_MB:
                bursts += 1
                orig = s.original.profile.peak_mb if s.original and s.original.profile else None
                bursts_seen += bool(orig and orig.value > BURST_MB)
        if span > 0 and area > 0:
            p2a.append(top / (area / span))
            near_share.append(near / span)
        secs = span / 1000.0
        if secs <= 0:
            continue
        pooled["seconds"] += secs
        pooled["ticks"] += ticks
        pooled["within"] += within
        per_trace_ticks.append(ticks / secs)
        per_trace_within.append(within / secs)
        agent = t.source.get("agent_time_s")
        if isinstance(agent, dict) and isinstance(agent.get("value"), (int, float)) and agent["value"] >= secs:
            pooled["agent_seconds"] += agent["value"]
            pooled["agent_ticks"] += ticks
            pooled["agent_within"] += within
            pooled["agent_traces"] += 1
    if not n:
        return None

    def share(a, b):
        return round(a / b, 5) if b else None
    return {
        "traces": n, "curves": curves, "provenance": "derived",
        "peak_to_average": dist(p2a, 2),
        "near_peak_share": {**dist(near_share, 4), "mean": round(sum(near_share) / len(near_share), 4)
                            if near_share else None},
        "change_mb": CHANGE_MB,
        "seconds_changing": {
            "tool_seconds": round(pooled["seconds"], 1),
            "ticks": share(pooled["ticks"], pooled["seconds"]), "within": share(pooled["within"], pooled["seconds"]),
            "ticks_per_trace": dist(per_trace_ticks, 4), "within_per_trace": dist(per_trace_within, 4),
            "agent_seconds": round(pooled["agent_seconds"], 1), "agent_traces": pooled["agent_traces"],
            "agent_ticks": share(pooled["agent_ticks"], pooled["agent_seconds"]),
            "agent_within": share(pooled["agent_within"], pooled["agent_seconds"])},
        "burst_mb": BURST_MB, "bursts": bursts, "bursts_seen_at_1hz": bursts_seen,
    }
