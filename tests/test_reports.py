"""Reports: results directories as DataFrames, runs.csv, figures, the HTML report and `agentcgroup
report` — from handwritten metrics.jsonl files and from a real run of the synthetic study."""
from __future__ import annotations

import csv
import json
import os

import pytest

pd = pytest.importorskip("pandas", reason="pandas is not installed (the `report` extra)")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (the `report` extra)")

from helpers import EXP_MODULE, cgroups_or_skip, step_rec, write_results, write_study  # noqa: E402

from pytest_agentcgroup import cli  # noqa: E402
from pytest_agentcgroup.reports import ResultsError, build_report, load  # noqa: E402
from pytest_agentcgroup.reports import figures  # noqa: E402
from pytest_agentcgroup.reports.frames import ablation_deltas  # noqa: E402


def two_arms(**extra) -> list[dict]:
    """Trace t/a: 4 steps under unlimited (latencies 10..40 ms) and under static-toolcall, where
    step 2 is OOM-killed."""
    recs = []
    for arm in ("unlimited", "static-toolcall"):
        for i in range(4):
            killed = arm == "static-toolcall" and i == 2
            recs.append(step_rec(config=arm, step_id=i, latency_ms=10.0 * (i + 1), max_rss_mb=100.0 * i,
                                 oom_kills=int(killed), signal=9 if killed else None,
                                 exit_code=-9 if killed else 0, mem_max_events=3 if killed else 0, **extra))
    return recs


def test_load_gives_a_row_per_step_and_per_test(tmp_path):
    res = load(write_results(tmp_path / "r", two_arms()))
    assert len(res.steps) == 8 and set(res.steps["seed"]) == {0}, "a record without seed is seed 0"
    tests = res.tests.set_index("config")
    assert list(tests.index) == ["unlimited", "static-toolcall"]
    assert tests.loc["unlimited", "latency_p50_ms"] == 25.0            # linear percentile of 10, 20, 30, 40
    assert tests.loc["unlimited", "latency_p95_ms"] == pytest.approx(38.5)
    assert tests.loc["unlimited", "latency_total_ms"] == 100.0
    assert tests.loc["static-toolcall", "oom_kills"] == 1 and tests.loc["unlimited", "oom_kills"] == 0
    assert tests.loc["static-toolcall", "failed_steps"] == 1
    assert tests.loc["static-toolcall", "mem_max_events_total"] == 3
    assert tests.loc["static-toolcall", "peak_rss_mb"] == 300.0
    assert tests.loc["unlimited", "params"] == "" and tests.loc["unlimited", "total_steps"] == 4


def test_policy_arm_counters_reach_runs_csv_and_the_html_summary(tmp_path):
    recs = two_arms(throttles=2, freezes=1, pids_max_events=5)
    recs[-1]["policy_kills"] = 1
    index = build_report(write_results(tmp_path / "r", recs), tmp_path / "out")
    with open(tmp_path / "out" / "runs.csv") as fh:
        runs = {r["config"]: r for r in csv.DictReader(fh)}
    assert {k: runs["static-toolcall"][k] for k in ("throttles_total", "freezes_total", "policy_kills_total",
                                                    "pids_max_events_total")} == {
        "throttles_total": "8", "freezes_total": "4", "policy_kills_total": "1", "pids_max_events_total": "20"}
    with open(tmp_path / "out" / "columns.csv") as fh:
        cols = {r["column"]: r for r in csv.DictReader(fh)}
    assert (cols["policy_kills_total"]["provenance"], cols["oom_kills"]["provenance"]) == ("derived", "derived")
    summary = index.read_text().split('id="summary"')[1].split("</table>")[0]
    assert all(f">{h}<span" in summary for h in ("throttles", "freezes", "policy kills", "forks refused"))
    assert summary.count('class="num bad"') == 2, "static-toolcall's OOM kill and its controller kill"


