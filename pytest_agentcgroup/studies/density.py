"""The density study (`kind = "density"`, the shipped exp5) — K agents under one host memory
budget. The pure part (no cgroups, no processes): the settings of its `[experiments.<name>]` and
their checks, which agent replays which trace at which priority, the budget arithmetic, what "held"
means for one K and the largest K held, and what each figure of its two tests (PARTS) is (METRICS).
The agents themselves: procedures/density/.

    [experiments.exp5]
    kind = "density"
    [experiments.exp5.density]
    traces = ["claude-code/local/pydicom__pydicom-2065", ...]   # agent i replays traces[i % n]
    k = [1, 2, 3, 4, 6]            # agents at once, stepped up (K = 1 is agent 0's solo run)
    budget_mb = 2560               # the parent cgroup's hard limit, shared by the K agents
    high_agents = 1                # policy arms: agents 0 .. high_agents-1 high priority, the rest low
    stagger_ms = 250               # agent i starts i * stagger_ms after agent 0
    slowdown_p95_max = 3.0         # the latency budget: p95 over the agents of (tool time / solo tool time)
    stop_at_first_failure = true   # stop stepping K up once a K is not held (a load ramp)

    [experiments.exp5.replication]  # AgentCgroup's own evaluation set-up (1 high + 2 low)
    high = "claude-code/local/dask__dask-11628"
    low = ["claude-code/local/sigmavirus24__github3.py-673", "claude-code/local/sigmavirus24__github3.py-673"]
    arms = ["unlimited", "bpf-soft", "agentcgroup"]   # no policy | memory.high only | memory.high + BPF
    budget_mb = 512
    base_mb = 100                  # memory each agent holds for its whole run (their `base_memory_mb`)
    time_scale = 0.02              # 50x
    rounds = 1
    arm_overrides = { agentcgroup = { memory_high_mb = 128 }, bpf-soft = { memory_high_mb = 128 } }

    claims = ["agentcgroup.survival_pct >= bpf-soft.survival_pct"]   # studies/claims.py; CLAIM_METRICS
"""
from __future__ import annotations

from dataclasses import dataclass

from ..metrics.metric import Metric
from .tables import TableError, number as _number, table as _table, trace_list as _trace_list

#: the priority labels a policy arm's placement keys each agent's steps by (they replace the step
#: kinds: every step of an agent has the agent's priority), and what they map to
AGENT_PRIORITY_KINDS = {"agent-high": "high", "agent-low": "low"}

TABLES = ("density", "replication")
KEYS = ("time_scale", "step_timeout_s")    # besides description, arms, claims, TABLES (emulate only)
#: its two tests: K stepped up under one budget, and AgentCgroup's own set-up (each reads its table)
PARTS = ("density", "replication")
#: metric -> the test (part) that measures it (a claim reads the metrics of one test)
CLAIM_METRICS = {"largest_k_held": "density", "survival_pct": "replication", "high_p95_alloc_ms": "replication"}

REPLICATION_METRICS = ("survival_pct", "high_p95_alloc_ms")
#: what each figure of its tests is (the benchmark JSON's extra_info, and the metrics a claim reads)
METRICS = {m.name: m for m in (
    Metric("traces_completed", "count", "higher", "recorded", "agents whose every step ran to its end (exit 0)"),
    Metric("oom_kills", "count", "lower", "recorded",
           "kernel OOM kills in the agents' cgroups (v2 memory.events.local | v1 memory.oom_control oom_kill)"),
    Metric("slowdown_p95", "ratio", "lower", "derived",
           "95th percentile over the agents of tool time (sum of step wall clock) / the same agent's solo tool time"),
    Metric("largest_k_held", "count", "higher", "derived",
           "largest stepped K with no kill, every trace completed and p95 slowdown within the budget"),
    Metric("survival_pct", "%", "higher", "derived", "agents that finished without an OOM kill"),
    Metric("high_p95_alloc_ms", "ms", "lower", "derived",
           "95th percentile of the high agent's allocation latency: wall time to allocate and touch one MiB "
           "in the emulator (recorded per MiB, replay/emulator.c ALLOC_LOG)"),
)}


@dataclass(frozen=True)
class Agent:
    index: int
    trace_id: str
    priority: str            # "high" | "low": used by policy arms with eBPF only

    @property
    def kind(self) -> str:
        return f"agent-{self.priority}"


def claim_arms(metric: str, tables: dict, where: str) -> tuple[str, list[str]] | None:
    """The replication test runs the arms of [<where>.replication], not the experiment's: a claim
    on its metrics names those (kinds.parse_claims; `where`: the experiment's table, experiments.<name>)."""
    if metric in REPLICATION_METRICS and "replication" in tables:
        return f"[{where}.replication] arms", list(tables["replication"]["arms"])
    return None


def agents(traces: list[str], k: int, high_agents: int) -> list[Agent]:
    """The K agents: agent i replays traces[i % len(traces)]; the first `high_agents` are high."""
    return [Agent(i, traces[i % len(traces)], "high" if i < high_agents else "low") for i in range(k)]


