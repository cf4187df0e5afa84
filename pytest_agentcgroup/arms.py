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

A hard limit can also come from each step itself instead of one number (scope "step" only):

    [arms.oracle]
    limit_from = "step_peak"     # each step's hard limit = its own recorded peak (profile peak_mb) ...
    margin_mb = 6                # ... plus this much: what a step cgroup holds beside the step's memory

That is the limit a policy that knew the future would set (metrics/reservation.py: the oracle); a
step without a recorded peak gets no limit. Arm.step_memory_max_mb gives the hard limit of a step.

Or from what the arm knows before the step runs (limits/: computed per tool call, never from the
step's own peak), each with its knobs as keys of the arm (LIMIT_KNOBS: defaults, checked at load):

    [arms.vpa]
    limit_from = "vpa"           # Kubernetes VPA's recommender over the trace's earlier steps' peaks
    percentile = 0.9             # of a decaying histogram (VPA's buckets) of those peaks ...
    margin_fraction = 0.15       # ... plus 15 %
    # half_life_steps = 20       # a peak's weight halves every 20 tool calls (absent: no decay)
    oom_bump_ratio = 1.2         # after a step is OOM-killed, the next limit is at least
    oom_min_bump_mb = 100        #   max(its limit x 1.2, its limit + 100 MiB)
    floor_mb = 250               # never below (VPA's pod-recommendation-min-memory-mb)
    cold_start_mb = 250          # the first step's limit (no earlier step: VPA has no recommendation)
    [arms.window]
    limit_from = "window"        # Autopilot's moving window over the last `window` peaks
    window = 10
    statistic = "max"            # or "percentile" (nearest rank) with percentile = 0.95
    # oom_bump_ratio = 1.2       # a killed step counts as max(its limit x 1.2, its limit + 100 MiB)
    # oom_min_bump_mb = 100      #   (absent: as the limit it reached)
    [arms.predict]
    limit_from = "predict"       # a quantile of the step's command class's peaks, from a model
    model = "predict-recorded.json"   # relative to the config file (`agentcgroup predict train`)
    quantile = 0.95
    folds = "task"               # each trace gets the fold that held out its task (or "repository")
    history = true               # and never below the largest peak of its class earlier in the trace

`margin_mb` is added to every per-step limit. On a policy arm (policy = "agentcgroup", with
memory_max_mb and without memory_high_mb) the computed limit is each step's soft limit instead: a
low-priority step is held there and granted room up to the ceiling (bpf/controller.py), so a
misprediction costs a stall, not a kill.

Steps always run in their own child cgroup, whatever the scope, so every arm measures each step the
same way; the scope only decides which cgroup carries the limits.

A policy arm adds a controller that acts on each step while it runs:

    [arms.agentcgroup]
    policy = "agentcgroup"       # the dynamic arm (bpf/controller.py); scope is always "step"
    memory_high_mb = 512         # the soft limit the policy acts at
    memory_max_mb = 2048         # the hard ceiling
    [arms.agentcgroup.rules]     # the policy's own rules (hold times, priorities, ...): its Rules

A policy arm's rules are data too (Rules below, checked at load so a bad value is one ArmError
naming its key); bpf/controller.py shows the table and what each rule does. Both are plain data:
placing an arm's limits on cgroups is cgroups/placement.py's, running its policy bpf/controller.py's.

