"""The table a timescale study prints (and keeps in the benchmark JSON): one row per controller, its
legend, and where the slowest in-kernel stops' time went.

May import: nothing of the package.
"""
from __future__ import annotations

import os
from pathlib import Path


def fmt(v, w=9):
    """A figure to 3 decimals in `w` columns; '-' for none (NaN: no burst measured it)."""
    return f"{v:{w}.3f}" if isinstance(v, (int, float)) and v == v else f"{'-':>{w}}"


def _cap_sys_resource() -> bool:
    eff = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("CapEff:"))
    return bool(int(eff.split()[1], 16) >> 24 & 1)          # CAP_SYS_RESOURCE = 24


def lines(results: list[dict], b: dict, stopped_mask: int) -> list[str]:
    """The table of `results` (bursts.run_bursts' rows, with probe_p99_ms) under burst table `b`;
    `stopped_mask`: the task states the observer counts as stopped."""
    # without CAP_SYS_RESOURCE a PSI trigger is evaluated on the group's 2 s averaging tick
    psi_privilege = "; no CAP_SYS_RESOURCE: triggers fire on the 2 s averaging tick" if not _cap_sys_resource() else ""
    lines = [f"Experiment 2 — reaction to a memory burst, measured to the worker stopping: onset = its first memcg "
             f"reclaim, stop = it left the CPU stopped (sched_switch prev_state & {stopped_mask:#x}), both kernel "
             f"clock (task_stop.bpf.c); overshoot = burst MiB it touched in between",
             f"{b['count']} bursts/controller of {b['burst_mb']} MiB over a {b['limit_mb']} MiB limit "
             f"({b['psi_count']} for PSI, in {b.get('psi_lanes', 1)} parallel lanes: one cgroup + trigger each); "
             f"PSI window {b['psi_window_us'] // 1000} ms (host accepts multiples of 2 s{psi_privilege}), "
             f"threshold {b['psi_threshold_us']} us; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end",
             f"{'controller':14} {'n':>4} {'miss':>4} {'earl':>4} {'late':>4} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9}"
             f" {'max ms':>9} {'over p50':>8} {'over p99':>8} {'sent p99':>9} {'probe p99':>9}"
             f" {'ran on':>9} {'bound %':>8} {'aft p99':>8}"]
    for r in results:
        lines.append(f"{r['controller']:14} {r['n']:4d} {r['misses']:4d} {r['early']:4d} {r['late']:4d} {fmt(r['p50_ms'])}"
                     f" {fmt(r['p95_ms'])} {fmt(r['p99_ms'])} {fmt(r['max_ms'])} {fmt(r['overshoot_p50_mib'], 8)}"
                     f" {fmt(r['overshoot_p99_mib'], 8)} {fmt(r['sent_p99_ms'])} {fmt(r['probe_p99_ms'])}"
                     f" {r['ran_on']:4d}/{r['bursts']:<4d} {fmt(r['ran_on_lower_pct'], 8)} {fmt(r['after_reclaim_p99_ms'], 8)}")
    lines.append("p50/p95/p99/max: onset -> stop (ms); over: overshoot (MiB); earl: stopped before the first reclaim "
                 "(not in the percentiles); late: stopped only after the whole burst; sent p99: onset -> signal sent, informational (not the stop, not asserted); "
                 "probe p99: lateness of a co-located 1 ms sleeper during that controller's bursts; "
                 "ran on: bursts whose worker touched more of the burst after its first reclaim began, before it "
                 f"stopped (or never stopped); bound %: lower {b['confidence']:.1%}-confidence bound of that share "
                 "(what a claim on ran_on_lower_pct reads); aft p99: stop - end of the first reclaim (ms), informational"
                 + "".join(f" ({r['controller']}: {r['lanes']} bursts at a time, so not comparable)"
                           for r in results if r["lanes"] > 1))
    for r in results:                                  # where the slowest stops' time went
        if r["controller"].startswith("ebpf"):
            lines.append(f"{r['controller']}: p99 without the wait for a CPU {fmt(r['no_cpu_wait_p99_ms'], 0).strip()} ms; "
                         f"slowest stops: " + "; ".join(
                f"{w['reaction_ms']:.3f} ms = first reclaim {fmt(w['first_reclaim_ms'], 0).strip()} ms, "
                f"waiting for a CPU {w['runnable_ms']:.3f} ms, blocked {w['blocked_ms']:.3f} ms, "
                f"{w['reclaims']} reclaims" for w in r["slowest"]))
    return lines