def test_seeds_and_sweep_params_are_rows_and_columns(tmp_path):
    recs = [step_rec(seed=s, params={"time_scale": ts}, latency_ms=lat)
            for s, ts, lat in ((0, 0.05, 10.0), (1, 0.05, 12.0), (0, 0.1, 30.0), (1, 0.1, 34.0))]
    tests = load(write_results(tmp_path / "r", recs)).tests
    assert len(tests) == 4 and sorted(tests["seed"]) == [0, 0, 1, 1]
    assert sorted(tests["param:time_scale"]) == [0.05, 0.05, 0.1, 0.1]
    deltas = ablation_deltas(tests)          # default = first value seen (0.05)
    lat = deltas[deltas["metric"] == "latency_p95_ms"].iloc[0]
    assert (lat["axis"], lat["value"], lat["default"]) == ("time_scale", 0.1, 0.05)
    assert lat["delta"] == pytest.approx(32.0 - 11.0)
    other = ablation_deltas(tests, {"time_scale": 0.1}).query("metric == 'latency_p95_ms'").iloc[0]
    assert other["value"] == 0.05 and other["delta"] == pytest.approx(-21.0)
    index = build_report(tmp_path / "r", tmp_path / "out")
    assert (tmp_path / "out" / "figures" / "ablation.png").is_file() and 'id="ablation"' in index.read_text()
    write_results(tmp_path / "r", [step_rec()])          # rebuilt without sweep axes: no stale ablation
    assert 'id="ablation"' not in build_report(tmp_path / "r", tmp_path / "out").read_text()
    assert not (tmp_path / "out" / "figures" / "ablation.png").exists()


def test_xdist_worker_dirs_are_merged_and_a_merged_file_wins(tmp_path):
    recs = two_arms()
    write_results(tmp_path / "r" / "gw1", recs[4:])
    write_results(tmp_path / "r" / "gw0", recs[:4])
    res = load(tmp_path / "r")
    assert [p.parent.name for p in res.sources] == ["gw0", "gw1"]
    assert len(res.steps) == 8 and len(res.tests) == 2
    write_results(tmp_path / "r", recs)       # what a controller merge writes
    assert len(load(tmp_path / "r").steps) == 8, "worker files must not be counted twice"
    assert load(tmp_path / "r").sources == [tmp_path / "r" / "metrics.jsonl"]
    os.utime(tmp_path / "r" / "metrics.jsonl", (1e9, 1e9))      # an earlier serial run's file
    assert [p.parent.name for p in load(tmp_path / "r").sources] == ["gw0", "gw1"]


def test_several_results_dirs_are_told_apart_by_run(tmp_path):
    a, b = write_results(tmp_path / "a", two_arms()), write_results(tmp_path / "b", two_arms())
    tests = load([a, b]).tests
    assert len(tests) == 4 and set(tests["run"]) == {str(a), str(b)}


@pytest.mark.parametrize("line, message", [
    ('{"trace_id": "t/a", "step_id": 0', "not valid JSON"),
    ('[1, 2]', "expected a JSON object per line, got list"),
    ('{"trace_id": "t/a", "step_id": 0, "config": "x"}', "missing field(s) latency_ms, oom_kills"),
    (json.dumps(step_rec(oom_kills="1")), "field oom_kills: expected a number, got '1'"),
    (json.dumps(step_rec(params=[1])), "field params: expected an object"),
])
def test_a_bad_record_names_file_and_line(tmp_path, line, message):
    d = write_results(tmp_path / "r", two_arms()[:2])
    with open(d / "metrics.jsonl", "a") as fh:
        fh.write("\n" + line + "\n")          # line 3 is blank, line 4 is bad
    with pytest.raises(ResultsError, match=r"metrics\.jsonl:4: ") as exc:
        load(d)
    assert message in str(exc.value)