May import: nothing of the package.
"""
from __future__ import annotations

from dataclasses import dataclass, field

MB = 1024 * 1024                            # the arms' limits are in MiB

SCOPES = ("step", "trace")
LIMIT_SOURCES = ("step_peak", "vpa", "window", "predict")   # limit_from: where a per-step hard limit comes from
#: Each limit source's knobs (arm keys) and their defaults; None: absent unless set.
LIMIT_KNOBS = {
    "step_peak": {},
    "vpa": {"percentile": 0.9, "margin_fraction": 0.15, "half_life_steps": None, "oom_bump_ratio": 1.2,
            "oom_min_bump_mb": 100.0, "floor_mb": 250.0, "cold_start_mb": 250.0},
    "window": {"window": 10, "statistic": "max", "percentile": None, "margin_fraction": 0.0, "floor_mb": 0.0,
               "cold_start_mb": 250.0, "oom_bump_ratio": None, "oom_min_bump_mb": None},
    "predict": {"model": None, "quantile": 0.95, "folds": "task", "min_class_steps": 3, "history": False},
}
WINDOW_STATISTICS, PREDICT_FOLDS = ("max", "percentile"), ("task", "repository")
_KNOB_KEYS = sorted({k for knobs in LIMIT_KNOBS.values() for k in knobs})
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
    limit_from: str | None = None                                      # "step_peak": a hard limit per step
    margin_mb: float | None = None                                     # MiB on top of it
    rules: dict = field(default_factory=dict, hash=False)              # the policy's rules, as written
    knobs: dict = field(default_factory=dict, hash=False)              # limit_from's knobs (LIMIT_KNOBS)

    @classmethod
    def from_dict(cls, name: str, raw: dict, *, where: str = "arms") -> "Arm":
        if not isinstance(raw, dict):
            raise ArmError(f"{where}.{name}: expected a table, got {type(raw).__name__}")
        unknown = set(raw) - {"description", "scope", "policy", "rules", "limit_from", "margin_mb",
                              *LIMIT_KEYS, *CPU_KEYS, *_KNOB_KEYS}
        if unknown:
            raise ArmError(f"{where}.{name}: unknown key(s) {', '.join(sorted(unknown))}; expected description, "
                           f"scope, policy, rules, limit_from, margin_mb, {', '.join(LIMIT_KEYS + CPU_KEYS)} "
                           f"(and a limit_from's knobs: {', '.join(_KNOB_KEYS)})")
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
        _check_limit_from(raw, scope, policy, f"{where}.{name}")
        knobs = _knobs(raw, f"{where}.{name}")
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
                   policy=policy, rules=dict(rules), limit_from=raw.get("limit_from"),
                   margin_mb=raw.get("margin_mb", 0.0 if raw.get("limit_from") else None), knobs=knobs)

    @property
    def limits(self) -> dict:
        own = {k: getattr(self, k) for k in LIMIT_KEYS + CPU_KEYS + ("limit_from", "margin_mb")
               if getattr(self, k) is not None}
        return {**own, **{k: v for k, v in self.knobs.items() if v is not None}}

    @property
    def as_written(self) -> dict:
        """The arm's table as from_dict reads it (its knobs as keys): what a matrix point overrides."""
        out = {k: v for k, v in vars(self).items() if k not in ("name", "knobs") and v is not None}
        return {**out, **{k: v for k, v in self.knobs.items() if v is not None}}

    def step_memory_max_mb(self, step_peak_mb: float | None) -> float | None:
        """The hard limit (MiB) a step of this arm runs under, given the step's recorded peak: the
        arm's memory_max_mb, or with limit_from = "step_peak" the step's own peak + margin_mb (None,
        no limit, for a step without a recorded peak). Placement sets it, reservation counts it. The
        other limit sources' limits depend on the steps before (limits/): None here, the placement
        records each step's own (its counters' step_limit_mb); on a policy arm, the ceiling."""
        if self.limit_from is None or self.policy is not None:
            return self.memory_max_mb
        if self.limit_from != "step_peak" or step_peak_mb is None:
            return None
        return float(step_peak_mb) + float(self.margin_mb or 0.0)

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


