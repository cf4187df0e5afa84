"""The density test of a density study: per arm, every agent first alone under the budget (its solo
run, same arm, same session), then K = 1, 2, ... agents at once (K = 1 is agent 0's solo run). Per
arm and K: traces completed, OOM kills (the kernel's count), each agent's slowdown (its tool time,
the sum of its steps' wall clock, over its solo tool time) and whether K was held (no kill, every
trace completed, p95 slowdown within the budget); then the largest K held.

May import: studies (claims, kinds, density), metrics.records, the harness (experiment),
procedures.outcome and this package's agents.
"""
from __future__ import annotations

import os
import time

import pytest

from ...harness import experiment as harness_exp
from ...metrics.records import percentile
from ...studies import claims, kinds
from ...studies import density as dens
from ...studies.density import METRICS
from ..outcome import StudyOutcome
from .agents import (AgentRun, Bench, bench_for, fmt, killed, layout, peak_mb,
                     prioritized, with_agent_priorities)


def run(request: pytest.FixtureRequest, study, exp, d: dict) -> StudyOutcome:
    """Per arm: every agent alone, then K = 1, 2, ... agents at once under the budget of `d` (the
    density table); the outcome holds the claims on largest_k_held."""
    tmp_path, capsys = request.getfixturevalue("tmp_path"), request.getfixturevalue("capsys")
    # the cgroup fixtures once the settings are known: a config without the study skips before anything is made
    workload_cgroup, agentcgroup_tree, agentcgroup_placement = (
        request.getfixturevalue(f) for f in ("workload_cgroup", "agentcgroup_tree", "agentcgroup_placement"))
    bench = bench_for(request, workload_cgroup, agentcgroup_tree, agentcgroup_placement, study, exp, tmp_path)
    arm_names = harness_exp.arms(request, study, exp)
    ks = d["k"]
    peaks = {t: peak_mb(bench.corpus.load(t)) for t in d["traces"]}
    k_max = dens.agents(d["traces"], ks[-1], d["high_agents"])
    why = dens.budget_problem(d["budget_mb"], [p for p, _ in peaks.values()], [peaks[a.trace_id][0] for a in k_max])
    if why:
        pytest.fail(f"{study.path}: experiments.{exp.name}.density: {why}", pytrace=False)

    results: dict[str, dict] = {}

    def measure():
        for arm_name in arm_names:
            arm = study.arms[arm_name]
            if prioritized(arm):
                arm = with_agent_priorities(arm, f"experiments.{exp.name}.density")
            results[arm_name] = out = {"rows": [], "skipped": None}
            try:
                density_arm(bench, arm, d, out)
            except pytest.skip.Exception as exc:        # e.g. eBPF missing: this arm only
                out["skipped"] = str(exc)

    # asked for once nothing can skip the test any more (pytest-benchmark warns of one skipped after it)
    benchmark = request.getfixturevalue("benchmark")
    benchmark.group = exp.name
    start = time.monotonic()
    benchmark.pedantic(measure, rounds=1, iterations=1, warmup_rounds=0)
    wall_s = time.monotonic() - start

    lines = [f"Experiment 5 — density: K agents under one {d['budget_mb']:g} MiB budget ({layout(agentcgroup_tree)}; "
             f"time scale {bench.time_scale:g}, agent i replays traces[i % {len(d['traces'])}], agent 0 high and the "
             f"rest low priority under policy arms; load average {os.getloadavg()[0]:.2f}, {wall_s:.0f} s)",
             "  agents' traces (largest step peak, MiB, the trace's own provenance): "
             + "; ".join(f"{t.split('/', 1)[-1]} {p:g} ({prov})" for t, (p, prov) in peaks.items()),
             f"  sum of peaks per K (derived): "
             + ", ".join(f"K={k}: {sum(peaks[a.trace_id][0] for a in dens.agents(d['traces'], k, d['high_agents'])):g}"
                         for k in ks),
             "  per K: measured here (kernel OOM counts, wall clock); slowdown = tool time / solo tool time (derived)",
             f"{'arm':<16}{'K':>3}{'done':>6}{'OOM':>5}{'pkill':>6}{'tmo':>5}{'thr':>6}{'frz':>5}"
             f"{'slow p50':>10}{'slow p95':>10}{'slow max':>10}  held  killed (agent: priority)"]
    largest = {}
    for arm_name, out in results.items():
        if out["skipped"]:
            lines.append(f"{arm_name:<16}skipped: {out['skipped']}")
            largest[arm_name] = None
            continue
        for row in out["rows"]:
            lines.append(f"{arm_name:<16}{row['k']:>3}{row['completed']:>4}/{row['k']:<1}{row['oom_kills']:>5}"
                         f"{row['policy_kills']:>6}{row['timeouts']:>5}{row['throttles']:>6}{row['freezes']:>5}"
                         f"{fmt(row['slowdown_p50']):>10}{fmt(row['slowdown_p95']):>10}{fmt(row['slowdown_max']):>10}"
                         f"  {'yes' if row['held'] else 'no ':<4}  {row['killed'] or '-'}")
        largest[arm_name] = dens.largest_k_held({r["k"]: r["held"] for r in out["rows"]}, ks)
        if out.get("stopped"):
            lines.append(f"{'':<16}(stopped stepping K up: K={out['stopped']} was not held)")
    lines.append(f"largest K held (no kill, every trace completed, p95 slowdown <= {d['slowdown_p95_max']:g}x; derived): "
                 + ", ".join(f"{a} {'skipped' if k is None else k}" for a, k in largest.items()))
    with capsys.disabled():
        print("\n" + "\n".join(lines))

    benchmark.extra_info.update({
        "experiment": exp.name, "part": "density", "budget_mb": d["budget_mb"], "k": ks,
        "arms": {a: {"largest_k_held": METRICS["largest_k_held"].describe(largest[a]),
                     "rows": [{"k": r["k"], **{m: METRICS[m].describe(r[m]) for m in ("traces_completed", "oom_kills",
                                                                                          "slowdown_p95")}}
                              for r in out["rows"]], "skipped": out["skipped"]}
                 for a, out in results.items()},
        "table": lines,
    })

    verdicts = claims.check(kinds.claims_of(exp, test="density"),
                            {a: {"largest_k_held": k} for a, k in largest.items()},
                            harness_exp.not_run(exp, results, {a: o["skipped"] for a, o in results.items() if o["skipped"]}))
    if verdicts:
        with capsys.disabled():
            print("\n".join(str(v) for v in verdicts))
    benchmark.extra_info["claims"] = [str(v) for v in verdicts]
    return StudyOutcome(f"{exp.name} density", verdicts, bench.harness)


