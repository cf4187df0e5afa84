"""The regression gate: rules, baselines, and end to end in pytest subprocesses on real cgroups —
halving a static per-step limit (more OOM kills) fails the gate with the regression table; the
unchanged config passes."""
from __future__ import annotations

import json

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, run_study, write_study
from pytest_agentcgroup.metrics import gate
from pytest_agentcgroup.metrics.records import METRICS, SUMMARY_METRICS, summarize


def test_rules_parse_and_follow_each_metrics_better_direction():
    oom, lat, steps = gate.parse_rules("oom_kills=+0, latency_p95_ms=+50%+100,total_steps=exact")
    assert (oom.breaks(1, 1), oom.breaks(1, 2), oom.breaks(2, 1)) == (False, True, False)
    assert lat.limit(200) == 400 and not lat.breaks(200, 400) and lat.breaks(200, 400.5)
    assert steps.breaks(4, 3) and steps.breaks(4, 5) and not steps.breaks(4, 4)
    assert oom.describe_limit(1) == "<= 1" and str(lat) == "latency_p95_ms=+50%+100"
    # the leading + is optional (docs/gate.md, 'Tolerances'): one syntax for the gate and `compare`
    assert gate.parse_rules("oom_kills=0,latency_p95_ms=50%+100") == [oom, lat]
    for bad, says in (("oom=+0", "METRIC=TOLERANCE"), ("oom_kills=-5", r"tolerance must be N, X% or X%\+N"), ("oom_kills", "METRIC=TOLERANCE"),
                      ("total_steps=+1", "no better direction"), ("", "no gate rules"),
                      # per-step metrics are not in a test's summary: a rule on one would never be checked
                      ("throttles=+0", "no per-test metric 'throttles'; expected METRIC=TOLERANCE with METRIC one of .*throttles_total"),
                      ("latency_ms=+10", "no per-test metric 'latency_ms'")):
        with pytest.raises(gate.GateError, match=says):
            gate.parse_rules(bad)


def _rec(arm, trace, step, oom=0, latency=100.0, **extra):
    return {"experiment": "exp1", "config": arm, "trace_id": trace, "step_id": step, "executed": True,
            "latency_ms": latency, "mem_high_events": 0, "mem_max_events": 0, "oom_kills": oom,
            "timed_out": False, **extra}


def test_every_per_step_counter_is_summed_in_the_summary_and_described_as_derived():
    counters = [m.name for m in METRICS.values() if m.provenance == "recorded" and m.unit == "count"]
    rec = {**_rec("a", "t/a", 0), **{c: i + 1 for i, c in enumerate(counters)}}
    s = summarize([rec, rec], "a")
    for c in counters:
        total = c if c == "oom_kills" else f"{c}_total"      # oom_kills keeps its name (baselines, gate rules)
        assert s[total] == 2 * rec[c], total
        assert SUMMARY_METRICS[total].provenance == "derived" and SUMMARY_METRICS[total].unit == "count"


def test_a_policy_arm_counter_is_gated_and_a_baseline_without_it_says_so(tmp_path):
    base = [_rec("agentcgroup", "t/a", 0, throttles=1, policy_kills=0)]
    now = [_rec("agentcgroup", "t/a", 0, throttles=4, policy_kills=1)]
    rules = gate.parse_rules("throttles_total=+2,policy_kills_total=+0")
    verdict = gate.compare(gate.per_test(base), gate.per_test(now), rules)
    assert [(f.rule.metric, f.baseline, f.now) for f in verdict.regressions] == [
        ("throttles_total", 1, 4), ("policy_kills_total", 0, 1)]
    old = {k: {m: v for m, v in t.items() if m != "policy_kills_total"} for k, t in gate.per_test(base).items()}
    verdict = gate.compare(old, gate.per_test(now), rules)
    assert [f.rule.metric for f in verdict.regressions] == ["throttles_total"] and verdict.unchecked == [
        "policy_kills_total"]
    assert "not in the baseline, not gated: policy_kills_total (regenerate the baseline)" in gate.format_verdict(
        verdict, "b.json")


def test_new_and_missing_trace_x_arm_are_reported_not_failed(tmp_path):
    base = [_rec("static", "t/a", 0, oom=1), _rec("gone", "t/a", 0)]
    now = [_rec("static", "t/a", 0, oom=1), _rec("added", "t/a", 0, oom=3)]
    gate.save(base, tmp_path / "b.json")
    verdict = gate.compare(gate.load(tmp_path / "b.json"), gate.per_test(now), gate.parse_rules(gate.DEFAULT_RULES))
    assert not verdict.failed and verdict.checked == 1
    assert [k[1] for k in verdict.new] == ["added"] and [k[1] for k in verdict.missing] == ["gone"]
    lines = gate.format_verdict(verdict, "b.json")
    assert any(line.startswith("new") and "exp1/added" in line for line in lines)
    assert any(line.startswith("missing") and "exp1/gone" in line for line in lines)


def test_seeds_and_params_are_separate_entries(tmp_path):
    base = [_rec("static", "t/a", 0, oom=1, seed=0), _rec("static", "t/a", 0, oom=1, seed=1, params={"size": "big"})]
    now = [_rec("static", "t/a", 0, oom=1, seed=0), _rec("static", "t/a", 0, oom=2, seed=1, params={"size": "big"})]
    verdict = gate.compare(gate.per_test(base), gate.per_test(now), gate.parse_rules("oom_kills=+0"))
    assert [f.key[3] for f in verdict.regressions] == [1]
    assert "t/a [seed=1 size=big]" in gate.format_table(verdict)


