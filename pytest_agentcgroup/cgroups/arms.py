"""Arms: the resource-control configurations an experiment compares. Arms are data (TOML):

    [arms.static-toolcall]
    description = "a child cgroup per tool call with a fixed per-step limit"
    memory_max_mb = 512          # hard limit: above it the kernel reclaims, then OOM-kills
    memory_high_mb = 384         # soft limit (v2 memory.high; v1: see Cgroup.set_memory_high)
    pids_max = 512
    scope = "step"               # where the limits go: "step" (each tool call's cgroup) or
                                 # "trace" (the workload cgroup shared by all steps)

Steps always run in their own child cgroup, whatever the scope, so every arm measures each step the
same way; the scope only decides which cgroup carries the limits.

A policy arm adds a controller that acts on each step while it runs:

    [arms.agentcgroup]
    policy = "agentcgroup"       # the dynamic arm (bpf/controller.py); scope is always "step"
    memory_high_mb = 512         # the soft limit the policy acts at
    memory_max_mb = 2048         # the hard ceiling
    [arms.agentcgroup.rules]     # the policy's own rules (hold times, priorities, ...): its Rules

The cgroups layer does not know the policy: ArmPlacement is handed a StepPolicy object (built by
bpf/controller.py `policy_for(arm)`) and tells it each step's cgroup and kind.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..traces.classify import step_kind
from .node import MB, Cgroup, Counters
from .pool import StepPool
from .usage import UsageSampler

SCOPES = ("step", "trace")
LIMIT_KEYS = ("memory_max_mb", "memory_high_mb", "pids_max")


class ArmError(ValueError):
    """An arm definition that cannot be applied; names the arm and the key."""


@dataclass(frozen=True)
class Arm:
    name: str
    description: str = ""
    scope: str = "step"
    memory_max_mb: float | None = None
    memory_high_mb: float | None = None
    pids_max: int | None = None
    policy: str | None = None                                          # e.g. "agentcgroup"
    rules: dict = field(default_factory=dict, hash=False)              # the policy's rules, as written

    @classmethod
    def from_dict(cls, name: str, raw: dict, *, where: str = "arms") -> "Arm":
        if not isinstance(raw, dict):
            raise ArmError(f"{where}.{name}: expected a table, got {type(raw).__name__}")
        unknown = set(raw) - {"description", "scope", "policy", "rules", *LIMIT_KEYS}
        if unknown:
            raise ArmError(f"{where}.{name}: unknown key(s) {', '.join(sorted(unknown))}; "
                           f"expected description, scope, policy, rules, {', '.join(LIMIT_KEYS)}")
        scope = raw.get("scope", "step")
        if scope not in SCOPES:
            raise ArmError(f"{where}.{name}.scope: expected one of {', '.join(SCOPES)}, got {scope!r}")
        policy, rules = raw.get("policy"), raw.get("rules", {})
        if policy is not None and (not isinstance(policy, str) or not policy):
            raise ArmError(f"{where}.{name}.policy: expected a policy name, got {policy!r}")
        if not isinstance(rules, dict):
            raise ArmError(f"{where}.{name}.rules: expected a table, got {type(rules).__name__}")
        if rules and policy is None:
            raise ArmError(f"{where}.{name}.rules: rules without a policy (set policy = \"agentcgroup\")")
        if policy is not None and scope != "step":
            raise ArmError(f"{where}.{name}.scope: a policy acts on each step's cgroup; scope must be \"step\"")
        for key in LIMIT_KEYS:
            val = raw.get(key)
            if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float)) or val <= 0):
                raise ArmError(f"{where}.{name}.{key}: expected a positive number, got {val!r}")
        hi, mx = raw.get("memory_high_mb"), raw.get("memory_max_mb")
        if hi is not None and mx is not None and hi > mx:
            raise ArmError(f"{where}.{name}: memory_high_mb ({hi}) above memory_max_mb ({mx}) can never be reached")
        return cls(name=name, description=str(raw.get("description", "")), scope=scope,
                   memory_max_mb=mx, memory_high_mb=hi, pids_max=raw.get("pids_max"),
                   policy=policy, rules=dict(rules))

    @property
    def limits(self) -> dict:
        return {k: getattr(self, k) for k in LIMIT_KEYS if getattr(self, k) is not None}

    def apply(self, cg: Cgroup) -> None:
        if self.memory_max_mb is not None:
            cg.set_memory_max(int(self.memory_max_mb * MB))
        if self.memory_high_mb is not None:
            cg.set_memory_high(int(self.memory_high_mb * MB))
        if self.pids_max is not None:
            cg.set_pids_max(int(self.pids_max))


class StepPolicy(Protocol):
    """What a policy arm's controller offers ArmPlacement (bpf/controller.py: Controller)."""
    def add_step(self, cg: Cgroup, kind: str | None = None) -> None: ...   # limits + start acting on it
    def remove_step(self, cg: Cgroup) -> dict: ...     # stop; what it did to the step (counts, priority)


