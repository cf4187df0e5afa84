"""What a limit reserves, and how much of it the step used: GiB·s per step, summed per trace and arm.

A limit is memory a host must keep for the cgroup while it holds it, used or not. Per step:

    reserved_gib_s       = ∫ L(t) dt over the step's time, where L is what the arm commits:
                           - a static arm with a hard limit (memory_max_mb): that limit, for a
                             trace-scope arm (static-env) too (the trace's limit over this step's time);
                             an arm whose limit comes from each step (arms.py limit_from = "step_peak",
                             the oracle arm): the step's own limit, its peak + margin_mb (a step without
                             a recorded peak runs without a limit: the trace's peak, as unlimited); one
                             whose limit comes from the steps before (limit_from vpa, window, predict:
                             limits/): the limit the placement set on the step (step_limit_mb);
                           - the dynamic arm (a policy with eBPF: agentcgroup): for a low-priority step,
                             which the policy holds at its soft limit until it grants more, the envelope of
                             that soft limit, memory_high_mb raised at each grant the controller logged
                             (bpf/controller.py `grants`), each granted level held until the step ends (a
                             host that granted room keeps it for the step: the envelope never comes back
                             down, envelope_mib_ms); a normal or high step is never held (it may grow
                             to the ceiling, as under bpf-soft), so it reserves the ceiling, as the control
                             arm does — the two arms then differ only where the policy acts;
                           - a soft limit that nothing grants or holds is no reservation: static-high (no
                             hard limit) counts as unlimited, bpf-soft (the control arm: no eBPF, no
                             controller) as the static arm of its ceiling;
                           - no hard limit and no granting policy (unlimited, static-high): what a scheduler
                             would have to reserve, the trace's peak (its largest recorded step peak).
    ceiling_reserved_gib_s = ∫ hard limit dt (memory_max_mb; the trace's peak where there is none):
                           the reservation at the line the kernel kills at.
    soft_reserved_gib_s  = ∫ soft limit dt (memory_high_mb, with grants for policy arms); null without one.
    used_gib_s           = ∫ usage dt, measured: the step cgroup's memory.current / usage_in_bytes sampled
                           every 20 ms of replay (cgroups/usage.py); null where it was not sampled.
    utilization          = used / reserved;  idle_reserved_gib_s = max(0, reserved − used).
    oracle_gib_s         = the step's own peak × its time: what a policy that knew the future would reserve
                           (each step limited at exactly its peak). The peak is the trace's recorded step
                           peak, the IR's `profile.peak_mb` (recorded by `agentcgroup traces profile`;
                           derived or synthetic where the trace's profiles are), the same number the
                           emulator replays and the trace peak above is the largest of; null for a step
                           without one. It depends on the trace only, so it is the same under every arm.
    reserved_vs_oracle   = reserved / oracle (a ratio, lower is better, 1 = the oracle's reservation), over
                           the steps that have an oracle: a step without a recorded peak counts in neither
                           sum; summaries take it of the sums.

Time: a level (limit, envelope, usage) is a time-weighted mean over the replayed step, and it is
held for the step's *recorded* duration (the trace's duration_ms: the time a host would hold the
limit for the recorded agent; `time_basis` "recorded"), else, for traces without durations, for the
replay's wall time / time_scale ("replay"). Replay wall time is not used as the time itself: on a
shared machine it follows load, and at time_scale 0.05 every ms of harness start-up would count 20x.
So the dynamic arm's throttle holds cost latency (reported as such), not GiB·s; its grants count by
when, within the step, they came. Per trace the step figures are summed; the agent's own time between
tool calls (model turns) is not replayed, so a trace-scope reservation (a container's) is a lower
bound of what a host would hold.

All of these are `derived`: from the arm's configured limits, the controller's grant log, the
recorded wall clock and the sampled usage; `reserved_basis` names which rule gave a step's figure.
"""
from __future__ import annotations

from typing import Iterable

MIB_MS_PER_GIB_S = 1024.0 * 1000.0
SAMPLE_PERIOD_S = 0.02          # usage sampling period of replayed steps (cgroups/usage.py), replay time
PEAK_BASIS, HARD_BASIS, GRANT_BASIS = "trace peak", "hard limit", "granted soft limit"

