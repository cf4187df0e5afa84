"""Records and the gate where the two cgroup layouts count differently: a memory peak the kernel
does not offer (v2 before 5.19: None, never a made-up number), and soft-limit breaches (v1: a few
upward crossings per step; v2: every reclaim above memory.high, hundreds)."""
from __future__ import annotations

from pytest_agentcgroup.metrics import gate
from pytest_agentcgroup.metrics.records import SUMMARY_METRICS, step_record, summarize
from pytest_agentcgroup.replay.replayer import StepResult
from pytest_agentcgroup.reports.frames import per_test_frame
from pytest_agentcgroup.traces.ir import Measure, Profile, Step


def _record(peak_bytes, high_events=0, trace="t/a", step_id=0):
    res = StepResult(trace, step_id, "bash", "x", True, 12.0, 0, None, False, "synthetic",
                     counters={"peak_bytes": peak_bytes, "cpu_usec": 1000, "high_events": high_events,
                               "max_events": 0, "oom_kills": 0})
    step = Step(step_id, "bash", {"command": "x"}, duration_ms=Measure(10, "synthetic"),
                profile=Profile(peak_mb=Measure(30, "synthetic")))
    return {"experiment": "exp1", "run": "r", "seed": 0, "params": {},
            **step_record(res, step, config="static-high", time_scale=1.0, executor="emulate")}


def test_an_unknown_peak_is_null_in_the_record_and_left_out_of_the_trace_peak():
    recs = [_record(None), _record(40 << 20, step_id=1)]
    assert recs[0]["max_rss_mb"] is None and recs[1]["max_rss_mb"] == 40.0
    assert summarize(recs, "static-high")["total_steps"] == 2
    row = per_test_frame(recs).iloc[0]
    assert row["peak_rss_mb"] == 40.0
    only_unknown = per_test_frame([_record(None)]).iloc[0]
    assert only_unknown["peak_rss_mb"] is None or only_unknown["peak_rss_mb"] != only_unknown["peak_rss_mb"]  # None/NaN


def test_soft_limit_breaches_are_gated_by_steps_not_by_layout_dependent_event_counts():
    v1 = [_record(1, high_events=1, step_id=0), _record(1, high_events=0, step_id=1), _record(1, high_events=2, step_id=2)]
    v2 = [_record(1, high_events=187, step_id=0), _record(1, high_events=0, step_id=1), _record(1, high_events=412, step_id=2)]
    assert summarize(v1, "a")["mem_high_steps"] == summarize(v2, "a")["mem_high_steps"] == 2
    m = SUMMARY_METRICS["mem_high_steps"]
    assert (m.unit, m.better, m.provenance) == ("count", "lower", "derived")
    rules = gate.parse_rules(gate.DEFAULT_RULES)
    assert "mem_high_steps" in [r.metric for r in rules] and "mem_high_events_total" not in [r.metric for r in rules]
    # the same steps breaching, counted by a v1 baseline and a v2 run: no regression
    assert not gate.compare(gate.per_test(v1), gate.per_test(v2), rules).failed
    # one more step above the soft limit is within +1, two more are not
    worse = [_record(1, high_events=5, step_id=i) for i in range(3)] + [_record(1, high_events=5, step_id=3)]
    verdict = gate.compare(gate.per_test(v1), gate.per_test(worse), rules)
    # (the extra step also changes executed_steps, gated exactly by its own rule: not this test's concern)
    assert [(f.rule.metric, f.baseline, f.now) for f in verdict.regressions
            if f.rule.metric.startswith("mem_high")] == [("mem_high_steps", 2, 4)]


def test_a_cpu_weight_the_step_could_not_take_is_in_its_record_with_why():
    res = StepResult("t/a", 0, "bash", "x", True, 12.0, 0, None, False, "synthetic",
                     counters={"cpu_usec": 1000, "kind": "test", "priority": "low", "cpu_weight": None,
                               "cpu_weight_missing": "/sys/fs/cgroup/x: no cpu.weight"})
    step = Step(0, "bash", {"command": "x"}, duration_ms=Measure(10, "synthetic"))
    rec = step_record(res, step, config="agentcgroup", time_scale=1.0, executor="emulate")
    assert rec["cpu_weight"] is None and rec["cpu_weight_missing"] == "/sys/fs/cgroup/x: no cpu.weight"
    res.counters.update(cpu_weight=25, cpu_weight_missing=None)
    rec = step_record(res, step, config="agentcgroup", time_scale=1.0, executor="emulate")
    assert rec["cpu_weight"] == 25 and "cpu_weight_missing" not in rec


def test_the_run_trees_of_xdist_workers_merge_into_what_every_one_had():
    from pytest_agentcgroup.harness.environment import merge_run_trees
    a = {"controllers": ["memory", "pids", "cpu"], "refused": {}}
    b = {"controllers": ["memory", "pids"], "refused": {"cpu": "w1: the kernel refused +cpu"}}
    assert merge_run_trees([]) is None
    assert merge_run_trees([a]) == a
    assert merge_run_trees([a, b]) == {"controllers": ["memory", "pids"], "refused": {"cpu": "w1: the kernel refused +cpu"}}
