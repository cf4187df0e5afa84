"""Issue 13: what limits reserve and steps use (GiB·s), the paper subset, the percentile sweep, and
the kills-versus-reserved-memory frontier in the report."""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import step_rec, write_results
from pytest_agentcgroup import config as cfgmod
from pytest_agentcgroup.arms import Arm
from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.cgroups.usage import integral_mib_ms
from pytest_agentcgroup.metrics import reservation as rv
from pytest_agentcgroup.metrics.records import SUMMARY_METRICS, summarize
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


def test_shipped_recorded_subsets_follow_the_rule():
    data, recorded = sweep.manifest_entries(ROOT / "traces", "recorded")
    assert data["subsets"]["paper-recorded"] == sweep.paper_subset(recorded)
    twins = sweep.derived_twins(ROOT / "traces", data, [e["trace_id"] for e in recorded])
    smoke = data["subsets"]["recorded-smoke"]
    assert smoke == sweep.smoke_subset(recorded, twins) and len(smoke) == sweep.SMOKE_SIZE
    assert data["subsets"]["recorded-smoke-1hz"] == [twins[t] for t in smoke]
    # each twin is the same source run, once recorded here and once derived from 1 Hz samples
    for rec, der in zip(smoke, data["subsets"]["recorded-smoke-1hz"]):
        assert rec.split("/", 1)[1] == der.split("/", 1)[1] and rec != der


def test_sweep_cli_draws_from_a_subset_and_refuses_to_overwrite_its_inputs(capsys):
    from pytest_agentcgroup.cli import main
    traces = str(ROOT / "traces")
    assert main(["traces", "sweep", traces, "--from", "recorded", "--smoke", "s"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# paper-recorded subset: 50 of 123 traces of recorded")
    assert "# s: claude-code-recorded/haiku/xonsh__xonsh-3255," in out and "# s-1hz: claude-code/haiku/xonsh__xonsh-3255," in out
    for args, said in ((["--from", "nosuch"], "no subset 'nosuch' (--from)"),
                       (["--from", "recorded", "--name", "recorded"], "over the subset it draws from"),
                       (["--name", "full"], "over the whole corpus"),
                       (["--smoke", "x", "--name", "x"], "over another it writes")):
        assert main(["traces", "sweep", traces, *args, "--write-manifest"]) == 2
        assert said in capsys.readouterr().err
    assert sweep.manifest_entries(ROOT / "traces", "recorded")[0]["subsets"]["paper"] == \
        sweep.paper_subset(sweep.manifest_entries(ROOT / "traces")[1])        # nothing was written


@pytest.mark.parametrize("config, subset, source", [("exp1-paper.toml", "paper-recorded", "recorded"),
                                                    ("exp1-paper-derived.toml", "paper", "full")])
def test_paper_config_sweeps_the_subsets_percentiles_over_the_default_arms(config, subset, source):
    data, entries = sweep.manifest_entries(ROOT / "traces", source)
    peaks = {e["trace_id"]: e["peak_mb"] for e in entries}
    want = sweep.sweep_limits([peaks[t] for t in data["subsets"][subset]])
    paper = cfgmod.load(ROOT / "experiments" / config)
    default = cfgmod.load(ROOT / "experiments" / "agentcgroup.toml")
    assert paper.arms == default.arms, f"{config}'s arms must be agentcgroup.toml's (copied)"
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
