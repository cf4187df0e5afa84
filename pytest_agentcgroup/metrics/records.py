"""What a replay measured, as records: one per step (metrics.jsonl) and one per config (summary).

Every metric is declared once in METRICS (a metric.py Metric) with its unit, which direction is
better, and where its number comes from (`recorded`: counted by the kernel or the wall clock in
this run; `derived`: computed from recorded numbers, like a percentile). Replayed *inputs* say their own provenance in
`profile_source` (recorded/derived/synthetic: see the trace IR).
"""
from __future__ import annotations

import math

from ..traces.ir import Step
from . import faithfulness, reservation
from .metric import Metric

MB = 1024 * 1024

_KERNEL_OOM = "v2 memory.events.local oom_kill | v1 memory.oom_control oom_kill (step + workload cgroup)"
METRICS = {m.name: m for m in (
    Metric("latency_ms", "ms", "lower", "recorded", "wall clock, fork to reap"),
    Metric("cpu_ms", "ms", "lower", "recorded", "cgroup v2 cpu.stat usage_usec"),
    Metric("max_rss_mb", "MiB", "lower", "recorded",
           "v2 memory.peak (null where the kernel has none, before 5.19) | v1 memory.max_usage_in_bytes"),
    Metric("mem_high_events", "count", "lower", "recorded",
           "v2 memory.events.local high: each time the kernel reclaimed/throttled above memory.high (can be "
           "hundreds per step, timing-dependent) | v1 upward usage-threshold crossings (cgroup.event_control: a few)"),
    Metric("mem_max_events", "count", "lower", "recorded", "v2 memory.events.local max | v1 memory.failcnt"),
    Metric("oom_kills", "count", "lower", "recorded", _KERNEL_OOM),
    Metric("mem_stall_ms", "ms", "lower", "recorded",
           "time some task of the step waited for memory (reclaim, a throttle at memory.high): PSI memory.pressure "
           "`some` total of the step's cgroup in the v2 tree (both layouts); null without PSI"),
    Metric("throttles", "count", "lower", "recorded",
           "policy arms: in-kernel SIGSTOPs at memcg reclaim (bpf/reclaim_throttle.bpf.c ring-buffer events)"),
    Metric("freezes", "count", "lower", "recorded", "policy arms: cgroup.freeze escalations by the controller"),
    Metric("policy_kills", "count", "lower", "recorded", "policy arms: cgroup.kill by the controller (not OOM kills)"),
    Metric("pids_max_events", "count", "lower", "recorded", "pids.events max (v2 | v1 pids): forks refused at pids.max"),
    # Browser tenant steps (tenants/browser.py)
    Metric("page_load_ms", "ms", "lower", "recorded",
           "browser Navigation Timing loadEventEnd of the navigation a browser step caused"),
    Metric("step_limit_mb", "MiB", "none", "derived",
           "the hard limit an arm with limit_from set on the step before it ran: its recorded peak + margin (oracle), "
           "or from the trace's earlier steps' measured peaks (vpa, window) or the model of command classes (predict)"),
    Metric("step_limit_us", "us", "lower", "recorded",
           "wall clock of computing that limit on the step's path (limit_from vpa, window, predict), before it starts"),
    Metric("tenant_mem_mb", "MiB", "lower", "recorded",
           "tenant cgroup v2 memory.current | v1 memory.usage_in_bytes after the step"),
    # Per-config aggregates
    Metric("latency_p50_ms", "ms", "lower", "derived", "median of latency_ms over executed steps"),
    Metric("latency_p95_ms", "ms", "lower", "derived", "95th percentile (linear) of latency_ms"),
    Metric("latency_p99_ms", "ms", "lower", "derived", "99th percentile (linear) of latency_ms"),
    Metric("mem_high_events_total", "count", "lower", "derived",
           "sum of mem_high_events (not comparable across cgroup layouts: see mem_high_events)"),
    Metric("mem_high_steps", "count", "lower", "derived",
           "steps with mem_high_events > 0: steps that went above the soft limit (the same on v1 and v2)"),
    Metric("mem_max_events_total", "count", "lower", "derived", "sum of mem_max_events"),
    Metric("timeouts", "count", "lower", "derived", "steps killed at their timeout"),
    Metric("mem_stall_s_total", "s", "lower", "derived", "sum of mem_stall_ms over the steps, in seconds (null without PSI)"),
    Metric("mem_stall_ms_max", "ms", "lower", "derived", "the longest mem_stall_ms of one step (null without PSI)"),
    Metric("throttles_total", "count", "lower", "derived", "sum of throttles"),
    Metric("freezes_total", "count", "lower", "derived", "sum of freezes"),
    Metric("policy_kills_total", "count", "lower", "derived", "sum of policy_kills"),
    Metric("pids_max_events_total", "count", "lower", "derived", "sum of pids_max_events"),
    Metric("total_steps", "count", "none", "derived", "steps replayed"),
    Metric("executed_steps", "count", "none", "derived",
           "steps whose process ran (records with executed true); a change means the replay did other work"),
    Metric("unstarted_steps", "count", "lower", "derived",
           "steps that should have run but could not be started (records with an error)"),
    # What limits reserve and what steps use (metrics/reservation.py). Per step; summed in summaries.
    # Levels are means over the replayed step, held for the step's recorded duration (time_basis).
    Metric("step_time_s", "s", "none", "derived",
           "the step's recorded duration (trace duration_ms; time_basis recorded), else latency_ms / time_scale (replay)"),
    Metric("reserved_gib_s", "GiB·s", "lower", "derived",
           "∫ the arm's committed limit over the step's time: hard limit (static arms, bpf-soft's ceiling), envelope "
           "of the granted soft limit (agentcgroup: controller grant log), else the trace's recorded peak "
           "(unlimited, static-high)"),
    Metric("ceiling_reserved_gib_s", "GiB·s", "lower", "derived",
           "∫ the hard limit (memory_max_mb; the trace's recorded peak without one) over the step's time"),
    Metric("soft_reserved_gib_s", "GiB·s", "lower", "derived",
           "∫ the soft limit (memory_high_mb, with grants where a controller grants) over the step's time; null without one"),
    Metric("used_gib_s", "GiB·s", "none", "derived",
           "mean memory usage × step_time_s: trapezoid over v2 memory.current | v1 memory.usage_in_bytes sampled every 20 ms"),
    Metric("utilization", "ratio", "higher", "derived", "used_gib_s / reserved_gib_s (summaries: of the sums)"),
    Metric("idle_reserved_gib_s", "GiB·s", "lower", "derived", "max(0, reserved_gib_s − used_gib_s) per step"),
    Metric("oracle_gib_s", "GiB·s", "none", "derived",
           "the step's own peak (trace profile peak_mb) × step_time_s: what a policy that knew each step's peak "
           "would reserve; null for a step without a peak; the same under every arm"),
    Metric("reserved_vs_oracle", "ratio", "lower", "derived",
           "reserved_gib_s / oracle_gib_s over the steps with a peak (summaries: of the sums); 1 = the oracle's"),
)}