def test_a_last_line_cut_short_by_a_killed_run_is_left_out_as_the_store_does(tmp_path):
    d = write_results(tmp_path / "r", two_arms())
    whole = (d / "metrics.jsonl").read_text()
    (d / "metrics.jsonl").write_text(whole + whole.splitlines()[0][:30])     # no newline: cut short
    assert len(load(d).records) == len(two_arms())
    (d / "metrics.jsonl").write_text(whole + whole.splitlines()[0][:30] + "\n")   # a whole bad line
    with pytest.raises(ResultsError, match=r"metrics\.jsonl:9: not valid JSON"):
        load(d)


def test_an_unknown_trace_leaves_the_earlier_report_whole(tmp_path, capsys):
    d, out = write_results(tmp_path / "r", two_arms()), tmp_path / "out"
    assert cli.main(["report", str(d), "-o", str(out)]) == 0
    before = sorted(p.name for p in (out / "figures").iterdir())
    assert before and cli.main(["report", str(d), "-o", str(out), "--trace", "no/such"]) == 1
    assert "--trace no/such: not in the results" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "figures").iterdir()) == before


def test_cli_bad_input_is_one_line_no_traceback(tmp_path, capsys):
    d = write_results(tmp_path / "r", two_arms())
    (d / "metrics.jsonl").write_text((d / "metrics.jsonl").read_text() + "{truncated\n")
    assert cli.main(["report", str(d), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"agentcgroup report: {d}/metrics.jsonl:9: not valid JSON "
                                        "(Expecting property name enclosed in double quotes at column 2)"]
    assert cli.main(["report", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err == f"agentcgroup report: {tmp_path}/missing: no such results directory\n"
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty")]) == 1
    assert "no metrics.jsonl (nor gw*/metrics.jsonl" in capsys.readouterr().err
    assert cli.main(["report", str(d), "--default", "novalue"]) == 2


def test_memory_figure_draws_each_arms_limit_from_the_config(tmp_path):
    steps = load(write_results(tmp_path / "r", two_arms())).steps
    fig = figures.memory_vs_limit(steps, "t/a", {"static-toolcall": {"memory_max_mb": 128, "memory_high_mb": 96}})
    flat = sorted({line.get_ydata()[0] for line in fig.axes[0].lines if len(set(line.get_ydata())) == 1})
    assert flat == [96, 128]
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "static-toolcall: OOM-killed step" in labels and "unlimited: OOM-killed step" not in labels
    bare = figures.memory_vs_limit(steps, "t/a", None)
    assert not any(len(set(line.get_ydata())) == 1 for line in bare.axes[0].lines), "no config, no limit line"


def test_report_of_a_real_run(pytester):
    """Run the synthetic study for real (step 1 exceeds the 128 MiB per-step limit), then
    `agentcgroup report`: runs.csv counts the kill, every column says unit and provenance."""
    cgroups_or_skip()
    write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                  "--agentcgroup-out", "out").assert_outcomes(passed=4)
    out = pytester.path / "report"
    assert cli.main(["report", str(pytester.path / "out"), "-o", str(out), "--config",
                     str(pytester.path / "study.toml")]) == 0
    with open(out / "runs.csv") as fh:
        runs = {r["config"]: r for r in csv.DictReader(fh)}
    assert set(runs) == {"unlimited", "static-env", "static-toolcall", "static-high"}
    assert runs["static-toolcall"]["oom_kills"] == "1" and runs["unlimited"]["oom_kills"] == "0"
    assert int(runs["static-high"]["mem_high_events_total"]) >= 1
    assert runs["unlimited"]["trace_id"] == "synthetic/oom-once" and runs["unlimited"]["seed"] == "0"
    with open(out / "columns.csv") as fh:
        cols = {r["column"]: r for r in csv.DictReader(fh)}
    assert (cols["oom_kills"]["unit"], cols["oom_kills"]["provenance"]) == ("count", "derived")   # a test's sum
    assert (cols["latency_p95_ms"]["unit"], cols["latency_p95_ms"]["provenance"]) == ("ms", "derived")
    pngs = sorted(p.name for p in (out / "figures").iterdir())
    assert pngs == ["kills_breaches.png", "latency_cdf.png", "memory_synthetic_oom-once.png"]
    assert all((out / "figures" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    page = (out / "index.html").read_text()
    # summary, reservation and runs tables
    assert page.count('<table class="sortable"') == 3 and "http" not in page.replace("http-equiv", "")
    # the real run's reservation: every arm reserved and used something, measured usage below the limit
    for arm, row in runs.items():
        assert float(row["reserved_gib_s"]) > 0 and 0 < float(row["used_gib_s"]), (arm, row)
    assert float(runs["static-toolcall"]["utilization"]) < 1.0
    assert (cols["reserved_gib_s"]["unit"], cols["reserved_gib_s"]["provenance"]) == ("GiB·s", "derived")
    assert "OOM kills<span class=\"unit\">count · derived</span>" in page and "ms · derived" in page   # a sum
    assert "<b>static-toolcall</b> (exp1): 1 OOM kill(s)" in page and "ms vs unlimited (derived)" in page
    assert "limits from the config file (MiB)" in page


@pytest.mark.slow
def test_a_real_xdist_run_is_read_whole(pytester):
    """Under `-n 2` the workers' records reach the controller's one metrics.jsonl; the report reads them all."""
    cgroups_or_skip()
    write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--agentcgroup-config", "study.toml",
                                  "--agentcgroup-out", "out").assert_outcomes(passed=4)
    res = load(pytester.path / "out")
    assert len(res.tests) == 4 and len(res.steps) == 16
    assert res.tests.set_index("config")["oom_kills"].to_dict() == {
        "unlimited": 0, "static-env": 1, "static-toolcall": 1, "static-high": 0}


def test_build_report_escapes_hostile_trace_ids(tmp_path):
    hostile = '<img src=x onerror="alert(1)">'
    index = build_report(write_results(tmp_path / "r", [step_rec(trace_id=hostile)]), tmp_path / "out")
    page = index.read_text()
    assert hostile not in page and "&lt;img src=x" in page


def test_a_results_directory_means_its_newest_run_and_a_run_directory_itself(tmp_path, capsys):
    results = tmp_path / "results"
    first = write_results(results / "0001_20261123T190000", [step_rec(config="unlimited")])
    second = write_results(results / "0002_20261123T193000", [step_rec(config="static-high")])
    os.symlink(second.name, results / "latest")
    assert set(load(results).tests["config"]) == {"static-high"}
    assert set(load(results / "latest").tests["config"]) == {"static-high"}
    assert set(load(first).tests["config"]) == {"unlimited"}
    both = load([first, results / "latest"]).tests
    assert sorted(both["config"]) == ["static-high", "unlimited"] and both["run"].nunique() == 2
    assert cli.main(["compare", str(first), str(results)]) == 1             # different tests: beyond tolerance
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsError, match="no run directories"):
        load(tmp_path / "empty")
    capsys.readouterr()


def test_characterization_page_from_traces_or_the_configs_corpus(tmp_path, capsys):
    """--characterize builds OUT/characterization.html from the given traces (linked from index.html);
    without it the config's corpus is used; with neither there is no page, and an earlier one goes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    haiku = os.path.join(root, "traces", "claude-code", "haiku")
    if not os.path.isdir(haiku):
        pytest.skip(f"shipped corpus not present: {haiku}")
    results = write_results(tmp_path / "r", two_arms())
    out = tmp_path / "out"
    assert cli.main(["report", str(results), "-o", str(out), "--characterize", haiku]) == 0
    index = (out / "index.html").read_text()
    assert 'href="characterization.html"' in index
    page = (out / "characterization.html").read_text()
    assert "18 trace(s), 391 step(s)" in page and "15.4 (haiku)" in page and "518 (haiku)" in page
    assert "<td>test</td><td>59</td>" in page                  # 59 profiled test-run steps in the haiku runs
    assert "What 1 Hz sampling hid" not in page and not (out / "figures" / "sampling_peaks.png").exists()
    assert 'id="paper"' in page and 'id="paper-recorded"' not in page      # no recorded curves in them
    # the recorded copies keep the 1 Hz profile beside the recorded one: the page sets them side by side
    recorded = os.path.join(root, "traces", "claude-code-recorded", "haiku")
    assert cli.main(["report", str(results), "-o", str(out), "--characterize", recorded]) == 0
    page = (out / "characterization.html").read_text()
    assert "What 1 Hz sampling hid" in page and 'src="figures/sampling_peaks.png"' in page
    assert "executed steps of" in page and (out / "figures" / "sampling_peaks.png").stat().st_size > 10_000
    assert 'id="paper-recorded"' in page and "From the recorded step curves" in page and "98.5 %" in page
    cfg = tmp_path / "exp.toml"
    cfg.write_text(f'traces = "{haiku}"\n[arms.unlimited]\n')
    build_report(results, out, config=cfg)
    assert "18 trace(s)" in (out / "characterization.html").read_text()
    build_report(results, out)
    assert not (out / "characterization.html").exists()
    assert 'href="characterization.html"' not in (out / "index.html").read_text()
    assert cli.main(["report", str(results), "-o", str(out), "--characterize", str(tmp_path / "nope")]) == 1
    assert "no such file or directory" in capsys.readouterr().err


def test_a_compressed_run_reads_as_its_metrics_jsonl(tmp_path):
    """A published run may keep metrics.jsonl gzip'd (docs/results/runs/): the same records; a damaged
    archive is one message naming it."""
    import gzip
    recs = [step_rec(step_id=i, config=arm) for i in range(3) for arm in ("unlimited", "static-toolcall")]
    plain = write_results(tmp_path / "plain", recs)
    packed = write_results(tmp_path / "packed", recs)
    (packed / "metrics.jsonl.gz").write_bytes(gzip.compress((packed / "metrics.jsonl").read_bytes()))
    (packed / "metrics.jsonl").unlink()
    assert load(packed).steps.drop(columns="run").equals(load(plain).steps.drop(columns="run"))
    results = tmp_path / "results"                  # a results directory whose newest run is packed
    results.mkdir()
    packed = packed.rename(results / "0001_20261202T171322")
    assert len(load(results).records) == len(recs)
    from pytest_agentcgroup.metrics.gate import GateError, load as load_baseline
    with pytest.raises(GateError, match=r"a published run, its records gzip'd .*gunzip it"):
        load_baseline(results)
    (packed / "metrics.jsonl.gz").write_bytes(b"\x1f\x8b not gzip after all")
    with pytest.raises(ResultsError, match=r"metrics\.jsonl\.gz: cannot read: "):
        load(packed)


def test_a_traces_memory_figure_shows_swept_and_unswept_arms_together(tmp_path):
    """In a sweep an arm no point changes has no params: the per-trace figure draws it beside each
    swept arm at its first point, and the bar figure averages a swept arm over its points."""
    recs = [step_rec(step_id=i, config="unlimited", max_rss_mb=30.0) for i in range(2)]
    recs += [step_rec(step_id=i, config="static-toolcall", params={"ablation": p}, max_rss_mb=m,
                      oom_kills=k if i == 1 else 0)
             for p, m, k in (("p50", 20.0, 1), ("max", 30.0, 0)) for i in range(2)]
    res = load(write_results(tmp_path / "r", recs))
    fig = figures.memory_vs_limit(res.steps, "t/a")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any(x.startswith("unlimited") for x in labels) and any(x.startswith("static-toolcall") for x in labels), labels
    assert "ablation" in fig.axes[0].get_title()
    bars = figures.kills_and_breaches(res.tests)
    kills = [b.get_height() for b in bars.axes[0].containers[0]]
    assert kills == [0, 0.5]          # unlimited: 0; static-toolcall: 1 kill at p50, 0 at max
