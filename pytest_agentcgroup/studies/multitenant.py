"""The multitenant study (`kind = "multitenant"`, the shipped exp3) — multi-tenant isolation. The
pure part: the settings of its `[experiments.<name>]` (the three tenants and the probe), checked at
load, and the metrics one arm's test measures, which its claims read. The tenants themselves:
procedures/multitenant/.

    [experiments.exp3]
    kind = "multitenant"
    arms = ["unlimited", "static-env", ...]         # arms of [arms]; one test per arm
    claims = ["*.c_pids_max_events >= 1", "agentcgroup.a_oom_kills == 0"]
    [experiments.exp3.tenants.A]  priority, subset, rounds_solo, action_timeout_s   (the browser agent)
    [experiments.exp3.tenants.B]  priority, trace, rounds_solo, step_timeout_s      (the bash agent)
    [experiments.exp3.tenants.C]  priority, traces, pids_max, step_timeout_s        (the noisy neighbour)
    [experiments.exp3.probe]      period_ms

A claim reads `<arm>.<tenant>_<metric>`: the tenant with C next door (`a_`, `b_`, `c_`) or alone
(`a_solo_`, `b_solo_`), e.g. `b_latency_p95_ms`, `b_solo_latency_p95_ms`, `a_oom_kills`; or one of
the run's own figures (`page_load_ratio`, `b_p95_ratio`, `probe_p99_ms`). Each arm is its own test:
a claim on one arm (or `*`: every arm, each on its own) is checked in that arm's test, a claim
comparing arms at the end of the session (harness/controller.py).

May import: metrics.metric (Metric), studies.tables.
"""
from __future__ import annotations

from ..arms import PRIORITIES
from ..metrics.metric import Metric
from .tables import TableError, number, table, trace_list

TABLES = ("tenants", "probe")
KEYS = ()                    # besides description, arms, claims, TABLES: each tenant has its own settings
PER_ARM_TEST = True               # each arm is its own test: claims comparing arms wait for the session end

#: a tenant's figures (one row per tenant and phase)
TENANT_METRICS = {m.name: m for m in (
    Metric("latency_p50_ms", "ms", "lower", "derived", "median step latency (browser action | fork to reap)"),
    Metric("latency_p95_ms", "ms", "lower", "derived", "95th percentile (linear) of step latency"),
    Metric("latency_p99_ms", "ms", "lower", "derived", "99th percentile (linear) of step latency"),
    Metric("page_load_p50_ms", "ms", "lower", "derived", "median Navigation Timing loadEventEnd (tenant A)"),
    Metric("page_load_p95_ms", "ms", "lower", "derived", "95th percentile of page-load time (tenant A)"),
    Metric("test_step_stdev_ms", "ms", "lower", "derived", "standard deviation of B's test-step latencies"),
    Metric("test_step_p95_ms", "ms", "lower", "derived", "95th percentile of B's test-step latencies"),
    Metric("oom_kills", "count", "lower", "recorded", "kernel OOM kills in the tenant's cgroups (steps + tenant)"),
    Metric("pids_max_events", "count", "lower", "recorded", "forks refused at a pids limit (pids.events max)"),
    Metric("throttles", "count", "lower", "recorded", "policy arms: in-kernel SIGSTOPs of the tenant's steps"),
    Metric("cpu_s", "s", "none", "recorded", "CPU time of the tenant's cgroup (v2 cpu.stat usage_usec, all its processes)"),
    Metric("cpu_weight", "weight", "none", "recorded", "cpu weight set on the tenant's cgroup (none: the default, 100)"),
    Metric("steps", "count", "none", "recorded", "steps replayed"),
    Metric("failed_steps", "count", "lower", "recorded", "steps that did not complete (error, crash, not reached)"),
)}
#: the run's own figures
RUN_METRICS = {m.name: m for m in (
    Metric("page_load_ratio", "ratio", "lower", "derived", "A's page-load p95 with C / alone"),
    Metric("b_p95_ratio", "ratio", "lower", "derived", "B's step-latency p95 with C / alone"),
    Metric("probe_p99_ms", "ms", "lower", "derived", "p99 lateness of a 10 ms sleeper in the pytest process while C ran"),
)}
#: the phases' keys in the test (A-solo, A, ...) and their prefix in a claim's metric name
PHASES = {"A-solo": "a_solo", "A": "a", "B-solo": "b_solo", "B": "b", "C": "c"}
#: metric -> the test that measures it
CLAIM_METRICS = {**{f"{p}_{m}": "multitenant" for p in PHASES.values() for m in TENANT_METRICS},
                 **{m: "multitenant" for m in RUN_METRICS}}


def figures(summaries: dict[str, dict], run: dict) -> dict:
    """One arm's claim figures: each phase's tenant metrics under its prefix, and the run's own."""
    out = {f"{PHASES[k]}_{m}": v for k, row in summaries.items() if k in PHASES
           for m, v in row.items() if m in TENANT_METRICS}
    return {**out, **{m: v for m, v in run.items() if m in RUN_METRICS}}


def validate(tables: dict, where: str, arms: dict) -> dict:
    """The tenants and probe tables of a multitenant study, checked; TableError names the key."""
    for name in TABLES:
        if name not in tables:
            raise TableError(f"{where}: missing table [{where}.{name}]")
    raw = tables["tenants"]
    t = table(raw, f"{where}.tenants", {"A", "B", "C"}, set())
    here = f"{where}.tenants"
    a = table(t["A"], f"{here}.A", {"subset", "rounds_solo", "action_timeout_s"}, {"priority"})
    b = table(t["B"], f"{here}.B", {"trace", "rounds_solo", "step_timeout_s"}, {"priority"})
    c = table(t["C"], f"{here}.C", {"traces", "pids_max", "step_timeout_s"}, {"priority"})
    for name, tenant in (("A", a), ("B", b), ("C", c)):
        tenant.setdefault("priority", "normal")
        if tenant["priority"] not in PRIORITIES:
            raise TableError(f"{here}.{name}.priority: expected one of {', '.join(PRIORITIES)}, got {tenant['priority']!r}")
    if not isinstance(a["subset"], str) or not a["subset"]:
        raise TableError(f"{here}.A.subset: expected a manifest subset, or comma-separated subsets and trace ids")
    if not isinstance(b["trace"], str) or not b["trace"]:
        raise TableError(f"{here}.B.trace: expected a trace id")
    c["traces"] = trace_list(c["traces"], f"{here}.C.traces")
    number(a["rounds_solo"], f"{here}.A.rounds_solo", least=1, strict=False, integer=True)
    number(b["rounds_solo"], f"{here}.B.rounds_solo", least=1, strict=False, integer=True)
    number(a["action_timeout_s"], f"{here}.A.action_timeout_s")
    number(b["step_timeout_s"], f"{here}.B.step_timeout_s")
    number(c["step_timeout_s"], f"{here}.C.step_timeout_s")
    number(c["pids_max"], f"{here}.C.pids_max", least=1, strict=False, integer=True)
    p = table(tables["probe"], f"{where}.probe", {"period_ms"}, set())
    number(p["period_ms"], f"{where}.probe.period_ms")
    return {"tenants": {"A": a, "B": b, "C": c}, "probe": p}


