"""Placing an arm (arms.py, the data) on cgroups: its limits on a cgroup (apply_limits), and each
step of a trace in a cgroup of its own with them (ArmPlacement, the replayer's Placement).

Steps always run in their own child cgroup, whatever the arm's scope, so every arm measures each
step the same way; the scope only decides which cgroup carries the limits.

The cgroups layer does not know the policy nor the steps' kinds: ArmPlacement is handed a
StepPolicy object (built by bpf/controller.py `policy_for(arm)`) and a `kind_of(step)` function
(the pytest side's: traces/classify.py step_kind unless a test gives its own), and tells the
policy each step's cgroup and kind. An arm whose limits come from the steps before (arms.py
limit_from "vpa", "window", "predict") is handed its `limits` the same way (limits/ step_limits):
asked each step's limit before it runs, told its peak and kill after.
"""
from __future__ import annotations

import time
from typing import Callable, Protocol

from ..arms import Arm, ArmError
from .counters import Counters
from .node import MB, Cgroup
from .pool import StepPool
from .usage import UsageSampler


def apply_limits(arm: Arm, cg: Cgroup) -> None:
    """The arm's memory, pids and CPU limits on `cg`."""
    if arm.memory_max_mb is not None:
        cg.set_memory_max(int(arm.memory_max_mb * MB))
    if arm.memory_high_mb is not None:
        cg.set_memory_high(int(arm.memory_high_mb * MB))
    if arm.pids_max is not None:
        cg.set_pids_max(int(arm.pids_max))
    apply_cpu(arm, cg)


def apply_cpu(arm: Arm, cg: Cgroup) -> None:
    """The arm's CPU weight and cap (a policy arm's controller may then set a weight by priority)."""
    if arm.cpu_weight is not None:
        cg.set_cpu_weight(int(arm.cpu_weight))
    if arm.cpu_quota is not None:
        cg.set_cpu_max(*arm.cpu_quota)


class StepPolicy(Protocol):
    """What a policy arm's controller offers ArmPlacement (bpf/controller.py: Controller)."""
    def add_step(self, cg: Cgroup, kind: str | None = None, *, time_scale: float = 1.0,
                 soft_mb: float | None = None) -> None: ...   # limits + start acting on it; its timers x time_scale
    def remove_step(self, cg: Cgroup) -> dict: ...     # stop; what it did to the step (counts, priority)


class StepLimits(Protocol):
    """A per-step limit source ArmPlacement is handed (limits/__init__.py StepLimits)."""
    def limit_mb(self, step) -> float | None: ...
    def observe(self, step, limit_mb: float | None, peak_mb: float | None, oom_killed: bool) -> None: ...


