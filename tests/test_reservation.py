"""Issue 13: what limits reserve and steps use (GiB·s), the paper subset, the percentile sweep, and
the kills-versus-reserved-memory frontier in the report."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, leaked, run_study, step_rec, write_results
from pytest_agentcgroup import config as cfgmod
from pytest_agentcgroup.arms import Arm
from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.cgroups.usage import integral_mib_ms
from pytest_agentcgroup.metrics import reservation as rv
from pytest_agentcgroup.metrics.records import SUMMARY_METRICS, summarize
from pytest_agentcgroup.metrics.registry import REGISTRY
from pytest_agentcgroup.replay import EmulateExecutor, replay
from pytest_agentcgroup.traces import sweep
from pytest_agentcgroup.traces.ir import Measure, Profile, Step, Trace

ROOT = Path(__file__).resolve().parent.parent


def res(**kw):
    args = dict(latency_ms=1000.0, time_scale=1.0, memory_max_mb=None, memory_high_mb=None, granting=False,
                trace_peak_mb=100.0, usage_mib_ms=None)
    return rv.step_reservation(**{**args, **kw})


# -- arithmetic, one hand-computed case per arm kind ------------------------------------------------
def test_static_hard_limit_reserves_the_limit_over_the_step_in_recorded_seconds():
    # 512 MiB for 1 s of replay at time_scale 0.05 = 20 recorded s: 512 * 20 / 1024 = 10 GiB·s
    r = res(memory_max_mb=512, time_scale=0.05, usage_mib_ms=256 * 1000.0, usage_window_ms=1000.0)
    assert r["step_time_s"] == 20.0 and r["time_basis"] == "replay"
    assert r["reserved_gib_s"] == 10.0 and r["reserved_basis"] == rv.HARD_BASIS
    assert r["ceiling_reserved_gib_s"] == 10.0 and r["soft_reserved_gib_s"] is None
    assert r["used_gib_s"] == 5.0                      # 256 MiB held for the whole 20 s
    assert r["utilization"] == 0.5 and r["idle_reserved_gib_s"] == 5.0


def test_unlimited_reserves_the_traces_peak():
    r = res(latency_ms=2048.0, trace_peak_mb=100.0)      # 100 MiB * 2.048 s / 1024
    assert r["reserved_gib_s"] == 0.2 and r["reserved_basis"] == rv.PEAK_BASIS
    assert r["ceiling_reserved_gib_s"] == 0.2


def test_a_soft_limit_alone_is_no_reservation_but_is_reported_at_the_soft_limit():
    r = res(memory_high_mb=512, trace_peak_mb=1024.0)   # static-high
    assert r["reserved_basis"] == rv.PEAK_BASIS and r["reserved_gib_s"] == 1.0
    assert r["soft_reserved_gib_s"] == 0.5


def test_dynamic_arm_reserves_the_envelope_of_its_grants():
    # 512 MiB for 250 ms, 768 for 250 ms, 1024 for 500 ms = 832000 MiB·ms = 0.8125 GiB·s
    r = res(memory_high_mb=512, memory_max_mb=2048, granting=True, grants=[[250, 768], [500, 1024]])
    assert r["reserved_gib_s"] == 0.8125 and r["reserved_basis"] == rv.GRANT_BASIS
    assert r["soft_reserved_gib_s"] == 0.8125
    assert r["ceiling_reserved_gib_s"] == 2.0             # 2048 MiB * 1 s
    # no grants logged: flat at the soft limit
    assert res(memory_high_mb=512, memory_max_mb=2048, granting=True)["reserved_gib_s"] == 0.5
    # the control arm (no eBPF: nothing grants or holds its soft limit) reserves its ceiling, soft reported
    ctl = res(memory_high_mb=512, memory_max_mb=2048, granting=False, grants=[[250, 768]])
    assert ctl["reserved_gib_s"] == 2.0 and ctl["reserved_basis"] == rv.HARD_BASIS and ctl["soft_reserved_gib_s"] == 0.5


def test_levels_are_held_for_the_recorded_duration_when_the_trace_has_one():
    # replayed in 50 ms (at 0.05, plus load), recorded 2 s: the levels' means are held 2 s
    hard = res(latency_ms=80.0, time_scale=0.05, recorded_ms=2000.0, memory_max_mb=512,
               usage_mib_ms=256 * 100.0, usage_window_ms=100.0)
    assert hard["time_basis"] == "recorded" and hard["step_time_s"] == 2.0
    assert hard["reserved_gib_s"] == 1.0 and hard["used_gib_s"] == 0.5 and hard["utilization"] == 0.5
    # a grant to 1024 MiB halfway through the replayed step: mean 768 MiB over the recorded 2 s
    dyn = res(latency_ms=50.0, time_scale=0.05, recorded_ms=2000.0, memory_high_mb=512, memory_max_mb=2048,
              granting=True, grants=[[25.0, 1024]])
    assert dyn["reserved_gib_s"] == 1.5 and dyn["ceiling_reserved_gib_s"] == 4.0


def test_envelope_clips_grants_to_the_step():
    assert rv.envelope_mib_ms(100, [[-5, 200], [2000, 400]], 1000) == 200 * 1000     # before: from 0; after: none
    assert rv.envelope_mib_ms(100, [[600, 300], [200, 200]], 1000) == 100 * 200 + 200 * 400 + 300 * 400


def test_a_step_that_did_not_run_held_nothing_and_use_above_a_soft_reservation_is_not_negative_idle():
    r = res(latency_ms=None, memory_max_mb=512)
    assert r["reserved_gib_s"] == 0.0 and r["step_time_s"] == 0.0
    over = res(memory_high_mb=64, memory_max_mb=2048, granting=True, usage_mib_ms=128 * 1000.0, usage_window_ms=1000.0)
    assert over["utilization"] == 2.0 and over["idle_reserved_gib_s"] == 0.0


def test_step_fields_reads_the_grants_and_usage_from_the_counters():
    step = Step(0, "bash", {"command": "x"}, profile=Profile(peak_mb=Measure(300.0, "recorded")))
    trace = Trace("t/x", {"format": "test"}, (step,))
    result = SimpleNamespace(executed=True, latency_ms=1000.0,
                             counters={"grants": [[500, 1024]], "usage_mib_ms": 512000.0, "usage_window_ms": 1000.0,
                                       "usage_samples": 51, "priority": "low"})
    arm = Arm("agentcgroup", policy="agentcgroup", memory_high_mb=512, memory_max_mb=2048)
    f = rv.step_fields(result, step, arm=arm, trace=trace, time_scale=1.0)
    assert f["reserved_gib_s"] == 0.75 and f["used_gib_s"] == 0.5 and f["usage_samples"] == 51
    # a step the policy does not hold (normal or high priority) may grow to the ceiling: reserves it
    for priority in ("normal", "high", None):
        unheld = SimpleNamespace(executed=True, latency_ms=1000.0, counters={**result.counters, "priority": priority})
        f = rv.step_fields(unheld, step, arm=arm, trace=trace, time_scale=1.0)
        assert f["reserved_gib_s"] == 2.0 and f["reserved_basis"] == rv.HARD_BASIS, priority
    soft = Arm("bpf-soft", policy="agentcgroup", memory_high_mb=512, memory_max_mb=2048, rules={"ebpf": False})
    assert rv.step_fields(result, step, arm=soft, trace=trace, time_scale=1.0)["reserved_gib_s"] == 2.0
    f = rv.step_fields(result, step, arm=Arm("unlimited"), trace=trace, time_scale=1.0)
    assert f["reserved_gib_s"] == round(300 / 1024, 6)        # the trace's recorded peak


def test_summaries_sum_and_take_utilization_of_the_sums():
    recs = [step_rec(reserved_gib_s=1.0, used_gib_s=0.5, idle_reserved_gib_s=0.5, step_time_s=2.0),
            step_rec(step_id=1, reserved_gib_s=3.0, used_gib_s=0.5, idle_reserved_gib_s=2.5, step_time_s=1.0)]
    s = summarize(recs, "unlimited")
    assert s["reserved_gib_s"] == 4.0 and s["used_gib_s"] == 1.0 and s["utilization"] == 0.25
    assert s["idle_reserved_gib_s"] == 3.0 and s["step_time_s"] == 3.0
    assert summarize([step_rec()], "unlimited")["reserved_gib_s"] is None        # older records: unknown
    for k in ("reserved_gib_s", "used_gib_s", "utilization", "idle_reserved_gib_s"):
        assert SUMMARY_METRICS[k].unit in ("GiB·s", "ratio") and SUMMARY_METRICS[k].provenance == "derived"


def test_integral_of_samples_is_the_trapezoid_rule():
    mib = 1024 * 1024
    # 0 MiB at t=0, 100 MiB at 1 s, 100 at 2 s: 50 + 100 MiB·s
    assert integral_mib_ms([(0.0, 0), (1.0, 100 * mib), (2.0, 100 * mib)], 0.0, 2.0) == pytest.approx(150_000)
    assert integral_mib_ms([(0.5, 10 * mib)], 0.0, 1.0) == pytest.approx(10_000)     # held to both ends


# -- the sampler on a real cgroup -------------------------------------------------------------------
def test_usage_is_sampled_from_the_step_cgroup(tree):
    """A 100 MiB step, ramped over 0.5 s and held 0.5 s, uses ~75 MiB·s (the emulator at time_scale 1)."""
    step = Step(0, "bash", {"command": "x"}, duration_ms=Measure(1000, "synthetic"),
                profile=Profile(peak_mb=Measure(100, "synthetic"), ramp_ms=Measure(500, "synthetic")))
    placement = ArmPlacement(Arm("unlimited"), tree.workload("usage"), tree.controllers, sample_usage_s=0.02)
    (r,) = replay(Trace("test/usage", {"format": "test"}, (step,)), EmulateExecutor(time_scale=1.0), placement)
    assert r.exit_code == 0, r
    assert r.counters["usage_samples"] >= 30, r.counters           # ~1 s at 20 ms
    assert 0.7 * 75_000 <= r.counters["usage_mib_ms"] <= 1.35 * 75_000, r.counters
    assert placement.sampler._thread is None or not placement.sampler._thread.is_alive()   # closed with the replay


# -- the paper subset and the sweep -----------------------------------------------------------------
def entries(*peaks):
    return [{"trace_id": f"t/{i:02d}", "peak_mb": p} for i, p in enumerate(peaks)]


def test_paper_subset_takes_sparse_bins_whole_and_thins_crowded_ones_evenly():
    es = entries(*[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 40, 50, 300, 2000)     # bins: 10 | 2 | 1 | 1
    ids = sweep.paper_subset(es, n=8)
    assert {"t/10", "t/11", "t/12", "t/13"} <= set(ids)                 # every high-peak trace
    small = [i for i in ids if int(i[2:]) < 10]
    assert len(ids) == 8 and small == ["t/00", "t/03", "t/06", "t/09"]  # spread, both ends in
    assert sweep.paper_subset(list(reversed(es)), n=8) == ids           # input order does not matter


def test_shipped_paper_subset_follows_the_rule():
    data, full = sweep.manifest_entries(ROOT / "traces")
    paper = data["subsets"]["paper"]
    assert paper == sweep.paper_subset(full) and len(paper) == 50
    assert {e["trace_id"] for e in full if e["peak_mb"] >= 128} <= set(paper)


def test_percentile_sweep():
    assert sweep.sweep_limits([10, 20, 30, 40, 100]) == {"p50": 30, "p90": 76, "p99": 98, "max": 100}


def test_sweep_cli_draws_from_a_subset_and_refuses_to_overwrite_its_inputs(capsys):
    from pytest_agentcgroup.cli import main
    traces = str(ROOT / "traces")
    assert main(["traces", "sweep", traces, "--from", "recorded", "--smoke", "s"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# skipped 60 of 123 traces of recorded: 20 unfaithful")
    assert "\n# paper-recorded subset: 50 of the 63 traces of recorded taken" in out
    assert "# s: mini-swe-agent/sympy__sympy-21847, openhands-rows/numpy__numpydoc-101/2, " in out
    assert "# s-1hz: claude-code/haiku/simonw__files-to-prompt-44\n" in out
    for args, said in ((["--from", "nosuch"], "no subset 'nosuch' (--from)"),
                       (["--from", "recorded", "--name", "recorded"], "over the subset it draws from"),
                       (["--name", "full"], "over the whole corpus"),
                       (["--smoke", "x", "--name", "x"], "over another it writes")):
        assert main(["traces", "sweep", traces, *args, "--write-manifest"]) == 2
        assert said in capsys.readouterr().err
    assert sweep.manifest_entries(ROOT / "traces", "recorded")[0]["subsets"]["paper"] == \
        sweep.paper_subset(sweep.manifest_entries(ROOT / "traces")[1])        # nothing was written


PER_CALL_ARMS = ("vpa", "window", "predict", "predict-stall")


@pytest.mark.parametrize("config, subset, source", [("exp1-paper.toml", "paper-recorded", "recorded"),
                                                    ("exp1-paper-derived.toml", "paper", "full")])
def test_paper_config_sweeps_the_subsets_percentiles_over_the_default_arms(config, subset, source):
    data, entries = sweep.manifest_entries(ROOT / "traces", source)
    peaks = {e["trace_id"]: e["peak_mb"] for e in entries}
    want = sweep.sweep_limits([peaks[t] for t in data["subsets"][subset]])
    paper = cfgmod.load(ROOT / "experiments" / config)
    default = cfgmod.load(ROOT / "experiments" / "agentcgroup.toml")
    # agentcgroup.toml's arms, copied, and the per-call arms only the paper runs have (limits/)
    assert {k: a for k, a in paper.arms.items() if k not in PER_CALL_ARMS} == default.arms, \
        f"{config}'s arms must be agentcgroup.toml's (copied)"
    assert {k: paper.arms[k].limit_from for k in PER_CALL_ARMS} == {"vpa": "vpa", "window": "window", "predict": "predict",
                                                                    "predict-stall": "predict"}
    exp = paper.experiments["exp1"]
    assert exp.subset == subset
    got = {v.params["ablation"]: v.overrides["arms"] for v in exp.matrix}
    assert list(got) == list(want)
    for name, arms in got.items():
        assert arms == {a: {key: want[name]} for a, key in sweep.SWEPT.items()}, name
    # `make run` keeps the smoke exp1 (both profiles of the same runs): no sweep there
    assert default.experiments["exp1"].subset == "recorded-smoke,recorded-smoke-1hz"
    assert not default.experiments["exp1"].matrix
    raw = tomllib.loads((ROOT / "experiments" / config).read_text())
    assert "matrix" in raw["experiments"]["exp1"]


# -- the report -------------------------------------------------------------------------------------
def sweep_records():
    recs = []
    for arm, kills, base in (("static-toolcall", (3, 0), 10.0), ("agentcgroup", (1, 0), 2.0)):
        for point, k, scale in (("p50", kills[0], 1.0), ("max", kills[1], 8.0)):
            for t in ("t/a", "t/b"):
                recs.append(step_rec(trace_id=t, config=arm, params={"ablation": point}, oom_kills=k if t == "t/a" else 0,
                                     reserved_gib_s=base * scale, used_gib_s=1.0, step_time_s=5.0,
                                     idle_reserved_gib_s=base * scale - 1.0, ceiling_reserved_gib_s=base * scale))
    return recs


def test_report_draws_the_frontier_and_the_reservation_table(tmp_path):
    from pytest_agentcgroup.reports import build_report
    from pytest_agentcgroup.reports.frames import load
    from pytest_agentcgroup.reports.frontier import reservation_frame
    index = build_report(write_results(tmp_path / "r", sweep_records()), tmp_path / "out")
    html = index.read_text()
    assert 'src="figures/frontier.png"' in html and (tmp_path / "out" / "figures" / "frontier.png").stat().st_size > 5000
    assert 'id="reservation"' in html and "idle reserved (GiB·s)" in html
    frame = reservation_frame(load(tmp_path / "r").tests)
    row = frame[(frame["config"] == "static-toolcall") & (frame["point"] == "p50")].iloc[0]
    assert row["oom_kills"] == 3 and row["reserved_gib_s"] == 20.0 and row["utilization"] == 0.1


def test_no_frontier_without_a_sweep(tmp_path):
    from pytest_agentcgroup.reports import build_report
    recs = [step_rec(reserved_gib_s=1.0, used_gib_s=0.5)]
    html = build_report(write_results(tmp_path / "r", recs), tmp_path / "out").read_text()
    assert "frontier.png" not in html and 'id="reservation"' in html


def test_a_run_of_both_corpora_draws_each_arm_twice_without_a_sweep(tmp_path):
    """exp1 on recorded profiles and on the 1 Hz-derived profiles of the same runs (make run): a
    test is `recorded` when any of its steps replayed a recorded profile, and each arm is one
    frontier point per corpus."""
    from pytest_agentcgroup.reports import build_report
    from pytest_agentcgroup.reports.frames import load
    from pytest_agentcgroup.reports.frontier import has_frontier, reservation_frame
    recs = []
    for arm, kills in (("static-toolcall", {"recorded": 1, "derived": 0}), ("unlimited", {"recorded": 0, "derived": 0})):
        for corpus, tid in (("recorded", "cc-recorded/x"), ("derived", "cc/x")):
            recs.append(step_rec(trace_id=tid, config=arm, step_id=0, profile_source="derived",
                                 reserved_gib_s=1.0, used_gib_s=0.1, step_time_s=1.0))
            recs.append(step_rec(trace_id=tid, config=arm, step_id=1, profile_source=corpus, oom_kills=kills[corpus],
                                 reserved_gib_s=4.0 if corpus == "derived" else 2.0, used_gib_s=0.5, step_time_s=2.0))
    tests = load(write_results(tmp_path / "r", recs)).tests
    assert dict(zip(tests["trace_id"], tests["profiles"])) == {"cc-recorded/x": "recorded", "cc/x": "derived"}
    frame = reservation_frame(tests)
    assert has_frontier(frame) and len(frame) == 4
    row = frame[(frame["config"] == "static-toolcall") & (frame["profiles"] == "recorded")].iloc[0]
    assert row["oom_kills"] == 1 and row["reserved_gib_s"] == 3.0
    html = build_report(tmp_path / "r", tmp_path / "out").read_text()
    assert 'src="figures/frontier.png"' in html and "step profiles" in html
    # one corpus alone, no sweep: no frontier; another experiment of the run is not drawn with it
    assert not has_frontier(frame[frame["profiles"] == "recorded"])
    from pytest_agentcgroup.reports.frontier import frontier_frame
    other = load(write_results(tmp_path / "r2", recs + [step_rec(experiment="exp4", trace_id="cc/x", reserved_gib_s=1.0,
                                                                  used_gib_s=0.1, step_time_s=1.0)])).tests
    assert set(frontier_frame(reservation_frame(other))["experiment"]) == {"exp1"}


# -- the oracle: each step's own peak × its time ----------------------------------------------------
def test_the_oracle_is_each_steps_own_peak_over_its_recorded_time_and_every_arm_is_a_ratio_of_it():
    # a 64 MiB step recorded for 2 s: 64 * 2 / 1024 = 0.125 GiB·s, whatever the arm
    hard = res(latency_ms=100.0, time_scale=0.05, recorded_ms=2000.0, memory_max_mb=512, step_peak_mb=64.0)
    assert hard["oracle_gib_s"] == 0.125 and hard["reserved_gib_s"] == 1.0 and hard["reserved_vs_oracle"] == 8.0
    unlimited = res(latency_ms=100.0, time_scale=0.05, recorded_ms=2000.0, trace_peak_mb=256.0, step_peak_mb=64.0)
    assert unlimited["oracle_gib_s"] == 0.125 and unlimited["reserved_vs_oracle"] == 4.0     # 256 / 64
    nopeak = res(memory_max_mb=512)                                   # no recorded peak: no oracle, no ratio
    assert nopeak["oracle_gib_s"] is None and nopeak["reserved_vs_oracle"] is None
    assert res(latency_ms=None, step_peak_mb=64.0)["oracle_gib_s"] == 0.0     # did not run: held nothing


def test_an_arm_with_limits_from_each_steps_peak_reserves_the_oracle_plus_its_margin():
    arm = Arm.from_dict("oracle", {"limit_from": "step_peak", "margin_mb": 8})
    assert arm.step_memory_max_mb(100.0) == 108.0 and arm.step_memory_max_mb(None) is None
    assert arm.limits == {"limit_from": "step_peak", "margin_mb": 8}
    assert Arm("static-toolcall", memory_max_mb=512).step_memory_max_mb(100.0) == 512
    steps = (Step(0, "bash", {"command": "x"}, duration_ms=Measure(1000.0, "recorded"),
                  profile=Profile(peak_mb=Measure(120.0, "recorded"))),
             Step(1, "bash", {"command": "y"}, duration_ms=Measure(3000.0, "recorded"),
                  profile=Profile(peak_mb=Measure(24.0, "recorded"))),
             Step(2, "read", {}, duration_ms=Measure(500.0, "recorded")))        # no recorded peak
    trace = Trace("t/oracle", {"format": "test"}, steps)
    ran = SimpleNamespace(executed=True, latency_ms=50.0, counters={})
    recs = [step_rec(step_id=s.step_id, config="oracle", **rv.step_fields(ran, s, arm=arm, trace=trace, time_scale=0.05))
            for s in steps]
    # by hand: oracle 120 MiB x 1 s + 24 MiB x 3 s = 192 MiB·s; the arm 128 x 1 + 32 x 3 = 224 MiB·s
    assert [r["oracle_gib_s"] for r in recs] == [round(120 / 1024, 6), round(72 / 1024, 6), None]
    assert [r["reserved_gib_s"] for r in recs] == [0.125, 0.09375, round(120 * 0.5 / 1024, 6)]
    assert recs[2]["reserved_basis"] == rv.PEAK_BASIS          # without a peak it runs without a limit
    s = summarize(recs, "oracle")
    assert s["oracle_gib_s"] == round(120 / 1024 + 72 / 1024, 6)
    assert s["reserved_vs_oracle"] == round(224 / 192, 6)       # step 2 in neither sum
    # unlimited reserves the trace's peak (120 MiB) over every step: 120 x 4 / 192 over the steps with a peak
    un = [step_rec(step_id=x.step_id, **rv.step_fields(ran, x, arm=Arm("unlimited"), trace=trace, time_scale=0.05))
          for x in steps]
    assert summarize(un, "unlimited")["reserved_vs_oracle"] == round(480 / 192, 6)
    for k in ("oracle_gib_s", "reserved_vs_oracle"):
        m = SUMMARY_METRICS[k]
        assert m.provenance == "derived" and REGISTRY[k].unit == m.unit and m.unit in ("GiB·s", "ratio")
    assert SUMMARY_METRICS["reserved_vs_oracle"].better == "lower"


def test_a_granted_limit_is_held_at_its_highest_level_until_the_step_ends():
    # raised to 768 MiB at 250 ms, a grant log entry of 640 at 500 ms (a limit that came back down)
    # reserves nothing less: 512 x 250 + 768 x 750 = 704000 MiB·ms
    assert rv.envelope_mib_ms(512, [[250, 768], [500, 640]], 1000) == 512 * 250 + 768 * 750
    r = res(memory_high_mb=512, memory_max_mb=2048, granting=True, grants=[[250, 768], [500, 640]])
    assert r["reserved_gib_s"] == round(704000 / 1024 / 1000, 6) and r["reserved_basis"] == rv.GRANT_BASIS


ORACLE_TRACE = "claude-code-recorded/haiku/numba__numba-5721"     # 5 steps, recorded peaks 3-48 MiB


def test_the_oracle_arm_replays_a_recorded_trace_without_a_kill_at_about_the_oracles_reservation(pytester, monkeypatch):
    """The accounting's check, on the real plugin, emulator and cgroups: each step limited at its own
    recorded peak + the shipped margin is killed nowhere and reserves ~1x the oracle; unlimited (the
    trace's peak on every step) reserves more. The margin's share is margin x Σ time / Σ peak x time."""
    host = cgroups_or_skip()
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    margin = cfgmod.load(ROOT / "experiments" / "agentcgroup.toml").arms["oracle"].margin_mb
    (pytester.path / "study.toml").write_text(f"""
traces = "{ROOT / 'traces'}"
[defaults]
time_scale = 0.1
[arms.unlimited]
[arms.oracle]
limit_from = "step_peak"
margin_mb = {margin}
[experiments.exp1]
subset = "{ORACLE_TRACE}"
arms = ["unlimited", "oracle"]
[experiments.exp1.budgets.oracle]
oom_kills = 0
""")
    pytester.makepyfile(test_exp1=EXP_MODULE)
    result = run_study(pytester)
    result.assert_outcomes(passed=2)
    summary = {s["config"]: s for s in json.loads((pytester.path / "out" / "latest" / "summary.json").read_text())}
    oracle, unlimited = summary["oracle"], summary["unlimited"]
    assert oracle["oom_kills"] == 0 and oracle["mem_max_events_total"] == 0, oracle
    steps = peaks_and_durations(ORACLE_TRACE)
    by_hand = sum(p * d for p, d in steps) / 1000 / 1024                 # MiB x ms -> GiB·s
    assert oracle["oracle_gib_s"] == unlimited["oracle_gib_s"] == pytest.approx(by_hand, abs=1e-5)
    share = margin * sum(d for _, d in steps) / sum(p * d for p, d in steps)    # the margin's share of the ratio
    assert share < 0.3 and oracle["reserved_vs_oracle"] == pytest.approx(1 + share, abs=1e-4)
    assert 1.0 <= oracle["reserved_vs_oracle"] <= 1.3, oracle
    assert unlimited["reserved_vs_oracle"] > oracle["reserved_vs_oracle"], (oracle, unlimited)
    lines = [json.loads(x) for x in (pytester.path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["reserved_basis"] == rv.HARD_BASIS for r in lines if r["config"] == "oracle")
    assert leaked(host) == []


def peaks_and_durations(trace_id: str) -> list[tuple[float, float]]:
    """(peak MiB, recorded ms) of each step of a shipped trace, read from its file."""
    manifest = json.loads((ROOT / "traces" / "manifest.json").read_text())
    entry = next(e for e in manifest["traces"] if e["trace_id"] == trace_id)
    steps = json.loads((ROOT / "traces" / entry["file"]).read_text())["steps"]
    return [(s["profile"]["peak_mb"]["value"], s["duration_ms"]["value"]) for s in steps]


def test_the_reports_show_each_arms_reservation_as_a_multiple_of_the_oracle(tmp_path):
    from pytest_agentcgroup import cli
    from pytest_agentcgroup.reports import build_report
    from pytest_agentcgroup.reports.frames import load
    from pytest_agentcgroup.reports.frontier import reservation_frame
    recs = []
    for arm, reserved in (("unlimited", (4.0, 4.0)), ("oracle", (1.1, 2.2))):
        for t, (res_gib_s, oracle) in zip(("t/a", "t/b"), zip(reserved, (1.0, 2.0))):
            recs.append(step_rec(trace_id=t, config=arm, reserved_gib_s=res_gib_s, used_gib_s=0.5, step_time_s=1.0,
                                 oracle_gib_s=oracle, reserved_vs_oracle=round(res_gib_s / oracle, 6)))
        # a step without a recorded peak: counted in reserved, in neither side of the ratio
        recs.append(step_rec(trace_id="t/a", config=arm, step_id=1, reserved_gib_s=9.0, used_gib_s=0.1, step_time_s=1.0))
    run = write_results(tmp_path / "r", recs)
    frame = reservation_frame(load(run).tests).set_index("config")
    assert frame.loc["oracle", "oracle_gib_s"] == 3.0 and frame.loc["oracle", "reserved_vs_oracle"] == 1.1
    assert frame.loc["unlimited", "reserved_vs_oracle"] == round(8.0 / 3.0, 6)
    assert frame.loc["unlimited", "reserved_gib_s"] == 17.0          # with the peakless step's 9
    html = build_report(run, tmp_path / "out").read_text()
    table = html.split('id="reservation"')[1].split("</table>")[0]
    assert "× oracle (reserved/oracle)" in table and 'data-value="1.1"' in table
    (run / "summary.json").write_text(json.dumps([{"experiment": "exp1", **summarize([r for r in recs if r["config"] == a], a)}
                                                  for a in ("unlimited", "oracle")]))
    assert cli.main(["report", str(run), "-o", str(tmp_path / "md"), "--markdown"]) == 0
    page = (tmp_path / "md" / "results.md").read_text()
    reserved = page.split("### Reserved and used memory")[1].split("\n#")[0]
    assert "× oracle (ratio, derived)" in reserved and "oracle (GiB·s, derived)" in reserved
    row = next(line for line in reserved.splitlines() if "`oracle`" in line)
    assert "| 1.1 |" in row, row
