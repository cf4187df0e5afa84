"""Arms: the resource-control configurations an experiment compares. Arms are data (TOML):

    [arms.static-toolcall]
    description = "a child cgroup per tool call with a fixed per-step limit"
    memory_max_mb = 512          # hard limit: above it the kernel reclaims, then OOM-kills
    memory_high_mb = 384         # soft limit (v2 memory.high; v1: see Cgroup.set_memory_high)
    pids_max = 512
    cpu_weight = 100             # share of CPU against sibling cgroups: 1..10000 (v2 cpu.weight;
                                 # v1 cpu.shares = weight x 1024 / 100, clamped to 2..262144)
    cpu_max = "50000 100000"     # CPU cap "QUOTA PERIOD" in us (v2 cpu.max; v1 cfs_quota/period_us)
    # cpu_max_cpus = 0.5         # ... or as a number of CPUs (quota = cpus x a 100 ms period)
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
CPU_KEYS = ("cpu_weight", "cpu_max", "cpu_max_cpus")
CPU_PERIOD_US = 100_000                     # the period of cpu_max_cpus (both kernels' default)
# the kernel's bounds: a quota of at least 1 ms, a period of 1 ms .. 1 s (v1 and v2 alike)
CPU_QUOTA_MIN_US, CPU_PERIOD_RANGE_US = 1000, (1000, 1_000_000)


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
    cpu_weight: int | None = None
    cpu_max: str | None = None                                         # "QUOTA PERIOD" (us)
    cpu_max_cpus: float | None = None                                  # or a number of CPUs
    policy: str | None = None                                          # e.g. "agentcgroup"
    rules: dict = field(default_factory=dict, hash=False)              # the policy's rules, as written

    @classmethod
    def from_dict(cls, name: str, raw: dict, *, where: str = "arms") -> "Arm":
        if not isinstance(raw, dict):
            raise ArmError(f"{where}.{name}: expected a table, got {type(raw).__name__}")
        unknown = set(raw) - {"description", "scope", "policy", "rules", *LIMIT_KEYS, *CPU_KEYS}
        if unknown:
            raise ArmError(f"{where}.{name}: unknown key(s) {', '.join(sorted(unknown))}; "
                           f"expected description, scope, policy, rules, {', '.join(LIMIT_KEYS + CPU_KEYS)}")
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
        if raw.get("cpu_weight") is not None:
            check_cpu_weight(raw["cpu_weight"], f"{where}.{name}.cpu_weight")
        if raw.get("cpu_max") is not None and raw.get("cpu_max_cpus") is not None:
            raise ArmError(f"{where}.{name}: cpu_max and cpu_max_cpus both set; give the cap once")
        if raw.get("cpu_max") is not None:
            _cpu_max(raw["cpu_max"], f"{where}.{name}.cpu_max")
        cpus = raw.get("cpu_max_cpus")
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float))
                                 or cpus * CPU_PERIOD_US < CPU_QUOTA_MIN_US):
            raise ArmError(f"{where}.{name}.cpu_max_cpus: expected a number of CPUs >= "
                           f"{CPU_QUOTA_MIN_US / CPU_PERIOD_US} (1 ms per 100 ms period), got {cpus!r}")
        return cls(name=name, description=str(raw.get("description", "")), scope=scope,
                   memory_max_mb=mx, memory_high_mb=hi, pids_max=raw.get("pids_max"),
                   cpu_weight=raw.get("cpu_weight"), cpu_max=raw.get("cpu_max"), cpu_max_cpus=cpus,
                   policy=policy, rules=dict(rules))

    @property
    def limits(self) -> dict:
        return {k: getattr(self, k) for k in LIMIT_KEYS + CPU_KEYS if getattr(self, k) is not None}

    @property
    def needs_cpu(self) -> bool:
        """Whether the arm sets anything only the cpu controller can do: its own weight or cap. Its
        policy rules' weights by priority do not count: without a cpu controller the policy leaves
        them out (and counts it), so an arm that controls memory still runs where cpu is not delegated."""
        return any(getattr(self, k) is not None for k in CPU_KEYS)

    @property
    def cpu_quota(self) -> tuple[int, int] | None:
        """(quota_us, period_us) of the arm's CPU cap, or None."""
        if self.cpu_max is not None:
            return _cpu_max(self.cpu_max, f"arms.{self.name}.cpu_max")
        if self.cpu_max_cpus is not None:
            return round(self.cpu_max_cpus * CPU_PERIOD_US), CPU_PERIOD_US
        return None

    def apply(self, cg: Cgroup) -> None:
        if self.memory_max_mb is not None:
            cg.set_memory_max(int(self.memory_max_mb * MB))
        if self.memory_high_mb is not None:
            cg.set_memory_high(int(self.memory_high_mb * MB))
        if self.pids_max is not None:
            cg.set_pids_max(int(self.pids_max))
        self.apply_cpu(cg)

    def apply_cpu(self, cg: Cgroup) -> None:
        """The arm's CPU weight and cap (a policy arm's controller may then set a weight by priority)."""
        if self.cpu_weight is not None:
            cg.set_cpu_weight(int(self.cpu_weight))
        if self.cpu_quota is not None:
            cg.set_cpu_max(*self.cpu_quota)


