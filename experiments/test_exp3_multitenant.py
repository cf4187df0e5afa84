"""Experiment 3 — multi-tenant isolation: a browser agent (A), a bash agent in a container (B) and a
noisy neighbour (C: CPU hog, fork bomb, allocation stress) at once, under each arm.

Settings and hypotheses: `[experiments.exp3]` of the config file (experiments/agentcgroup.toml),
checked at load by studies/multitenant.py; one test per arm of it (--agentcgroup-arms selects).
Each tenant has its own cgroup under the test's
workload cgroup: `A` (the browser: web app, Playwright, chromium — one process tree, so it carries
the arm's hard ceiling, if any, on the tenant cgroup), `B` (its container's cgroup nests there, each
tool call a cgroup below it with the arm's per-step limits or policy), `C` (the tenant-level pids
limit that contains the fork bomb, plus the arm's limits per step). In arms whose rules give cpu
weights by priority, each tenant's cgroup gets the weight of its priority in [experiments.exp3.tenants] (A, B high;
C low). A and B run alone first (solo), then all three together, A and B repeating their traces until
C is done.

Printed per arm: per-tenant step-latency distributions (solo and with C), A's page-load times, B's
test-step (pytest/...) spread, OOM kills per tenant, forks refused in C, the host probe, and every
claim of the arm with its values and verdict (a refuted one fails the test).
"""
from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest

from pytest_agentcgroup.arms import Arm, Rules
from pytest_agentcgroup.cgroups.container import cgroup_parent, steps_in_container
from pytest_agentcgroup.harness import experiment as harness_exp
from pytest_agentcgroup.studies import claims, kinds
from pytest_agentcgroup.studies.multitenant import RUN_METRICS, TENANT_METRICS, figures
from pytest_agentcgroup.metrics.records import percentile, step_record
from pytest_agentcgroup.replay import ExecutorUnavailable, make_executor, replay
from pytest_agentcgroup.tenants.browser import BrowserTenant, missing as browser_missing
from pytest_agentcgroup.traces.classify import classify_command
from pytest_agentcgroup.traces.corpus import Corpus

pytestmark = pytest.mark.experiment(name="exp3")
METRICS = {**TENANT_METRICS, **RUN_METRICS}


class Probe(threading.Thread):
    """Sleeps `period` over and over in the pytest process and records how late it woke up."""

    def __init__(self, period_s: float):
        super().__init__(daemon=True)
        self.period_s, self.late_ms, self.stop = period_s, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            time.sleep(self.period_s)
            self.late_ms.append((time.monotonic() - t - self.period_s) * 1000)


class Tenant:
    """One tenant's cgroup, records and OOM count; `replay_*` run its traces once."""

    def __init__(self, name: str, phase: str, cg, arm: Arm, cpu_weight: int | None = None):
        self.name, self.phase, self.cg, self.arm, self.cpu_weight = name, phase, cg, arm, cpu_weight
        self.records: list[dict] = []
        self.error: str | None = None
        self.raised: BaseException | None = None     # a skip/fail/interrupt in the tenant's thread

    def add(self, result, step, executor: str) -> None:
        rec = step_record(result, step, config=self.arm.name, time_scale=1.0, executor=executor)
        rec.update(tenant=self.name, phase=self.phase)
        self.records.append(rec)

    def summary(self) -> dict:
        done = [r for r in self.records if r["executed"] and r["latency_ms"] is not None]
        lat = [r["latency_ms"] for r in done]
        loads = [r["page_load_ms"] for r in done if r.get("page_load_ms")]
        tests = [r["latency_ms"] for r in done if r["tool"] == "bash" and classify_command(r["cmd"] or "") == "test"]
        c = self.cg.counters()
        return {
            "tenant": self.name, "phase": self.phase, "steps": len(self.records),
            "failed_steps": sum(1 for r in self.records if _failed(r)),
            "latency_p50_ms": percentile(lat, 50), "latency_p95_ms": percentile(lat, 95),
            "latency_p99_ms": percentile(lat, 99),
            "page_load_p50_ms": percentile(loads, 50), "page_load_p95_ms": percentile(loads, 95),
            "test_step_stdev_ms": statistics.stdev(tests) if len(tests) > 1 else None,
            "test_step_p95_ms": percentile(tests, 95),
            # the kernel's count: per-step cgroups (in the records) + the tenant cgroup itself
            "oom_kills": sum(r["oom_kills"] for r in self.records if self.name != "A") + c.oom_kills,
            "pids_max_events": sum(r.get("pids_max_events", 0) for r in self.records) + c.pids_max_events,
            "throttles": sum(r.get("throttles", 0) for r in self.records),
            "cpu_s": c.cpu_usec / 1e6 if c.cpu_usec is not None else None, "cpu_weight": self.cpu_weight,
            "error": self.error,
        }