def _check_limit_from(raw: dict, scope: str, policy, where: str) -> None:
    """limit_from and margin_mb: a per-step hard limit from the step's own peak, on step cgroups of a
    static arm, instead of memory_max_mb (ArmError naming the key)."""
    source, margin = raw.get("limit_from"), raw.get("margin_mb")
    if source is None:
        if margin is not None:
            raise ArmError(f"{where}.margin_mb: a margin without limit_from (set limit_from = \"step_peak\")")
        return
    if source not in LIMIT_SOURCES:
        raise ArmError(f"{where}.limit_from: expected one of {', '.join(LIMIT_SOURCES)}, got {source!r}")
    if scope != "step":
        what = "from each step's peak" if source == "step_peak" else f"per step ({source})"
        raise ArmError(f"{where}.limit_from: a limit {what} goes on each step's cgroup; "
                       f"scope must be \"step\", got {scope!r}")
    if policy is not None:      # each step's limit is its soft limit, held and granted up to the ceiling
        if source == "step_peak":
            raise ArmError(f"{where}.limit_from: a policy arm's controller sets its steps' limits; "
                           "limit_from = \"step_peak\" is for static arms")
        if raw.get("memory_high_mb") is not None or raw.get("memory_max_mb") is None:
            raise ArmError(f"{where}: a policy arm with limit_from holds each step at its computed limit (its "
                           "soft limit) up to memory_max_mb, the ceiling: set memory_max_mb, not memory_high_mb")
        return _check_margin(margin, where)
    for key in ("memory_max_mb", "memory_high_mb"):
        if raw.get(key) is not None:
            raise ArmError(f"{where}.{key}: limit_from gives each step its hard limit; remove {key}")
    _check_margin(margin, where)


def _check_margin(margin, where: str) -> None:
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin < 0):
        raise ArmError(f"{where}.margin_mb: expected a number >= 0 (MiB above each step's peak), got {margin!r}")


def _knobs(raw: dict, where: str) -> dict:
    """The limit source's knobs, its defaults filled in (LIMIT_KNOBS); a knob of another source, or a
    value its source cannot use, is an ArmError naming the key."""
    source = raw.get("limit_from")
    own = LIMIT_KNOBS.get(source, {})
    for key in _KNOB_KEYS:
        if key in raw and key not in own:
            users = [s for s, knobs in LIMIT_KNOBS.items() if key in knobs]
            raise ArmError(f"{where}.{key}: a knob of limit_from = {' or '.join(map(repr, users))}; this arm's "
                           f"limit_from is {source!r}" + (f" (its knobs: {', '.join(own)})" if own else ""))
    knobs = {k: raw.get(k, default) for k, default in own.items()}

    def number(key, least, *, strict=False, most=None, integer=False):
        val = knobs[key]
        if val is None:
            return
        ok = not isinstance(val, bool) and isinstance(val, int if integer else (int, float)) \
            and (val > least if strict else val >= least) and (most is None or val <= most)
        if not ok:
            kind = "an integer" if integer else "a number"
            rng = f"{'>' if strict else '>='} {least:g}" + (f" and <= {most:g}" if most is not None else "")
            raise ArmError(f"{where}.{key}: expected {kind} {rng}, got {val!r}")
    if source == "vpa":
        number("percentile", 0, strict=True, most=1)
        number("margin_fraction", 0)
        number("half_life_steps", 0, strict=True)
    if source in ("vpa", "window"):
        number("oom_bump_ratio", 1)
        number("oom_min_bump_mb", 0)
        if (knobs["oom_bump_ratio"] is None) != (knobs["oom_min_bump_mb"] is None):
            raise ArmError(f"{where}: oom_bump_ratio and oom_min_bump_mb go together (a kill's sample is "
                           "max(limit x ratio, limit + MiB))")
    if source == "window":
        number("window", 1, integer=True)
        if knobs["statistic"] not in WINDOW_STATISTICS:
            raise ArmError(f"{where}.statistic: expected one of {', '.join(WINDOW_STATISTICS)}, got {knobs['statistic']!r}")
        if knobs["statistic"] == "max" and knobs["percentile"] is not None:
            raise ArmError(f"{where}.percentile: the window's max takes no percentile (set statistic = \"percentile\")")
        if knobs["statistic"] == "percentile" and knobs["percentile"] is None:
            knobs["percentile"] = 0.95
        number("percentile", 0, strict=True, most=1)
        number("margin_fraction", 0)
    if source in ("vpa", "window"):
        number("floor_mb", 0)
        number("cold_start_mb", 0, strict=True)
    if source == "predict":
        model = knobs["model"]
        if not isinstance(model, str) or not model.strip():
            raise ArmError(f"{where}.model: expected the path of a model file (agentcgroup predict train), got {model!r}")
        number("quantile", 0, strict=True, most=1)
        number("min_class_steps", 1, integer=True)
        if not isinstance(knobs["history"], bool):
            raise ArmError(f"{where}.history: expected true or false, got {knobs['history']!r}")
        if knobs["folds"] not in PREDICT_FOLDS:
            raise ArmError(f"{where}.folds: expected one of {', '.join(PREDICT_FOLDS)}, got {knobs['folds']!r}")
    return knobs


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