def check_cpu_weight(val, where: str) -> int:
    """A cpu weight as cgroup v2 takes it: an integer 1..10000 (ArmError naming `where`)."""
    if isinstance(val, bool) or not isinstance(val, int) or not 1 <= val <= 10000:
        raise ArmError(f"{where}: expected an integer 1..10000 (cgroup v2 cpu.weight; 100 = an ordinary "
                       f"task), got {val!r}")
    return val


def _cpu_max(val, where: str) -> tuple[int, int]:
    """ "QUOTA PERIOD" in microseconds -> (quota, period), within the kernel's bounds."""
    parts = val.split() if isinstance(val, str) else []
    lo, hi = CPU_PERIOD_RANGE_US
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) < CPU_QUOTA_MIN_US \
            or not lo <= int(parts[1]) <= hi:
        raise ArmError(f"{where}: expected \"QUOTA PERIOD\" in microseconds (quota >= {CPU_QUOTA_MIN_US}, "
                       f"period {lo}..{hi}, e.g. \"50000 100000\" for half a CPU), got {val!r}")
    return int(parts[0]), int(parts[1])


class StepPolicy(Protocol):
    """What a policy arm's controller offers ArmPlacement (bpf/controller.py: Controller)."""
    def add_step(self, cg: Cgroup, kind: str | None = None, *,
                 time_scale: float = 1.0) -> None: ...   # limits + start acting on it; its timers x time_scale
    def remove_step(self, cg: Cgroup) -> dict: ...     # stop; what it did to the step (counts, priority)


class ArmPlacement:
    """Places each step of a trace in `workload/s<step_id>` (pooled: `p<n>`) with the arm's limits (the replayer's
    Placement). Per-step counters = the step cgroup's own + what the workload cgroup itself counted
    during the step (where a trace-scope limit is hit), both local, so nothing is counted twice.

    A policy arm needs its `policy` (the arm's running controller), which then sets each step's
    limits and acts on it; `kind_of(step)` names what the policy's priorities are keyed by (default:
    the step's kind, traces/classify.py `step_kind`). `sample_usage_s`: sample each step's memory usage
    at this period (cgroups/usage.py) and add its integral to the step's counters; off by default (the
    bare per-step cost Experiment 4's step test measures has no sampler), on for every experiment
    replay (harness/fixtures.py), so an experiment's latencies, Experiment 4's per-arm overhead
    included, count the 20 ms sampling thread as part of the harness."""

    def __init__(self, arm: Arm, workload: Cgroup, controllers: tuple[str, ...], *, nest_in=None,
                 pool: bool = False, policy: StepPolicy | None = None, kind_of: Callable | None = None,
                 time_scale: float = 1.0, sample_usage_s: float | None = None):
        if arm.policy is not None and policy is None:
            raise ArmError(f"arm {arm.name}: policy {arm.policy!r} needs its controller "
                           "(ArmPlacement(..., policy=bpf.controller.policy_for(arm)))")
        self.arm, self.workload, self.controllers = arm, workload, controllers
        self.policy, self.kind_of = policy, kind_of or step_kind
        # how fast the steps replay (the emulate executor's time_scale; 1 for real commands): a
        # policy's timers run at the same pace (bpf/controller.py, "One time rule")
        self.time_scale = time_scale
        # nest_in(): the cgroup steps are made under when it is not the workload itself (a
        # container's cgroup, known once the executor has started it: cgroups/container.py)
        self.nest_in = nest_in
        if arm.scope == "trace":
            arm.apply(workload)
        # The workload's own (local) event counters move only where it carries a limit; reading
        # them otherwise costs every step file reads for zeros. Set True if something else limits it.
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
        elif self.policy is not None:       # the policy sets memory limits and the priority's cpu weight
            if self.arm.pids_max is not None:
                cg.set_pids_max(int(self.arm.pids_max))
            self.arm.apply_cpu(cg)
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
                self.policy.add_step(self.step_cg, self.kind_of(step), time_scale=self.time_scale)
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