def budget_problem(budget_mb: float, peaks_mb: list[float], k_max_peaks_mb: list[float]) -> str | None:
    """Why a budget does not test density, or None. It must hold every agent alone (else a solo run
    fails whatever the arm) and be below the sum of the largest K's peaks (else it never binds)."""
    if peaks_mb and max(peaks_mb) >= budget_mb:
        return (f"budget_mb {budget_mb:g} MiB does not hold the largest agent alone (peak "
                f"{max(peaks_mb):g} MiB): every arm would fail its solo run")
    if sum(k_max_peaks_mb) <= budget_mb:
        return (f"budget_mb {budget_mb:g} MiB is not below the sum of the largest K's peaks "
                f"({sum(k_max_peaks_mb):g} MiB): the budget never binds")
    return None


def slowdown(tool_ms: float | None, solo_ms: float | None) -> float | None:
    """An agent's tool time under K over its tool time alone."""
    if tool_ms is None or not solo_ms:
        return None
    return tool_ms / solo_ms


def held(kills: int, completed: int, agents_n: int, slowdown_p95: float | None, limit: float) -> bool:
    """One K is held when every agent completed its trace, nothing was killed, and the p95 slowdown
    is within the latency budget."""
    return kills == 0 and completed == agents_n and slowdown_p95 is not None and slowdown_p95 <= limit


def largest_k_held(results: dict[int, bool], ks: list[int]) -> int:
    """The largest stepped K such that it and every smaller stepped K held (0: not even the first).
    A K that was not run (the ramp stopped before it) ends the count like a K that failed."""
    best = 0
    for k in sorted(ks):
        if not results.get(k, False):
            break
        best = k
    return best


def survival(oom_killed: list[bool]) -> float | None:
    """Percentage of agents that finished without an OOM kill."""
    if not oom_killed:
        return None
    return 100.0 * sum(1 for x in oom_killed if not x) / len(oom_killed)


# -- settings ------------------------------------------------------------------------------------

def validate(tables: dict, where: str, arms: dict) -> dict:
    """The density/replication tables of an experiment, checked; TableError names the key."""
    out = {}
    if "density" in tables:
        out["density"] = _density(tables["density"], f"{where}.density")
    if "replication" in tables:
        out["replication"] = _replication(tables["replication"], f"{where}.replication", arms)
    return out


def _density(raw, where: str) -> dict:
    d = _table(raw, where, {"traces", "k", "budget_mb"},
               {"high_agents", "stagger_ms", "slowdown_p95_max", "stop_at_first_failure"})
    d["traces"] = _trace_list(d["traces"], f"{where}.traces")
    ks = d["k"]
    if not isinstance(ks, list) or not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks) \
            or ks != sorted(set(ks)):
        raise TableError(f"{where}.k: expected a non-empty increasing list of integers >= 1, got {ks!r}")
    _number(d["budget_mb"], f"{where}.budget_mb")
    d.setdefault("high_agents", 1)
    _number(d["high_agents"], f"{where}.high_agents", strict=False, integer=True)
    d.setdefault("stagger_ms", 0)
    _number(d["stagger_ms"], f"{where}.stagger_ms", strict=False)
    d.setdefault("slowdown_p95_max", 3.0)
    _number(d["slowdown_p95_max"], f"{where}.slowdown_p95_max", least=1.0, strict=False)
    d.setdefault("stop_at_first_failure", True)
    if not isinstance(d["stop_at_first_failure"], bool):
        raise TableError(f"{where}.stop_at_first_failure: expected true or false")
    return d


def _replication(raw, where: str, arms: dict) -> dict:
    r = _table(raw, where, {"high", "low", "arms", "budget_mb"},
               {"base_mb", "time_scale", "rounds", "arm_overrides", "step_timeout_s"})
    if not isinstance(r["high"], str) or not r["high"]:
        raise TableError(f"{where}.high: expected a trace id")
    r["low"] = _trace_list(r["low"], f"{where}.low")
    if not isinstance(r["arms"], list) or not r["arms"]:
        raise TableError(f"{where}.arms: expected a non-empty list of arm names")
    for a in r["arms"]:
        if a not in arms:
            raise TableError(f"{where}.arms: no arm named {a!r} (defined: {', '.join(arms)})")
    _number(r["budget_mb"], f"{where}.budget_mb")
    r.setdefault("base_mb", 0)
    _number(r["base_mb"], f"{where}.base_mb", strict=False)
    if "time_scale" in r:
        _number(r["time_scale"], f"{where}.time_scale")
    if "step_timeout_s" in r:
        _number(r["step_timeout_s"], f"{where}.step_timeout_s")
    r.setdefault("rounds", 1)
    _number(r["rounds"], f"{where}.rounds", least=1, strict=False, integer=True)
    over = r.setdefault("arm_overrides", {})
    if not isinstance(over, dict) or any(a not in arms or not isinstance(o, dict) for a, o in over.items()):
        raise TableError(f"{where}.arm_overrides: expected a table of arm name -> {{ arm key = value }} "
                           f"for defined arms ({', '.join(arms)})")
    return r