def _failed(rec: dict) -> bool:
    """A step that did not complete: a browser action that failed or was never reached (the browser
    died), or a command that could not be started. A command's own non-zero exit is its result."""
    if rec["tool"] == "browser":
        return rec["executed"] and rec["exit_code"] != 0 or (rec.get("error") or "").startswith("the browser")
    return bool(rec.get("error"))


def _replay_steps(tenant: Tenant, trace, executor, placement, executor_name: str) -> None:
    steps = {s.step_id: s for s in trace.steps}
    replay(trace, executor, placement, on_step=lambda r: tenant.add(r, steps[r.step_id], executor_name))


def test_exp3_multitenant(agentcgroup_arm, request, benchmark, workload_cgroup, agentcgroup_tree,
                          agentcgroup_placement, capsys):
    arm_name = agentcgroup_arm               # one test per selected arm of [experiments.exp3] (harness/collect.py)
    study, exp = harness_exp.experiment(request.config, "exp3")
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
                                              kind_of=None)
            _replay_steps(t, trace_b, ex, placement, "docker")
            n += 1

    def run_c(t: Tenant, until: threading.Event) -> None:
        ex = make_executor("sandbox", time_scale=1.0, step_timeout_s=tc["step_timeout_s"])
        for trace in traces_c:
            if until.is_set():                  # the run is being interrupted
                return
            _replay_steps(t, trace, ex, agentcgroup_placement(arm, t.cg), "sandbox")

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

    benchmark.group = "exp3"
    benchmark.pedantic(measure, rounds=1, iterations=1, warmup_rounds=0)

    s = {k: t.summary() for k, t in phases.items()}
    probe_p99 = percentile(probe.late_ms, 99)
    a_ratio = _ratio(s["A"]["page_load_p95_ms"], s["A-solo"]["page_load_p95_ms"])
    b_ratio = _ratio(s["B"]["latency_p95_ms"], s["B-solo"]["latency_p95_ms"])

    fmt = lambda v: "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))   # noqa: E731
    cols = [("tenant", 6), ("phase", 8), ("steps", 5), ("failed_steps", 6), ("latency_p50_ms", 8),
            ("latency_p95_ms", 8), ("latency_p99_ms", 8), ("page_load_p50_ms", 8), ("page_load_p95_ms", 8),
            ("test_step_p95_ms", 8), ("test_step_stdev_ms", 8), ("oom_kills", 4), ("pids_max_events", 7), ("throttles", 4),
            ("cpu_s", 6), ("cpu_weight", 6)]
    heads = ["tenant", "phase", "steps", "failed", "p50 ms", "p95 ms", "p99 ms", "load p50", "load p95",
             "test p95", "test sd", "OOM", "pids.max", "thr", "cpu s", "weight"]
    lines = [f"Experiment 3 — multi-tenant isolation, arm {arm_name} (limits {arm.limits or 'none'}"
             f"{', policy ' + arm.policy if getattr(arm, 'policy', None) else ''}); latencies recorded here, "
             "on a shared 2-core host: noisy",
             "  ".join(h.rjust(w) if i > 1 else h.ljust(w) for i, (h, (_, w)) in enumerate(zip(heads, cols)))]
    for key in ("A-solo", "A", "B-solo", "B", "C"):
        row = s[key]
        lines.append("  ".join(fmt(row[k]).rjust(w) if i > 1 else fmt(row[k]).ljust(w) for i, (k, w) in enumerate(cols)))
    lines.append(f"A page-load p95 with C / alone: {fmt(a_ratio)}x; B step p95 with C / alone: {fmt(b_ratio)}x; "
                 f"host probe p99 lateness while C ran: {fmt(probe_p99)} ms; load average {_loadavg()}")
    for key, row in s.items():
        if row["error"]:
            lines.append(f"tenant {key}: {row['error']}")
    run = {"page_load_ratio": a_ratio, "b_p95_ratio": b_ratio, "probe_p99_ms": probe_p99}
    harness_exp.publish(request, figures(s, run))      # claims comparing arms: checked at the session's end
    verdicts = claims.check(kinds.claims_of(exp, arm=arm_name), {arm_name: figures(s, run)}, {})
    lines += [str(v) for v in verdicts]
    with capsys.disabled():                            # output capture would swallow the table
        print("\n" + "\n".join(lines))

    benchmark.extra_info.update({
        "experiment": "exp3", "arm": arm_name, "limits": arm.limits,
        "tenants": {k: {m: METRICS[m].describe(v) for m, v in row.items() if m in METRICS} for k, row in s.items()},
        "metrics": {m: METRICS[m].describe(v) for m, v in run.items()},
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
    harness_exp.outcome(verdicts, f"exp3 under arm {arm_name}", problems)


def _loadavg() -> str:
    """The host's 1/5/15-minute load average as the kernel reports it (a shared machine's context)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _ratio(a, b):
    return round(a / b, 3) if a is not None and b else None