class ArmPlacement:
    """Places each step of a trace in `workload/s<step_id>` (pooled: `p<n>`) with the arm's limits (the replayer's
    Placement). Per-step counters = the step cgroup's own + what the workload cgroup itself counted
    during the step (where a trace-scope limit is hit), both local, so nothing is counted twice.

    A policy arm needs its `policy` (the arm's running controller), which then sets each step's
    limits and acts on it, and `kind_of(step)`, what the policy's priorities are keyed by (the
    pytest side hands traces/classify.py `step_kind`, the step's kind, unless a test gives its own).
    `sample_usage_s`: sample each step's memory usage at this period (cgroups/usage.py) and add its
    integral to the step's counters; off by default (the bare per-step cost Experiment 4's step
    test measures has no sampler), on for every experiment replay (harness/fixtures.py), so an
    experiment's latencies, Experiment 4's per-arm overhead included, count the 20 ms sampling
    thread as part of the harness."""

    def __init__(self, arm: Arm, workload: Cgroup, controllers: tuple[str, ...], *, nest_in=None,
                 pool: bool = False, policy: StepPolicy | None = None, kind_of: Callable | None = None,
                 time_scale: float = 1.0, sample_usage_s: float | None = None, limits: StepLimits | None = None):
        if arm.limit_from not in (None, "step_peak") and limits is None:
            raise ArmError(f"arm {arm.name}: limit_from {arm.limit_from!r} needs its limits "
                           "(ArmPlacement(..., limits=limits.step_limits(arm, trace)))")
        if arm.policy is not None and policy is None:
            raise ArmError(f"arm {arm.name}: policy {arm.policy!r} needs its controller "
                           "(ArmPlacement(..., policy=bpf.controller.policy_for(arm)))")
        if policy is not None and kind_of is None:
            raise ArmError(f"arm {arm.name}: a policy needs each step's kind "
                           "(ArmPlacement(..., kind_of=traces.classify.step_kind))")
        self.arm, self.workload, self.controllers = arm, workload, controllers
        self.policy, self.kind_of = policy, kind_of
        self.limits, self.step_limit_mb, self.step_limit_us = limits, None, None
        # how fast the steps replay (the emulate executor's time_scale; 1 for real commands): a
        # policy's timers run at the same pace (bpf/controller.py, "One time rule")
        self.time_scale = time_scale
        # nest_in(): the cgroup steps are made under when it is not the workload itself (a
        # container's cgroup, known once the executor has started it: cgroups/container.py)
        self.nest_in = nest_in
        if arm.scope == "trace":
            apply_limits(arm, workload)
        # The workload's own (local) event counters move only where it carries a limit; reading
        # them otherwise costs every step file reads for zeros. Set True if something else limits it.
        self.workload_limited = arm.scope == "trace" and bool(arm.limits) or policy is not None
        self.step_cg: Cgroup | None = None
        self._emptied = False            # kill_step found the step's cgroup empty
        self._before: Counters | None = None
        # pool: step cgroups `p<n>` made ahead and removed behind, off the critical path (pool.py)
        self.pool = StepPool(self._new_step_cgroup) if pool else None
        # hybrid: a v1 pids or cpu cgroup of the step's own only where something sets a limit there;
        # otherwise the step joins its parent's (Cgroup.shared), which bounds it and counts its
        # refused forks (cpu_usec comes from the unified cpu.stat either way). mkdir and rmdir in
        # two more hierarchies per step bought nothing but their cost.
        self.share = tuple(c for c, own in (("pids", arm.pids_max is not None),
                                            ("cpu", arm.needs_cpu or policy is not None)) if not own)
        self.sampler: UsageSampler | None = None
        if sample_usage_s:
            self.sample_usage(sample_usage_s)

    def sample_usage(self, period_s: float) -> None:
        """From the next step on, sample each step's memory usage every `period_s` (cgroups/usage.py):
        its integral lands in the step's counters as usage_mib_ms (usage_samples readings)."""
        if self.sampler is None:
            self.sampler = UsageSampler(period_s)

    def _new_step_cgroup(self, name: str) -> Cgroup:
        cg = (self.nest_in() if self.nest_in else self.workload).child(name, self.controllers, share=self.share)
        if self.policy is None and self.arm.scope == "step":
            apply_limits(self.arm, cg)
        elif self.policy is not None:       # the policy sets memory limits and the priority's cpu weight
            if self.arm.pids_max is not None:
                cg.set_pids_max(int(self.arm.pids_max))
            apply_cpu(self.arm, cg)
        return cg

    def begin_step(self, step):
        """The cgroup.procs files the step's process joins, or (pooled) a Parked child already in them."""
        if self.pool:
            self.step_cg, joined = self.pool.take()
            self._before = self._before or self._workload_counters()   # read in tidy(), off the path
        else:
            self.step_cg = self._new_step_cgroup(f"s{step.step_id}")
            self._before = self._workload_counters()
            joined = self.step_cg.join_files()
        try:
            own = self._own_limit(step) if self.arm.limit_from is not None else None   # known only now
            if self.policy is not None:       # the policy sets the step's limits (before its program runs)
                # an arm with limit_from: the step's own limit is its soft limit, held and granted from
                extra = {"soft_mb": own} if own is not None else {}
                self.policy.add_step(self.step_cg, self.kind_of(step), time_scale=self.time_scale, **extra)
        except BaseException:
            cg, self.step_cg = self.step_cg, None
            if self.pool:
                joined.discard()          # the parked shell: killed and reaped now
                self.pool.retire(cg)
            else:
                cg.remove()
            raise
        if self.sampler:
            self.sampler.start(self.step_cg)
        return joined

    def _own_limit(self, step) -> float | None:
        """The step's own hard limit (arms.py limit_from: its recorded peak + the arm's margin, or
        what its `limits` say) on its cgroup, before its program starts; a step without a recorded
        peak runs without one. A pooled cgroup is made before its step is known, so this is the one
        limit set on the critical path. A policy arm's is its soft limit: returned, the policy sets it."""
        if self.limits is not None:
            t0 = time.perf_counter_ns()             # what computing it costs the call (records: step_limit_us)
            limit = self.limits.limit_mb(step)
            self.step_limit_us = (time.perf_counter_ns() - t0) / 1000
        else:
            peak = getattr(getattr(step, "profile", None), "peak_mb", None)
            limit = self.arm.step_memory_max_mb(peak.value if peak is not None else None)
        self.step_limit_mb = limit
        if limit is not None and self.policy is None:
            self.step_cg.set_memory_max(int(limit * MB))
        return limit

    def tidy(self) -> None:
        """Between steps (the replayer calls it once a step's result is delivered)."""
        if self.pool:
            self.pool.tidy()
            self._before = self._workload_counters()

    def _workload_counters(self) -> Counters:
        return self.workload.counters() if self.workload_limited else Counters()

    def close(self) -> None:
        if self.sampler:
            self.sampler.close()
        if self.pool:
            self.pool.close()

    def kill_step(self) -> None:
        # an empty cgroup has nothing to kill, and stays empty (nothing joins a step's cgroup later):
        # end_step need not ask again
        self._emptied = self.step_cg is None or not self.step_cg.populated()
        if not self._emptied:
            self.step_cg.kill()

    def end_step(self, step) -> dict[str, float]:
        cg, self.step_cg = self.step_cg, None
        emptied, self._emptied = self._emptied, False
        usage = self.sampler.stop() if self.sampler else {}
        try:
            deadline = time.monotonic() + 5.0
            while not emptied and cg.populated() and time.monotonic() < deadline:   # killed ones take a moment
                time.sleep(0.002)
            own = cg.counters()
            env = self._workload_counters().minus(self._before)
            if env.events_hierarchical:      # v2 < 5.2: the workload's memory.events include the step's
                env = _without(env, own)
        finally:                                     # also when reading counters failed
            acted = self.policy.remove_step(cg) if self.policy is not None else {}
            self.pool.retire(cg) if self.pool else cg.remove()
        if self.arm.limit_from is not None:          # the limit it ran under, for reservation and records
            acted = {**acted, "step_limit_mb": self.step_limit_mb}
            if self.step_limit_us is not None:
                acted["step_limit_us"] = self.step_limit_us
            if getattr(self.limits, "fold", None):     # a model's limits: the fold that held this trace out
                acted["limit_fold"] = self.limits.fold
            if self.limits is not None:
                self.limits.observe(step, self.step_limit_mb,
                                    own.peak_bytes / MB if own.peak_bytes is not None else None, own.oom_kills > 0)
        return {"peak_bytes": own.peak_bytes, "cpu_usec": own.cpu_usec,
                "high_events": own.high_events + env.high_events,
                "max_events": own.max_events + env.max_events,
                "oom_kills": own.oom_kills + env.oom_kills,
                "pids_max_events": own.pids_max_events + env.pids_max_events,
                # the step's own: the workload's pressure holds the step's (PSI is hierarchical)
                "mem_stall_usec": own.mem_stall_usec, **usage, **acted}


def _without(env: Counters, own: Counters) -> Counters:
    """The workload's own events, from hierarchical counts that include the step's (one step runs
    at a time per placement, so the step is the only child that counted during it)."""
    return Counters(env.peak_bytes, env.cpu_usec, max(0, env.high_events - own.high_events),
                    max(0, env.max_events - own.max_events), max(0, env.oom_kills - own.oom_kills),
                    env.pids_max_events, env.mem_stall_usec)