class ArmPlacement:
    """Places each step of a trace in `workload/s<step_id>` (pooled: `p<n>`) with the arm's limits (the replayer's
    Placement). Per-step counters = the step cgroup's own + what the workload cgroup itself counted
    during the step (where a trace-scope limit is hit), both local, so nothing is counted twice.

    A policy arm needs its `policy` (the arm's running controller), which then sets each step's
    limits and acts on it; `kind_of(step)` names what the policy's priorities are keyed by (default:
    the step's kind, traces/classify.py `step_kind`). `sample_usage_s`: sample each step's memory usage
    at this period (cgroups/usage.py) and add its integral to the step's counters; off by default, as
    the sampling thread is work the harness's own per-step cost (Experiment 4) should not include."""

    def __init__(self, arm: Arm, workload: Cgroup, controllers: tuple[str, ...], *, nest_in=None,
                 pool: bool = False, policy: StepPolicy | None = None, kind_of: Callable | None = None,
                 sample_usage_s: float | None = None):
        if arm.policy is not None and policy is None:
            raise ArmError(f"arm {arm.name}: policy {arm.policy!r} needs its controller "
                           "(ArmPlacement(..., policy=bpf.controller.policy_for(arm)))")
        self.arm, self.workload, self.controllers = arm, workload, controllers
        self.policy, self.kind_of = policy, kind_of or step_kind
        # nest_in(): the cgroup steps are made under when it is not the workload itself (a
        # container's cgroup, known once the executor has started it: cgroups/container.py)
        self.nest_in = nest_in
        if arm.scope == "trace":
            arm.apply(workload)
        # The workload's own (local) event counters move only where it carries a limit; reading
        # them otherwise costs every step ~0.1 ms for zeros. Set True if something else limits it.
        self.workload_limited = arm.scope == "trace" and bool(arm.limits) or policy is not None
        self.step_cg: Cgroup | None = None
        self._before: Counters | None = None
        # pool: step cgroups `p<n>` made ahead and removed behind, off the critical path (pool.py)
        self.pool = StepPool(self._new_step_cgroup) if pool else None
        self.sampler: UsageSampler | None = None
        if sample_usage_s:
            self.sample_usage(sample_usage_s)

    def sample_usage(self, period_s: float) -> None:
        """From the next step on, sample each step's memory usage every `period_s` (cgroups/usage.py):
        its integral lands in the step's counters as usage_mib_ms (usage_samples readings)."""
        if self.sampler is None:
            self.sampler = UsageSampler(period_s)

    def _new_step_cgroup(self, name: str) -> Cgroup:
        cg = (self.nest_in() if self.nest_in else self.workload).child(name, self.controllers)
        if self.policy is None and self.arm.scope == "step":
            self.arm.apply(cg)
        elif self.policy is not None and self.arm.pids_max is not None:
            cg.set_pids_max(int(self.arm.pids_max))    # the policy sets memory limits only
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
        if self.policy is not None:       # the policy sets the step's limits (before its program runs)
            try:
                self.policy.add_step(self.step_cg, self.kind_of(step))
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
        if self.step_cg is not None and self.step_cg.populated():   # an empty cgroup has nothing to kill
            self.step_cg.kill()

    def end_step(self, step) -> dict[str, float]:
        cg, self.step_cg = self.step_cg, None
        usage = self.sampler.stop() if self.sampler else {}
        try:
            deadline = time.monotonic() + 5.0
            while cg.populated() and time.monotonic() < deadline:   # killed processes take a moment to go
                time.sleep(0.002)
            own = cg.counters()
            env = self._workload_counters().minus(self._before)
            if env.events_hierarchical:      # v2 < 5.2: the workload's memory.events include the step's
                env = _without(env, own)
        finally:                                     # also when reading counters failed
            acted = self.policy.remove_step(cg) if self.policy is not None else {}
            self.pool.retire(cg) if self.pool else cg.remove()
        return {"peak_bytes": own.peak_bytes, "cpu_usec": own.cpu_usec,
                "high_events": own.high_events + env.high_events,
                "max_events": own.max_events + env.max_events,
                "oom_kills": own.oom_kills + env.oom_kills,
                "pids_max_events": own.pids_max_events + env.pids_max_events, **usage, **acted}


def _without(env: Counters, own: Counters) -> Counters:
    """The workload's own events, from hierarchical counts that include the step's (one step runs
    at a time per placement, so the step is the only child that counted during it)."""
    return Counters(env.peak_bytes, env.cpu_usec, max(0, env.high_events - own.high_events),
                    max(0, env.max_events - own.max_events), max(0, env.oom_kills - own.oom_kills),
                    env.pids_max_events)