#: The per-step fields, in record order.
STEP_FIELDS = ("step_time_s", "time_basis", "reserved_gib_s", "reserved_basis", "ceiling_reserved_gib_s",
               "soft_reserved_gib_s", "used_gib_s", "usage_samples", "utilization", "idle_reserved_gib_s",
               "oracle_gib_s", "reserved_vs_oracle")
#: The fields a summary sums (and utilization and reserved_vs_oracle, ratios of the sums).
TOTAL_FIELDS = ("step_time_s", "reserved_gib_s", "ceiling_reserved_gib_s", "soft_reserved_gib_s",
                "used_gib_s", "idle_reserved_gib_s", "oracle_gib_s")


def envelope_mib_ms(start_mib: float, grants: Iterable, duration_ms: float) -> float:
    """∫ of a limit that starts at `start_mib` and is raised to each grant's MiB at its time (ms from
    the step's start), over [0, duration_ms]: MiB·ms. The highest level granted so far is held until
    the step ends: a grant below it (a limit that came back down) reserves nothing less, since a host
    that granted the room must keep it for the step. Grants after the end count for nothing, grants
    before the start count from the start."""
    total, at, level = 0.0, 0.0, float(start_mib)
    for t_ms, mib in sorted((max(0.0, float(t)), float(m)) for t, m in grants):
        if t_ms >= duration_ms:
            break
        total += level * (t_ms - at)
        at, level = t_ms, max(level, mib)
    return total + level * max(0.0, duration_ms - at)


def step_reservation(*, latency_ms: float | None, time_scale: float, memory_max_mb: float | None,
                     memory_high_mb: float | None, granting: bool, trace_peak_mb: float | None,
                     grants: Iterable = (), usage_mib_ms: float | None = None, usage_window_ms: float | None = None,
                     usage_samples: int | None = None, recorded_ms: float | None = None,
                     step_peak_mb: float | None = None) -> dict:
    """The reservation fields of one step (STEP_FIELDS): pure arithmetic, see the module docstring.
    `memory_max_mb` is the hard limit this step ran under (arms.Arm.step_memory_max_mb);
    `step_peak_mb` the step's own recorded peak (the oracle's level; None: no oracle for the step).
    `granting`: the arm's controller grants soft-limit room (a policy arm with eBPF). Levels (limit,
    envelope, usage) are time-weighted means over the replayed step (latency_ms; usage over the
    sampler's window); the time they are held is the step's `recorded_ms` when the trace has it, else
    latency_ms / time_scale. A step that did not run (latency_ms None) held nothing: zeros."""
    if time_scale <= 0:
        raise ValueError(f"time_scale must be positive, got {time_scale!r}")
    wall = float(latency_ms or 0.0)
    if latency_ms is None:
        held_s, time_basis = 0.0, None
    elif recorded_ms is not None:
        held_s, time_basis = float(recorded_ms) / 1000.0, "recorded"
    else:
        held_s, time_basis = wall / 1000.0 / time_scale, "replay"

    def gib_s(mean_mib):
        return None if mean_mib is None else round(mean_mib * held_s / 1024.0, 6)

    soft = None
    if memory_high_mb is not None:       # the envelope's mean over the replayed step (flat without grants)
        soft = envelope_mib_ms(memory_high_mb, grants if granting else (), wall) / wall if wall > 0 \
            else float(memory_high_mb)
    ceiling = memory_max_mb if memory_max_mb is not None else trace_peak_mb
    if granting and soft is not None:
        reserved, basis = soft, GRANT_BASIS
    elif memory_max_mb is not None:
        reserved, basis = memory_max_mb, HARD_BASIS
    else:
        reserved, basis = trace_peak_mb, PEAK_BASIS
    used = None
    if usage_mib_ms is not None:
        used = usage_mib_ms / usage_window_ms if usage_window_ms else 0.0
    out = {"step_time_s": round(held_s, 6), "time_basis": time_basis, "reserved_gib_s": gib_s(reserved),
           "reserved_basis": basis if reserved is not None else None,
           "ceiling_reserved_gib_s": gib_s(ceiling), "soft_reserved_gib_s": gib_s(soft),
           "used_gib_s": gib_s(used), "usage_samples": usage_samples,
           "utilization": None, "idle_reserved_gib_s": None,
           "oracle_gib_s": gib_s(step_peak_mb), "reserved_vs_oracle": None}
    if out["reserved_gib_s"] is not None and out["used_gib_s"] is not None:
        r, u = out["reserved_gib_s"], out["used_gib_s"]
        out["utilization"] = round(u / r, 6) if r > 0 else None
        out["idle_reserved_gib_s"] = round(max(0.0, r - u), 6)
    if out["reserved_gib_s"] is not None and out["oracle_gib_s"]:
        out["reserved_vs_oracle"] = round(out["reserved_gib_s"] / out["oracle_gib_s"], 6)
    return out