def step_record(result, step: Step, *, config: str, time_scale: float, executor: str,
                source_recorded: bool = False) -> dict:
    """The metrics.jsonl line of one step: `result` is what the replayer returned for it (a
    replay/replayer.py StepResult, read by its fields: metrics/ does not import the replay);
    `source_recorded`: its trace's source recorded outcomes (faithfulness.step_fields)."""
    c = result.counters
    rec = {
        "trace_id": result.trace_id, "step_id": result.step_id, "tool": result.tool, "cmd": result.cmd,
        "config": config, "executor": executor, "executed": result.executed,
        "latency_ms": _round(result.latency_ms),
        "cpu_ms": _round(c["cpu_usec"] / 1000.0) if c.get("cpu_usec") is not None else None,
        "max_rss_mb": _round(c["peak_bytes"] / MB) if c.get("peak_bytes") is not None else None,
        "mem_high_events": c.get("high_events", 0), "mem_max_events": c.get("max_events", 0),
        "oom_kills": c.get("oom_kills", 0), "pids_max_events": c.get("pids_max_events", 0),
        "mem_stall_ms": _round(c["mem_stall_usec"] / 1000.0) if c.get("mem_stall_usec") is not None else None,
        # what a policy arm's controller did to the step (0 under static arms)
        "throttles": c.get("throttles", 0), "freezes": c.get("freezes", 0),
        "policy_kills": c.get("policy_kills", 0),
        "exit_code": result.exit_code, "signal": result.signal, "timed_out": result.timed_out,
        "profile_source": result.profile_source,
        # What was asked for, so a reader can compare: the trace's numbers, scaled as replayed
        # (time_scale is the executor's: 1 for sandbox/docker, whose latency_ms is real time), and
        # the trace's own duration with its provenance (recorded | derived | synthetic).
        "replayed_duration_ms": _round(step.duration_ms.value * time_scale) if step.duration_ms else None,
        "recorded_duration_ms": _round(step.duration_ms.value) if step.duration_ms else None,
        "duration_source": step.duration_ms.provenance if step.duration_ms else None,
        "replayed_peak_mb": _round(step.profile.peak_mb.value) if step.profile.peak_mb else None,
    }
    if "step_limit_mb" in c:         # an arm with a limit per step (limit_from): the one it ran under
        rec["step_limit_mb"] = _round(c["step_limit_mb"])
        if c.get("step_limit_us") is not None:
            rec["step_limit_us"] = _round(c["step_limit_us"])
        if c.get("limit_fold"):      # the model's fold that held the trace out (limits/model.py)
            rec["limit_fold"] = c["limit_fold"]
    if "kind" in c:                  # policy arms: what the priorities were keyed by, and the priority
        rec["kind"], rec["priority"] = c["kind"], c.get("priority")
        # the cpu weight its priority gave the step's cgroup; None where the rules give none or the
        # run has no cpu controller (not delegated): then the policy ran on memory alone
        rec["cpu_weight"] = c.get("cpu_weight")
        if c.get("cpu_weight_missing"):     # the rules gave its priority a weight the cgroup could not take
            rec["cpu_weight_missing"] = c["cpu_weight_missing"]
    rec.update({k: _round(v) for k, v in result.measures.items()})
    if result.error:
        rec["error"] = result.error
    # real commands: the outcome beside the trace's (recorded_exit, replayed_exit, diverged, ...)
    rec.update(faithfulness.step_fields(result, step, executor, source_recorded=source_recorded))
    return rec


