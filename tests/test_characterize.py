"""`traces characterize`: figures computed by hand on a small trace set, the shipped corpus's
figures, the paper's column, and what happens without profiles or container summaries."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_agentcgroup.cli import main
from pytest_agentcgroup.traces.characterize import characterize, format_table, quantile
from pytest_agentcgroup.traces.ir import Measure, Profile, Step, Trace, write_trace

ROOT = Path(__file__).resolve().parents[1]
HAIKU = ROOT / "traces" / "claude-code" / "haiku"


def _step(i, cmd, dur, peak=None, ramp=None, cpu=None, tool="bash"):
    prof = Profile(peak_mb=None if peak is None else Measure(peak, "derived"),
                   ramp_ms=None if ramp is None else Measure(ramp, "derived"),
                   cpu_ms=None if cpu is None else Measure(cpu, "derived"))
    args = {"command": cmd} if tool == "bash" else {}
    return Step(step_id=i, tool=tool, args=args, duration_ms=Measure(dur, "recorded"), profile=prof)


def _trace(tid, steps, container=None, agent_s=None):
    src = {"format": "claude-code", "model": "haiku"}
    if container:
        src["container"] = container
    if agent_s:
        src["agent_time_s"] = {"value": agent_s, "provenance": "recorded"}
    return Trace(trace_id=tid, source=src, steps=tuple(steps))


A = _trace("a", [_step(0, "python -m pytest", 4000, peak=300.0, ramp=1000, cpu=2000),
                 _step(1, "git status", 1000, peak=10.0, ramp=500, cpu=100),
                 _step(2, "", 1000, peak=2.0, tool="read")],
           container={"mem_mb_min": 100.0, "mem_mb_mean": 200.0, "mem_mb_max": 600.0, "near_peak_share": 0.05,
                      "mem_rate_mb_s_p95": 40.0, "mem_rate_mb_s_max": 300.0, "cpu_percent_mean": 10.0,
                      "cpu_percent_max": 100.0, "step_baseline_mb": [250.0, 180.0, 190.0]},
           agent_s=20.0)
B = _trace("b", [_step(0, "pytest -x tests/a.py", 2000, peak=100.0, ramp=0, cpu=500),
                 _step(1, "pip install -e .", 2000, peak=50.0, ramp=2000)])          # no container summary


def test_figures_on_a_hand_made_set():
    res = characterize([A, B])
    assert (res["traces"], res["steps"], res["profiled_steps"], res["traces_with_container"]) == (2, 5, 5, 1)
    test = res["by_kind"]["test"]
    assert test["delta_mb"] == {"n": 2, "p50": 200.0, "p95": 290.0, "max": 300.0, "provenance": "derived"}
    assert test["absolute_mb"]["n"] == 1 and test["absolute_mb"]["max"] == 550.0     # baseline 250 + 300
    assert res["by_kind"]["read"]["delta_mb"]["max"] == 2.0
    assert res["git_status"]["delta_mb"]["p50"] == 10.0 and res["git_status"]["absolute_mb"]["p50"] == 190.0
    # absolute peak/average of A only: 600 / 200; delta: A max 300 over the duration-weighted mean
    # (300*4000 + 10*1000 + 2*1000) / 6000 = 202; B 100 / 75
    assert res["peak_to_average"]["absolute"]["max"] == 3.0
    assert res["peak_to_average"]["delta"]["max"] == round(300 / (1212000 / 6000), 2)
    assert res["peak_to_average"]["delta"]["p50"] == round((300 / 202 + 100 / 75) / 2, 2)
    # growth = peak / ramp over steps with a ramp: 300/1, 10/0.5, 50/2 MiB/s
    assert res["mem_change_rate_mb_s"]["step_growth"]["max"] == 300.0
    assert res["mem_change_rate_mb_s"]["step_growth"]["p50"] == 25.0
    assert res["tool_time_share"] == {"value": 0.3, "n": 1, "provenance": "derived"}      # 6 s of 20 s
    assert res["cpu_percent_mean"]["value"] == 10.0
    assert res["tool_cpu_percent"]["value"] == round(100 * 2600 / 7000, 2)  # steps with cpu_ms: 4 + 1 + 2 s
    assert res["static_limit_idle_share"]["value"] == round(1 - 200 / 600, 3)
    assert res["static_limit_idle_share_cpu"]["value"] == 0.9
    assert res["near_peak_share"]["value"] == 0.05
    json.dumps(res)


def test_quantile_matches_numpy_default_rule():
    assert quantile([1, 2, 3, 4], 0.5) == 2.5 and quantile([10], 0.95) == 10 and quantile([], 0.5) is None
    assert quantile(list(range(101)), 0.95) == 95.0


def test_table_prints_the_papers_column_and_na_for_missing_data():
    text = format_table(characterize([B]))
    assert "15.4 (haiku)" in text and "518 (haiku)" in text and "13.2 (haiku)" in text
    assert "n/a abs" in text                                         # no container summary: no absolute figure
    glm = _trace("g", [_step(0, "pytest", 1000, peak=5.0)])
    glm.source["model"] = "qwen3"
    assert "234 (glm)" in format_table(characterize([glm])) and "7.6 (glm)" in format_table(characterize([glm]))


@pytest.mark.skipif(not HAIKU.is_dir(), reason=f"shipped corpus not present: {HAIKU}")
def test_shipped_haiku_corpus(capsys):
    assert main(["traces", "characterize", str(HAIKU)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("18 trace(s), 391 step(s), 391 with a profile; 18 with whole-container samples")
    assert "paper (published)" in out and "15.4 (haiku)" in out and "518 (haiku)" in out
    assert main(["traces", "characterize", "--json", str(HAIKU)]) == 0
    res = json.loads(capsys.readouterr().out)
    # pre-commit-2524's full test-suite run: 1594.5 MiB over its baseline, 1775.7 MiB of container memory
    assert res["by_kind"]["test"]["delta_mb"]["max"] == 1594.5
    assert res["by_kind"]["test"]["absolute_mb"]["max"] == 1775.7
    assert res["peak_to_average"]["absolute"]["max"] == 6.08
    assert res["cpu_percent_mean"]["value"] == 18.55 and res["cpu_percent_mean"]["n"] == 18
    assert res["git_status"]["delta_mb"]["n"] == 0                 # no haiku run calls `git status`


def test_no_profiles_is_an_error(tmp_path, capsys):
    t = Trace(trace_id="x", source={}, steps=(Step(step_id=0, tool="bash", args={"command": "ls"}),))
    write_trace(t, tmp_path / "x.json")
    assert main(["traces", "characterize", str(tmp_path)]) == 1
    assert "no step carries a resource profile" in capsys.readouterr().err
    assert main(["traces", "characterize", str(tmp_path / "none")]) == 1


def test_the_text_says_where_the_step_peaks_came_from():
    """Recorded peaks (a profiled trace) are not called derived or 'over baseline'; a mix says both."""
    from dataclasses import replace
    derived = _trace("t/derived", [_step(0, "pytest", 1000, peak=50.0)])
    recorded = Trace("t/recorded", {}, tuple(replace(s, profile=Profile(peak_mb=Measure(s.profile.peak_mb.value,
                                                                                         "recorded")))
                                             for s in derived.steps))
    text = format_table(characterize([recorded]))
    assert "1 recorded (the kernel's peak of the step's own cgroup" in text
    assert "derived (memory over" not in text and "over baseline" not in text and "the step's own peak" in text
    text = format_table(characterize([derived]))
    assert "1 derived (memory over the step's baseline" in text and "delta over baseline:" in text
    text = format_table(characterize([derived, recorded]))
    assert "1 derived" in text and "1 recorded" in text and "step peak (derived: over baseline; recorded: own cgroup)" in text


# -- the whole-run figures from recorded step curves (traces/curves.py) ------------------------------
def _curved(i, dur, t_ms, mb, peak, orig_peak=None):
    from pytest_agentcgroup.traces.ir import Curve, Original
    prof = Profile(peak_mb=Measure(peak, "recorded"), curve=Curve(tuple(t_ms), tuple(mb), "recorded"))
    orig = Original(duration_ms=Measure(dur, "recorded"),
                    profile=Profile(peak_mb=Measure(orig_peak, "derived"))) if orig_peak is not None else None
    return Step(step_id=i, tool="bash", args={"command": "python -m pytest"}, duration_ms=Measure(dur, "recorded"),
                profile=prof, original=orig)


def test_recorded_curves_give_the_papers_whole_run_figures_over_tool_time():
    from pytest_agentcgroup.traces.curves import recorded_figures
    # step 0: 2 s; a 400 MiB burst from 0.4 s to 0.6 s, back to 0 well before the 1 s reading: a 1 Hz
    # reader sees no change, the range inside the first second is 400 MiB. Step 1: 1 s, climbs to 200
    # MiB and stays: its 1 s readings differ by 200 MiB.
    s0 = _curved(0, 2000, [0, 400, 450, 550, 600, 2000], [0, 0, 400, 400, 0, 0], 400.0, orig_peak=20.0)
    s1 = _curved(1, 1000, [0, 100, 1000], [0, 200, 200], 200.0)
    t = _trace("c", [s0, s1], agent_s=30.0)
    rc = recorded_figures([t])
    assert rc["traces"] == 1 and rc["curves"] == 2
    # ∫ MiB dt: the burst's two 50 ms ramps and 100 ms top, then step 1's 100 ms ramp and 900 ms plateau
    area = 400 * 50 / 2 + 400 * 100 + 400 * 50 / 2 + 200 * 100 / 2 + 200 * 900
    assert rc["peak_to_average"]["max"] == round(400 / (area / 3000), 2)
    # near the peak (>= 360 MiB): the 100 ms top plus the parts of the ramps above 360 (2 x 5 ms)
    assert rc["near_peak_share"]["max"] == round(110 / 3000, 4)
    sec = rc["seconds_changing"]
    assert sec["tool_seconds"] == 3.0
    assert sec["ticks"] == round(1 / 3, 5) and sec["within"] == round(2 / 3, 5)
    assert sec["agent_ticks"] == round(1 / 30, 5) and sec["agent_within"] == round(2 / 30, 5)
    assert rc["bursts"] == 1 and rc["bursts_seen_at_1hz"] == 0
    res = characterize([t])
    text = format_table(res)
    assert "From the recorded step curves (2 steps of 1 traces" in text and "98.5 %" in text and "1.7-3.8 %" in text
    assert text.count("< 2 % (haiku)") == 2          # the paper's bound, in both tables


def test_partial_seconds_count_by_length_and_curves_span_the_recorded_duration():
    from pytest_agentcgroup.traces.curves import recorded_figures
    from pytest_agentcgroup.traces.ir import Curve
    # ten 100 ms steps, each rising 200 MiB: ten changing windows of 0.1 s over 1 s of tool time
    short = [_curved(i, 100, [0, 50, 100], [0, 200, 200], 200.0) for i in range(10)]
    sec = recorded_figures([_trace("d", short, agent_s=5.0)])["seconds_changing"]
    assert sec["tool_seconds"] == 1.0 and sec["ticks"] == 1.0 and sec["agent_ticks"] == 0.2
    # a curve whose sampler started 900 ms in still spans the step's 1100 ms; one that runs past
    # the recorded duration is cut there; a step without peak_mb is judged by its own curve
    late = _curved(0, 1100, [900, 1000, 1100], [0, 400, 400], 400.0)
    long = _curved(1, 500, [0, 2500], [0, 500], 100.0)
    bare = Step(step_id=2, tool="bash", args={"command": "true"}, duration_ms=Measure(10, "recorded"),
                profile=Profile(curve=Curve((0.0, 10.0), (0.0, 10.0), "recorded")))
    rc = recorded_figures([_trace("e", [late, long, bare])])
    assert rc["seconds_changing"]["tool_seconds"] == 1.6 and rc["bursts"] == 1


def test_no_recorded_curves_no_section():
    res = characterize([A, B])
    assert res["recorded_curves"] is None and "recorded step curves" not in format_table(res)