def density_arm(bench: Bench, arm, d: dict, out: dict) -> None:
    solo: dict[tuple, AgentRun] = {}
    by_priority = prioritized(arm)
    for k in d["k"]:
        group = dens.agents(d["traces"], k, d["high_agents"])
        for a in group:
            key = (a.trace_id, a.priority if by_priority else None)
            if key not in solo:
                solo[key] = bench.run(f"solo{len(solo)}", [dens.Agent(0, a.trace_id, a.priority)], arm,
                                      budget_mb=d["budget_mb"])[0]
        if k == 1:
            runs = [solo[(group[0].trace_id, group[0].priority if by_priority else None)]]
        else:
            runs = bench.run(f"k{k}", group, arm, budget_mb=d["budget_mb"], stagger_ms=d["stagger_ms"])
        slow = [dens.slowdown(r.tool_ms, solo[(r.agent.trace_id, r.agent.priority if by_priority else None)].tool_ms)
                for r in runs]
        slow = [s for s in slow if s is not None]
        kills = sum(r.oom_kills + r.policy_kills for r in runs)
        completed = sum(1 for r in runs if r.completed)
        p95 = percentile(slow, 95) if len(slow) == len(runs) else None
        row = {"k": k, "completed": completed, "traces_completed": completed,
               "oom_kills": sum(r.oom_kills for r in runs), "policy_kills": sum(r.policy_kills for r in runs),
               "timeouts": sum(1 for r in runs for x in r.records if x["timed_out"]),
               "throttles": sum(x.get("throttles", 0) for r in runs for x in r.records),
               "freezes": sum(x.get("freezes", 0) for r in runs for x in r.records),
               "slowdown_p50": percentile(slow, 50), "slowdown_p95": p95, "slowdown_max": max(slow, default=None)}
        row["killed"] = killed(runs)
        row["held"] = dens.held(kills, completed, len(runs), p95, d["slowdown_p95_max"])
        out["rows"].append(row)
        if not row["held"] and d["stop_at_first_failure"]:
            out["stopped"] = k
            return
