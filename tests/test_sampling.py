"""`agentcgroup traces sampling`: a profiled step's recorded figures against the ones its source
derived from ~1 Hz samples, and the bursts the samples did not see."""
from __future__ import annotations

import json
from pathlib import Path

from pytest_agentcgroup import cli
from pytest_agentcgroup.traces.ir import Measure, Original, Outcome, Profile, Step, Trace, write_trace
from pytest_agentcgroup.traces.sampling import compare

REPO = Path(__file__).resolve().parents[1]


def step(i, cmd, *, rec_mb, der_mb, rec_ms=100.0, der_ms=1000.0, rec_cpu=50.0, der_cpu=10.0, status="ok"):
    return Step(i, "bash", {"command": cmd}, duration_ms=Measure(rec_ms, "recorded"),
                profile=Profile(peak_mb=Measure(rec_mb, "recorded"), cpu_ms=Measure(rec_cpu, "recorded")),
                outcome=Outcome(status, 0 if status == "ok" else 1),
                original=Original(duration_ms=Measure(der_ms, "recorded"),
                                  profile=Profile(peak_mb=Measure(der_mb, "derived"), cpu_ms=Measure(der_cpu, "derived"))))


def trace():
    return Trace("cc-recorded/x", {"format": "claude-code"}, (
        step(0, "python -m pytest\ntests", rec_mb=120.0, der_mb=0.4, status="failed"),  # missed: no sample saw it
        step(1, "ls", rec_mb=2.0, der_mb=4.0),
        step(2, "pip install -e .", rec_mb=60.0, der_mb=30.0),
        step(3, "python x.py", rec_mb=49.0, der_mb=0.0),          # under --missed-mb: not missed
        Step(4, "read", {"file_path": "/a"}, profile=Profile(peak_mb=Measure(1.0, "derived"))),   # nothing recorded
        Step(5, "bash", {"command": "ls"}, profile=Profile(peak_mb=Measure(3.0, "recorded")),     # nothing derived
             outcome=Outcome("ok", 0), original=Original())))


def test_each_side_and_their_ratio_and_the_steps_the_samples_missed():
    res = compare([trace()])
    assert (res["traces"], res["steps"], res["steps_ok"]) == (1, 4, 3)
    peak = res["peak"]["all"]
    assert peak["steps"] == 4 and peak["recorded"]["max"] == 120.0 and peak["derived"]["max"] == 30.0
    assert peak["ratio"]["steps"] == 3 and peak["ratio"]["p50"] == 2.0     # 300, 0.5, 2: derived 0 has no ratio
    assert peak["recorded_higher"] == 3 and res["peak"]["ok"]["steps"] == 3
    assert res["duration"]["all"]["ratio"]["p50"] == 0.1 and res["cpu"]["all"]["ratio"]["p50"] == 5.0
    assert [(m["step_id"], m["kind"], m["outcome"], m["command"]) for m in res["missed"]] == [
        (0, "test", "failed", "python -m pytest tests")]
    assert [m["step_id"] for m in compare([trace()], missed_mb=40)["missed"]] == [0, 3]


def test_the_cli_prints_the_table_or_says_there_is_nothing_to_compare(tmp_path, capsys):
    write_trace(trace(), tmp_path / "x.json")
    assert cli.main(["traces", "sampling", str(tmp_path / "x.json")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("4 executed steps of 1 traces") and "missed by 1 Hz: 1 steps" in out
    assert cli.main(["traces", "sampling", "--json", str(tmp_path / "x.json")]) == 0
    assert json.loads(capsys.readouterr().out)["missed"][0]["recorded_mb"] == 120.0
    bare = Trace("t/y", {"format": "test"}, (Step(0, "bash", {"command": "ls"}),))
    write_trace(bare, tmp_path / "y.json")
    assert cli.main(["traces", "sampling", str(tmp_path / "y.json"), str(tmp_path / "absent.json")]) == 1
    err = capsys.readouterr().err
    assert "absent.json: no such file or directory" in err and "no executed step carries both" in err
    assert cli.main(["traces", "sampling", "--subset", "nope", "--traces", str(REPO / "traces")]) == 1
    assert "'nope' is neither a subset (" in capsys.readouterr().err
    assert cli.main(["traces", "sampling"]) == 2
    err = capsys.readouterr().err
    assert "give trace files or directories, or --subset NAME" in err and "Traceback" not in err


def test_the_shipped_recorded_subset_compares_the_claude_code_runs_only():
    """Only the Claude Code runs had derived profiles; the mini-swe-agent and OpenHands trajectories
    kept none, so --subset recorded compares the same steps as their family directory."""
    from pytest_agentcgroup.traces.corpus import Corpus
    corpus = Corpus.open(REPO / "traces")
    by_subset = compare(corpus.load(t) for t in corpus.ids("recorded"))
    by_family = compare(corpus.load(t) for t in corpus.ids("recorded") if t.startswith("claude-code-recorded/"))
    assert by_subset == by_family and by_subset["traces"] >= 40 and by_subset["missed"]
