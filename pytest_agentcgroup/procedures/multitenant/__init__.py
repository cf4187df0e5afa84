"""The multitenant study (`kind = "multitenant"`, the shipped exp3): a browser agent (A), a bash agent
in a container (B) and a noisy neighbour (C: CPU hog, fork bomb, allocation stress) at once, under
each arm. Settings and hypotheses: its `[experiments.<name>]` (checked at load by
studies/multitenant.py); one test per arm of it (--agentcgroup-arms selects).

Each tenant has its own cgroup under the test's workload cgroup: `A` (the browser: web app,
Playwright, chromium — one process tree, so it carries the arm's hard ceiling, if any, on the tenant
cgroup), `B` (its container's cgroup nests there, each tool call a cgroup below it with the arm's
per-step limits or policy), `C` (the tenant-level pids limit that contains the fork bomb, plus the
arm's limits per step). In arms whose rules give cpu weights by priority, each tenant's cgroup gets
the weight of its priority in the study's tenants table (A, B high; C low). A and B run alone first
(solo), then all three together, A and B repeating their traces until C is done.

Printed per arm (table.py): per-tenant step-latency distributions (solo and with C), A's page-load
times, B's test-step (pytest/...) spread, OOM kills per tenant, forks refused in C, the host probe,
and every claim of the arm with its values and verdict.

May import: arms, cgroups.container, replay, tenants.browser, traces.corpus, studies (claims, kinds,
multitenant), the harness (experiment), procedures.outcome and this package's modules.
"""
from __future__ import annotations

import threading

import pytest

from ...arms import Rules
from ...cgroups.container import cgroup_parent, steps_in_container
from ...harness import experiment as harness_exp
from ...metrics.records import percentile
from ...replay import ExecutorUnavailable, make_executor
from ...studies import claims, kinds
from ...studies.multitenant import RUN_METRICS, TENANT_METRICS, figures
from ...tenants.browser import BrowserTenant, missing as browser_missing
from ...traces.corpus import Corpus
from ..outcome import StudyOutcome
from . import table
from .tenants import Probe, Tenant, replay_steps

METRICS = {**TENANT_METRICS, **RUN_METRICS}


