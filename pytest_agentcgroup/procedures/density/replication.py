"""The replication test of a density study: AgentCgroup's own evaluation set-up — three agents at
once, one high and two low priority, under a shared budget, replaying memory footprints at 50x —
under no policy, memory.high only (`bpf-soft`, the control arm their evaluation lacked) and
memory.high + BPF (`agentcgroup`), printed beside their published figures (PUBLISHED).

May import: config (swept_arm), studies (claims, kinds, density), metrics.records, the harness
(experiment), procedures.outcome and this package's agents.
"""
from __future__ import annotations

import os
import time

import pytest

from ... import config as cfgmod
from ...harness import experiment as harness_exp
from ...metrics.records import percentile
from ...studies import claims, kinds
from ...studies import density as dens
from ...studies.density import METRICS
from ..outcome import StudyOutcome
from .agents import bench_for, fmt, killed, layout, peak_mb, prioritized, with_agent_priorities

#: AgentCgroup's published evaluation figures (three concurrent cgroups, one high and two low
#: priority, memory footprints replayed at 50-100x): their numbers, not ours, printed beside ours.
PUBLISHED = {"survival_no_policy_pct": 66.0, "survival_bpf_pct": 100.0,
             "high_p95_alloc_no_policy_ms": 70.97, "high_p95_alloc_bpf_ms": 50.14, "high_p95_alloc_change_pct": -29.0}