def trace_peak_mb(steps) -> float | None:
    """The largest step peak a trace records (IR `profile.peak_mb`), None when no step has one."""
    peaks = [s.profile.peak_mb.value for s in steps if s.profile.peak_mb is not None]
    return max(peaks) if peaks else None


def step_fields(result, step, *, arm, trace, time_scale: float) -> dict:
    """The reservation fields of a replayed step's metrics.jsonl record (replay.StepResult `result`
    of IR `step` of `trace` under arms.Arm `arm`): the one call the plugin makes."""
    c = result.counters
    # Only a low-priority step is held at its soft limit (stopped there until a grant); the
    # controller never holds a normal or high step, which may grow to the ceiling as under bpf-soft:
    # those reserve the ceiling, like the control arm, so the two differ only where the policy acts.
    held = granting(arm) and c.get("priority") == "low"
    peak = step.profile.peak_mb.value if step.profile.peak_mb is not None else None
    # a limit from the steps before (limit_from vpa, window, predict): the one the placement set, a
    # hard limit, or on a policy arm the soft limit the step was held at and granted from
    own = "step_limit_mb" in c and arm.limit_from is not None
    limit = c["step_limit_mb"] if own and arm.policy is None else arm.step_memory_max_mb(peak)
    soft = c["step_limit_mb"] if own and arm.policy is not None else arm.memory_high_mb
    return step_reservation(
        latency_ms=result.latency_ms if result.executed else None, time_scale=time_scale,
        memory_max_mb=limit, memory_high_mb=soft, granting=held,
        trace_peak_mb=_cached_trace_peak(trace), grants=c.get("grants") or (),
        usage_mib_ms=c.get("usage_mib_ms"), usage_window_ms=c.get("usage_window_ms"),
        usage_samples=c.get("usage_samples"),
        recorded_ms=step.duration_ms.value if step.duration_ms is not None else None, step_peak_mb=peak)


def granting(arm) -> bool:
    """Whether the arm's controller grants soft-limit room: a policy arm with eBPF (bpf/controller.py
    Rules: `ebpf` defaults to true; false is the bpf-soft control arm, where nothing acts)."""
    return arm.policy is not None and arm.rules.get("ebpf", True) is not False


_PEAKS: dict[int, tuple] = {}


def _cached_trace_peak(trace) -> float | None:
    hit = _PEAKS.get(id(trace))
    if hit is None or hit[0] is not trace:       # keyed by identity; the trace itself guards reuse of ids
        hit = (trace, trace_peak_mb(trace.steps))
        _PEAKS.clear()                           # one trace is replayed at a time: keep one
        _PEAKS[id(trace)] = hit
    return hit[1]


def totals(records: list[dict]) -> dict:
    """Sums of TOTAL_FIELDS over records that carry them (None when none does), utilization =
    Σ used / Σ reserved over records that carry both, and reserved_vs_oracle = Σ reserved / Σ oracle
    over records that carry both (the steps with a recorded peak)."""
    out = {}
    for k in TOTAL_FIELDS:
        vals = [r[k] for r in records if r.get(k) is not None]
        out[k] = round(sum(vals), 6) if vals else None
    both = [r for r in records if r.get("reserved_gib_s") is not None and r.get("used_gib_s") is not None]
    res = sum(r["reserved_gib_s"] for r in both)
    out["utilization"] = round(sum(r["used_gib_s"] for r in both) / res, 6) if both and res > 0 else None
    known = [r for r in records if r.get("reserved_gib_s") is not None and r.get("oracle_gib_s") is not None]
    oracle = sum(r["oracle_gib_s"] for r in known)
    out["reserved_vs_oracle"] = round(sum(r["reserved_gib_s"] for r in known) / oracle, 6) if oracle > 0 else None
    return out