PRIORITIES = ("low", "normal", "high")


@dataclass(frozen=True)
class Rules:
    """The dynamic arm's rules: an arm's `rules` table plus the arm's limits (from_arm), or a dict."""
    ebpf: bool = True
    memory_high_mb: float | None = None
    memory_max_mb: float | None = None
    hold_ms: float = 200
    freeze_after: int = 3
    freeze_hold_ms: float = 1000
    kill_after: int = 2
    window_ms: float = 5000
    raise_step_mb: float = 0
    raise_max_mb: float = 0
    priorities: dict = field(default_factory=lambda: {"default": "normal"})
    cpu_weight: dict = field(default_factory=dict)     # priority -> cpu weight (1..10000), where given
    external_loader: tuple = ()

    @classmethod
    def from_dict(cls, raw: dict, *, where: str = "agentcgroup rules") -> "Rules":
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ArmError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected "
                           f"{', '.join(cls.__dataclass_fields__)}")
        for key, val in raw.items():
            if key == "ebpf" and not isinstance(val, bool):
                raise ArmError(f"{where}.ebpf: expected true or false, got {val!r}")
            if key in ("priorities", "external_loader", "ebpf", "cpu_weight") or val is None and key.startswith("memory_"):
                continue
            least = 1 if key == "freeze_after" else 0
            if isinstance(val, bool) or not isinstance(val, (int, float)) or val < least:
                raise ArmError(f"{where}.{key}: expected a number >= {least}, got {val!r}")
        pri = raw.get("priorities", {"default": "normal"})
        if not isinstance(pri, dict):
            raise ArmError(f"{where}.priorities: expected a table (step kind -> low|normal|high)")
        bad = {k: v for k, v in pri.items() if v not in PRIORITIES}
        if bad:
            raise ArmError(f"{where}.priorities: expected one of {', '.join(PRIORITIES)}, got {bad}")
        cpu = raw.get("cpu_weight", {})
        if not isinstance(cpu, dict) or set(cpu) - set(PRIORITIES):
            raise ArmError(f"{where}.cpu_weight: expected a table priority ({', '.join(PRIORITIES)}) -> "
                           f"weight, got {cpu!r}")
        for level, w in cpu.items():
            check_cpu_weight(w, f"{where}.cpu_weight.{level}")
        loader = raw.get("external_loader", ())
        if not isinstance(loader, (list, tuple)) or not all(isinstance(a, str) for a in loader):
            raise ArmError(f"{where}.external_loader: expected an argv list of strings")
        return cls(**{**raw, "priorities": dict(pri), "cpu_weight": dict(cpu), "external_loader": tuple(loader)})

    @classmethod
    def from_arm(cls, arm: Arm) -> "Rules":
        """The rules of a policy arm: its `rules` table plus the arm's own limits."""
        where = f"arms.{arm.name}.rules"
        if arm.policy != "agentcgroup":
            raise ArmError(f"arms.{arm.name}.policy: unknown policy {arm.policy!r}; expected \"agentcgroup\"")
        for key in ("memory_high_mb", "memory_max_mb"):
            if key in arm.rules:
                raise ArmError(f"{where}.{key}: set the limits on the arm itself (arms.{arm.name}.{key})")
        return cls.from_dict({**arm.rules, "memory_high_mb": arm.memory_high_mb,
                              "memory_max_mb": arm.memory_max_mb}, where=where)

    def priority(self, kind: str | None) -> str:
        return self.priorities.get(kind or "", self.priorities.get("default", "normal"))

    @property
    def soft_bytes(self) -> int | None:
        return int(self.memory_high_mb * MB) if self.memory_high_mb is not None else None

    @property
    def ceiling_bytes(self) -> int | None:
        return int(self.memory_max_mb * MB) if self.memory_max_mb is not None else None