def run(request: pytest.FixtureRequest, study, exp, rep: dict) -> StudyOutcome:
    """Each arm of `rep` (the replication table) runs its rounds of 1 high + 2 low agents under the
    budget; printed beside AgentCgroup's published figures; the outcome holds the claims on
    survival_pct and high_p95_alloc_ms."""
    tmp_path, capsys = request.getfixturevalue("tmp_path"), request.getfixturevalue("capsys")
    selected = harness_exp.arms(request, study, exp)
    arm_names = [a for a in rep["arms"] if a in selected]
    if not arm_names:
        pytest.skip(f"no arm of [experiments.{exp.name}.replication] ({', '.join(rep['arms'])}) is selected "
                    f"({', '.join(selected)})")
    # the cgroup fixtures once the settings are known: a config without the study skips before anything is made
    workload_cgroup, agentcgroup_tree, agentcgroup_placement = (
        request.getfixturevalue(f) for f in ("workload_cgroup", "agentcgroup_tree", "agentcgroup_placement"))
    bench = bench_for(request, workload_cgroup, agentcgroup_tree, agentcgroup_placement, study, exp, tmp_path,
                   time_scale=rep.get("time_scale"), step_timeout_s=rep.get("step_timeout_s"))
    traces = [rep["high"], *rep["low"]]
    group = [dens.Agent(0, rep["high"], "high")] + [dens.Agent(i + 1, t, "low") for i, t in enumerate(rep["low"])]
    peaks = {t: peak_mb(bench.corpus.load(t)) for t in traces}
    agent_peaks = [peaks[t][0] + rep["base_mb"] for t in traces]
    why = dens.budget_problem(rep["budget_mb"], agent_peaks, agent_peaks)
    if why:
        pytest.fail(f"{study.path}: experiments.{exp.name}.replication: {why} (peaks include base_mb)", pytrace=False)

    results: dict[str, dict] = {}

    def measure():
        for arm_name in arm_names:
            arm = study.arms[arm_name]
            where = f"experiments.{exp.name}.replication"
            if arm_name in rep["arm_overrides"]:
                arm = cfgmod.swept_arm(arm, rep["arm_overrides"][arm_name], where)
            if prioritized(arm):
                arm = with_agent_priorities(arm, where)
            results[arm_name] = out = {"arm": arm, "runs": [], "skipped": None}
            try:
                for r in range(rep["rounds"]):
                    out["runs"] += bench.run(f"rep{r}", group, arm, budget_mb=rep["budget_mb"],
                                             base_mb=rep["base_mb"], log_alloc_of={0})
            except pytest.skip.Exception as exc:
                out["skipped"] = str(exc)

    # asked for once nothing can skip the test any more (pytest-benchmark warns of one skipped after it)
    benchmark = request.getfixturevalue("benchmark")
    benchmark.group = exp.name
    start = time.monotonic()
    benchmark.pedantic(measure, rounds=1, iterations=1, warmup_rounds=0)
    wall_s = time.monotonic() - start

    figures = {}
    for arm_name, out in results.items():
        runs = out["runs"]
        high = [x for r in runs if r.agent.priority == "high" for x in r.allocations_ms()]
        figures[arm_name] = {
            "survival_pct": dens.survival([r.oom_kills > 0 or r.policy_kills > 0 for r in runs]),
            "high_p95_alloc_ms": percentile(high, 95), "chunks": len(high),
            "oom_kills": sum(r.oom_kills for r in runs), "completed": sum(1 for r in runs if r.completed),
            "agents": len(runs), "throttles": sum(x.get("throttles", 0) for r in runs for x in r.records),
            "killed": killed(runs),
            "high_tool_ms": percentile([r.tool_ms for r in runs if r.agent.priority == "high" and r.tool_ms], 50),
        }

    role = {"unlimited": "no policy", "bpf-soft": "memory.high only, no BPF (the control they lacked)",
            "agentcgroup": "memory.high + BPF"}
    lines = [f"Experiment 5 — AgentCgroup's set-up: 1 high + 2 low agents at once under a {rep['budget_mb']:g} MiB budget, "
             f"{1 / bench.time_scale:g}x speed, {rep['base_mb']:g} MiB base memory per agent, {rep['rounds']} round(s) "
             f"({layout(agentcgroup_tree)}; load average {os.getloadavg()[0]:.2f}, {wall_s:.0f} s)",
             "  high: " + rep["high"] + "; low: " + ", ".join(rep["low"]) + "; step peaks (MiB, provenance): "
             + ", ".join(f"{t.split('/', 1)[-1]} {p:g} ({prov})" for t, (p, prov) in peaks.items()),
             f"{'':<80}{'OOM survival':>14}{'high p95 alloc':>16}{'samples':>8}{'OOM':>5}{'thr':>6}  killed",
             f"{'AgentCgroup, published: no policy':<80}{PUBLISHED['survival_no_policy_pct']:>12.0f} %"
             f"{PUBLISHED['high_p95_alloc_no_policy_ms']:>13.2f} ms",
             f"{'AgentCgroup, published: BPF':<80}{PUBLISHED['survival_bpf_pct']:>12.0f} %"
             f"{PUBLISHED['high_p95_alloc_bpf_ms']:>13.2f} ms   ({PUBLISHED['high_p95_alloc_change_pct']:+.0f} %)"]
    for arm_name, out in results.items():
        label = f"ours (measured): {arm_name} — {role.get(arm_name, 'arm')}"
        if out["skipped"]:
            lines.append(f"{label:<80}skipped: {out['skipped']}")
            continue
        f = figures[arm_name]
        lines.append(f"{label:<80}{fmt(f['survival_pct'], '.0f'):>12} %{fmt(f['high_p95_alloc_ms']):>13} ms"
                     f"{f['chunks']:>8}{f['oom_kills']:>5}{f['throttles']:>6}  {f['killed'] or '-'}")
    base, dyn = figures.get("unlimited"), figures.get("agentcgroup")
    if base and dyn and base["high_p95_alloc_ms"] and dyn["high_p95_alloc_ms"] is not None:
        change = 100.0 * (dyn["high_p95_alloc_ms"] - base["high_p95_alloc_ms"]) / base["high_p95_alloc_ms"]
        lines.append(f"ours, no policy -> BPF (derived): survival {fmt(base['survival_pct'], '.0f')} % -> "
                     f"{fmt(dyn['survival_pct'], '.0f')} %, high p95 allocation {fmt(base['high_p95_alloc_ms'])} -> "
                     f"{fmt(dyn['high_p95_alloc_ms'])} ms ({change:+.0f} %); theirs: 66 % -> 100 %, 70.97 -> 50.14 ms (-29 %)")
    lines.append("  ours: allocation latency = wall time to allocate and touch one MiB in the high agent's tool calls "
                 "(recorded per MiB, p95 derived; theirs: per allocation event of their footprint replayer); "
                 "survival = agents with no kernel-counted OOM kill and no policy kill (derived)")
    with capsys.disabled():
        print("\n" + "\n".join(lines))

    benchmark.extra_info.update({
        "experiment": exp.name, "part": "agentcgroup-replication", "budget_mb": rep["budget_mb"],
        "published": PUBLISHED,
        "arms": {a: {"survival_pct": METRICS["survival_pct"].describe(f["survival_pct"]),
                     "high_p95_alloc_ms": METRICS["high_p95_alloc_ms"].describe(f["high_p95_alloc_ms"]),
                     "oom_kills": METRICS["oom_kills"].describe(f["oom_kills"])} for a, f in figures.items()},
        "table": lines,
    })

    # its claims name only replication arms (checked at load), `*` reads each of them
    absent = harness_exp.not_run(exp, results, {a: o["skipped"] for a, o in results.items() if o["skipped"]},
                                 arms=rep["arms"])
    verdicts = claims.check(kinds.claims_of(exp, test="replication", arms=rep["arms"]),
                            {a: {m: f[m] for m in ("survival_pct", "high_p95_alloc_ms")} for a, f in figures.items()},
                            absent)
    if verdicts:
        with capsys.disabled():
            print("\n".join(str(v) for v in verdicts))
    benchmark.extra_info["claims"] = [str(v) for v in verdicts]
    return StudyOutcome(f"{exp.name} AgentCgroup replication", verdicts, bench.harness)