def test_a_saved_run_and_a_benchmark_json_are_baselines_too(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text(json.dumps(_rec("static", "t/a", 0, oom=1)) + "\n{cut sho")
    assert list(gate.load(tmp_path / "run").values())[0]["oom_kills"] == 1
    (tmp_path / "bench.json").write_text(json.dumps({"benchmarks": [{"extra_info": {
        "experiment": "exp1", "arm": "static", "trace_id": "t/a", "metrics": {"oom_kills": {"value": 2}}}}]}))
    assert gate.load(tmp_path / "bench.json") == {("exp1", "static", "t/a", 0, "{}"): {"oom_kills": 2}}
    (tmp_path / "junk.json").write_text("[1, 2]")
    with pytest.raises(gate.GateError, match="junk.json: neither"):
        gate.load(tmp_path / "junk.json")
    with pytest.raises(gate.GateError, match="nope.json: no such file"):
        gate.load(tmp_path / "nope.json")
    with pytest.raises(gate.GateError, match="/proc/self/mem: cannot read"):   # EIO: one message, no traceback
        gate.load("/proc/self/mem")
    (tmp_path / "file").write_text("")                 # a baseline path under a file cannot be made
    with pytest.raises(gate.GateError, match="baseline NOT saved to .*file/base.json"):
        gate.save([_rec("static", "t/a", 0, oom=1)], tmp_path / "file" / "base.json")


@pytest.fixture
def project(pytester):
    # step 2 (120 MiB) fits the 192 MiB per-step limit, but not half of it
    write_study(pytester.path, limit_mb=192, high_mb=192, peaks=(20, 300, 120))
    pytester.makepyfile(test_exp1=EXP_MODULE)


@pytest.mark.slow
def test_halving_the_per_step_limit_fails_the_gate_and_the_unchanged_config_passes(pytester, project):
    cgroups_or_skip()
    made = run_study(pytester, "--agentcgroup-save-baseline", "baseline.json")
    made.assert_outcomes(passed=4)
    made.stdout.fnmatch_lines(["*baseline saved: *baseline.json (4 trace x arm)*"])
    saved = json.loads((pytester.path / "baseline.json").read_text())
    assert saved["schema"] == gate.SCHEMA and saved["units"]["oom_kills"] == "count"
    assert {t["arm"]: t["metrics"]["oom_kills"] for t in saved["tests"]}["static-toolcall"] == 1

    same = run_study(pytester, "--agentcgroup-baseline", "baseline.json")
    assert same.ret == 0, same.stdout.str()
    same.stdout.fnmatch_lines(["*agentcgroup regression gate*", "*4 trace x arm compared, 0 regression(s), 0 new, 0 missing*"])

    text = (pytester.path / "study.toml").read_text()
    head, tail = text.split("[arms.static-toolcall]")
    (pytester.path / "halved.toml").write_text(
        head + "[arms.static-toolcall]" + tail.replace("memory_max_mb = 192", "memory_max_mb = 96", 1))
    worse = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "halved.toml",
                                          "--agentcgroup-out", "out2", "--agentcgroup-baseline", "baseline.json")
    worse.assert_outcomes(passed=4)            # every test is within its budget: only the gate fails the run
    assert worse.ret == 1, worse.stdout.str()
    worse.stdout.fnmatch_lines([
        "*REGRESSION: 1 metric(s) worse than the baseline*",
        "trace*arm*metric*baseline*now*limit*",
        "synthetic/oom-once*exp1/static-toolcall*oom_kills (count)*1*2*<= 1 (oom_kills=+0)*"])


def test_gate_rules_from_the_ini_and_bad_rules_are_one_message(pytester, project):
    cgroups_or_skip()
    pytester.makeini("[pytest]\nagentcgroup_gate_rules = oom_kills=+0\n    latency_p95_ms=bogus\n")
    result = run_study(pytester, "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "gate rule 'latency_p95_ms=bogus': tolerance must be" in result.stderr.str()
    assert "Traceback" not in result.stderr.str()
    # the option beats the ini; a missing baseline file is named
    result = run_study(pytester, "-k", "unlimited", "--agentcgroup-gate-rules", "oom_kills=+0",
                       "--agentcgroup-baseline", "nope.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines(["*GATE ERROR: baseline *nope.json: no such file*"])


def test_a_failing_run_saves_no_baseline(pytester, project):
    cgroups_or_skip()
    with open(pytester.path / "study.toml", "a") as f:
        f.write("[experiments.exp1.budgets.static-env]\noom_kills = 0\n")     # the 300 MiB step breaks it
    result = run_study(pytester, "-k", "static-env", "--agentcgroup-save-baseline", "baseline.json")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*baseline NOT saved to *baseline.json: the run failed (exit 1)*"])
    assert not (pytester.path / "baseline.json").exists()


def test_a_results_directory_as_baseline_is_its_newest_run(tmp_path):
    from pytest_agentcgroup.metrics import gate
    results = tmp_path / "results"
    for name, oom in (("0001_20261123T190000", 0), ("0002_20261123T193000", 1)):
        (results / name).mkdir(parents=True)
        (results / name / "metrics.jsonl").write_text(json.dumps(_rec("static", "t/a", 0, oom=oom)) + "\n")
    (tmp_path / "empty").mkdir()
    assert [m["oom_kills"] for m in gate.load(results).values()] == [1]
    assert [m["oom_kills"] for m in gate.load(results / "0001_20261123T190000").values()] == [0]
    with pytest.raises(gate.GateError, match="baseline .*empty: .*not a results directory"):
        gate.load(tmp_path / "empty")