def _round(x):
    return None if x is None else round(float(x), 3)


def percentile(values, q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), or None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(records: list[dict], config: str) -> dict:
    """The summary.json object of one config (arm), over all its traces' step records."""
    lat = [r["latency_ms"] for r in records if r["latency_ms"] is not None]
    stalls = [r["mem_stall_ms"] for r in records if r.get("mem_stall_ms") is not None]
    return {
        "config": config,
        "traces": len({r["trace_id"] for r in records}),
        "total_steps": len(records),
        "executed_steps": sum(1 for r in records if r["executed"]),
        "unstarted_steps": sum(1 for r in records if r.get("error")),
        "latency_p50_ms": _round(percentile(lat, 50)),
        "latency_p95_ms": _round(percentile(lat, 95)),
        "latency_p99_ms": _round(percentile(lat, 99)),
        "mem_high_events_total": sum(r["mem_high_events"] for r in records),
        "mem_high_steps": sum(1 for r in records if r["mem_high_events"]),
        "mem_max_events_total": sum(r["mem_max_events"] for r in records),
        "oom_kills": sum(r["oom_kills"] for r in records),
        "timeouts": sum(1 for r in records if r["timed_out"]),
        "mem_stall_s_total": _round(sum(stalls) / 1000.0) if stalls else None,
        "mem_stall_ms_max": _round(max(stalls)) if stalls else None,
        "throttles_total": sum(r.get("throttles", 0) for r in records),
        "freezes_total": sum(r.get("freezes", 0) for r in records),
        "policy_kills_total": sum(r.get("policy_kills", 0) for r in records),
        "pids_max_events_total": sum(r.get("pids_max_events", 0) for r in records),
        **reservation.totals(records),      # GiB·s reserved, used, idle, oracle; utilization, reserved_vs_oracle
                                            # (None when not recorded)
    }


#: What each number of a summary is: its METRICS entry, except `oom_kills`, which keeps the per-step
#: name in the summary (baselines, gate rules and summary.json readers use it) but is a sum there.
#: These are the metrics a per-test comparison (the gate) can check.
SUMMARY_METRICS = {k: METRICS[k] for k in summarize([], "") if k in METRICS} | {
    "oom_kills": Metric("oom_kills", "count", "lower", "derived", f"sum of oom_kills over the steps ({_KERNEL_OOM})")}