def run(request: pytest.FixtureRequest, study, exp, part: str | None = None, arm: str | None = None) -> StudyOutcome:
    """One arm's run (`arm`: the test's agentcgroup_arm): A and B alone, then A, B and C at once;
    the outcome holds the arm's claims' verdicts and what kept the run from measuring."""
    if arm is None:
        pytest.fail(f"{request.node.nodeid}: a multitenant study runs one arm per test: "
                    "agentcgroup_study(arm=agentcgroup_arm)", pytrace=False)
    arm_name = arm                           # one test per selected arm of the study (harness/collect.py)
    workload_cgroup, agentcgroup_tree, agentcgroup_placement, capsys = (
        request.getfixturevalue(f) for f in ("workload_cgroup", "agentcgroup_tree", "agentcgroup_placement", "capsys"))
    why = browser_missing()
    if why:
        pytest.skip(f"tenant A: {why}")
    engine = request.getfixturevalue("agentcgroup_docker")     # skips naming what is missing (tenant B)
    arm = study.arms[arm_name]
    corpus = Corpus.open(study.traces)
    tenants = exp.tables["tenants"]
    ta, tb, tc = tenants["A"], tenants["B"], tenants["C"]
    traces_a = [corpus.load(t) for t in corpus.ids(ta["subset"])]
    trace_b = corpus.load(tb["trace"])
    traces_c = [corpus.load(t) for t in tc["traces"]]
    tree, controllers = agentcgroup_tree, agentcgroup_tree.controllers
    try:
        engine.ensure_image()        # built once (debootstrap), outside every measurement
    except ExecutorUnavailable as exc:
        pytest.skip(f"tenant B: {exc}")

    # the arm's cpu weights by priority (policy arms' rules), given to each tenant's cgroup: CPU is
    # shared by weight between siblings, so this is the level where A and B compete with C
    weights = Rules.from_arm(arm).cpu_weight if arm.policy is not None else {}
    if weights and "cpu" not in controllers:
        pytest.skip(f"arm {arm_name} sets cpu weights and this host gives the run no cpu controller "
                    f"(controllers: {', '.join(controllers)})")

    def tenant(name: str, phase: str) -> Tenant:
        cg = workload_cgroup.child(f"{name}-{phase}", controllers, inner=name != "A")   # A: chromium joins it
        if name == "A" and arm.memory_max_mb is not None:
            cg.set_memory_max(int(arm.memory_max_mb * 1024 * 1024))    # the browser: one process tree
        if name == "C":
            cg.set_pids_max(int(tc["pids_max"]))
        weight = weights.get(tenants[name]["priority"])
        if weight is not None:
            cg.set_cpu_weight(weight)
        return Tenant(name, phase, cg, arm, weight)

    def run_a(t: Tenant, until: threading.Event | None = None, rounds: int = 1) -> None:
        bt = BrowserTenant(action_timeout_s=ta["action_timeout_s"])
        steps = {(tr.trace_id, s.step_id): s for tr in traces_a for s in tr.steps}
        n = 0
        while n < rounds or (until is not None and not until.is_set()):
            bt.replay(traces_a, place=t.cg, on_step=lambda r: t.add(r, steps[(r.trace_id, r.step_id)], "browser"))
            t.error = t.error or bt.error
            n += 1

    def run_b(t: Tenant, until: threading.Event | None = None, rounds: int = 1) -> None:
        n = 0
        while n < rounds or (until is not None and not until.is_set()):
            ex = make_executor("docker", time_scale=1.0, step_timeout_s=tb["step_timeout_s"], engine=engine,
                               cgroup_parent=cgroup_parent(tree, t.cg))
            placement = agentcgroup_placement(arm, t.cg, nest_in=steps_in_container(tree, t.cg, ex),
                                              kind_of=None, trace=trace_b)
            replay_steps(t, trace_b, ex, placement, "docker")
            n += 1

    def run_c(t: Tenant, until: threading.Event) -> None:
        ex = make_executor("sandbox", time_scale=1.0, step_timeout_s=tc["step_timeout_s"])
        for trace in traces_c:
            if until.is_set():                  # the run is being interrupted
                return
            replay_steps(t, trace, ex, agentcgroup_placement(arm, t.cg, trace=trace), "sandbox")

    def guarded(t: Tenant, fn, *args, **kw):
        def body():
            try:
                fn(t, *args, **kw)
            except ExecutorUnavailable as exc:
                t.error = f"unavailable: {exc}"
            except Exception as exc:            # reported per tenant; the test fails on it below
                t.error = f"{type(exc).__name__}: {exc}"
            except BaseException as exc:        # pytest skip/fail, KeyboardInterrupt: re-raised in the test
                t.raised = exc
        return body

    def reraise(*tenants: Tenant) -> None:
        """A skip or failure a tenant's thread raised, raised again here, where pytest sees it."""
        for t in tenants:
            if t.raised is not None:
                raise t.raised

    phases: dict[str, Tenant] = {}
    probe = Probe(exp.tables["probe"]["period_ms"] / 1000)

    def measure():
        # Solo baselines, one after the other, then the three at once.
        a0, b0 = tenant("A", "solo"), tenant("B", "solo")
        guarded(a0, run_a, rounds=ta["rounds_solo"])()
        reraise(a0)
        guarded(b0, run_b, rounds=tb["rounds_solo"])()
        reraise(b0)
        a1, b1, c1 = tenant("A", "with-C"), tenant("B", "with-C"), tenant("C", "with-A+B")
        phases.update({"A-solo": a0, "B-solo": b0, "A": a1, "B": b1, "C": c1})
        c_done = threading.Event()
        threads = [threading.Thread(target=guarded(a1, run_a, until=c_done), name="tenant-A"),
                   threading.Thread(target=guarded(b1, run_b, until=c_done), name="tenant-B")]

        def c_body():
            try:
                guarded(c1, run_c, until=c_done)()
            finally:
                c_done.set()
        threads.append(threading.Thread(target=c_body, name="tenant-C"))
        probe.start()
        for th in threads:
            th.start()
        try:
            for th in threads:
                th.join()
        except BaseException:
            # Ctrl-C (or a failure) here: no tenant may outlive the test. Each stops at its next
            # check; what runs now (steps, chromium, the container) dies with the workload cgroup.
            c_done.set()
            workload_cgroup.kill()
            for th in threads:
                th.join(timeout=60)
            raise
        finally:
            c_done.set()
            probe.stop.set()
            probe.join()
        reraise(*phases.values())

    # asked for once nothing can skip the test any more (pytest-benchmark warns of one skipped after it)
    benchmark = request.getfixturevalue("benchmark")
    benchmark.group = exp.name
    benchmark.pedantic(measure, rounds=1, iterations=1, warmup_rounds=0)

    s = {k: t.summary() for k, t in phases.items()}
    probe_p99 = percentile(probe.late_ms, 99)
    a_ratio = table.ratio(s["A"]["page_load_p95_ms"], s["A-solo"]["page_load_p95_ms"])
    b_ratio = table.ratio(s["B"]["latency_p95_ms"], s["B-solo"]["latency_p95_ms"])

    lines = table.lines(s, arm, a_ratio, b_ratio, probe_p99)
    overall = {"page_load_ratio": a_ratio, "b_p95_ratio": b_ratio, "probe_p99_ms": probe_p99}
    harness_exp.publish(request, figures(s, overall))      # claims comparing arms: checked at the session's end
    verdicts = claims.check(kinds.claims_of(exp, arm=arm_name), {arm_name: figures(s, overall)}, {})
    lines += [str(v) for v in verdicts]
    with capsys.disabled():                            # output capture would swallow the table
        print("\n" + "\n".join(lines))

    benchmark.extra_info.update({
        "experiment": exp.name, "arm": arm_name, "limits": arm.limits,
        "tenants": {k: {m: METRICS[m].describe(v) for m, v in row.items() if m in METRICS} for k, row in s.items()},
        "metrics": {m: METRICS[m].describe(v) for m, v in overall.items()},
        "claims": [str(v) for v in verdicts],
        "table": lines,
    })

    # -- what must hold for the run to measure anything; the hypotheses are the claims ------------
    problems = []
    for key in ("A-solo", "B-solo", "A", "B"):
        if s[key]["error"] and "unavailable" in s[key]["error"]:
            pytest.skip(f"tenant {key[0]}: {s[key]['error']}")
    for key in ("A-solo", "B-solo", "A", "B", "C"):
        if s[key]["error"] and key[0] != "A":
            problems.append(f"tenant {key}: {s[key]['error']}")
        if s[key]["steps"] == 0:
            problems.append(f"tenant {key} replayed no step")
    if s["A"]["oom_kills"] == 0 and s["A"]["failed_steps"]:
        problems.append(f"tenant A: {s['A']['failed_steps']} browser step(s) failed without an OOM kill "
                        f"({s['A']['error'] or 'see the step records'})")
    return StudyOutcome(f"{exp.name} under arm {arm_name}", verdicts, problems)
