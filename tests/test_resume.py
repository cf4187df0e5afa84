"""Sweeps and resume, in pytest subprocesses on real cgroups: the matrix's axes become test ids and
record fields; a run killed with SIGKILL midway, rerun with --agentcgroup-resume, completes only
what was missing, and the final metrics.jsonl holds every step once."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, killed_on_purpose, leaked, our_cgroups, run_study, write_study

STEPS = 4                                   # write_study: three bash steps and a noop
ARMS = ("unlimited", "static-env", "static-toolcall", "static-high")


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _kill_midway(pytester, host, lines_before_kill: int):
    """Start the study serially and SIGKILL pytest once `lines_before_kill` steps are on disk.
    Returns the records on disk and the killed pytest's pid."""
    metrics = pytester.path / "out" / "latest" / "metrics.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--agentcgroup-config",
                             "study.toml", "--agentcgroup-out", "out", "-q"], cwd=pytester.path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= lines_before_kill:
            break
        time.sleep(0.02)
    killed_on_purpose(host, proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    got = _records(metrics)
    done = Counter(r["config"] for r in got)
    assert done[ARMS[0]] == STEPS and 0 < done[ARMS[1]] < STEPS, f"not killed mid-test: {done}"
    return got, proc.pid


@pytest.fixture
def slow_project(pytester):
    # each 200 ms step takes 1 s: the kill lands inside the second test with time to spare
    write_study(pytester.path)
    text = (pytester.path / "study.toml").read_text().replace("time_scale = 1.0", "time_scale = 5.0")
    (pytester.path / "study.toml").write_text(text)
    pytester.makepyfile(test_exp1=EXP_MODULE)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_killed_run_resumed_completes_only_what_was_missing(pytester, slow_project, workers):
    host = cgroups_or_skip()
    before, killed = _kill_midway(pytester, host, STEPS + 2)
    first = [r for r in before if r["config"] == ARMS[0]]

    runs = sorted(p.name for p in (pytester.path / "out").iterdir())
    assert len(runs) == 2 and runs[0].startswith("0001_") and runs[1] == "latest", runs
    rerun = run_study(pytester, "--agentcgroup-resume", "-rs", *workers)
    rerun.assert_outcomes(passed=3, skipped=1)
    rerun.stdout.fnmatch_lines([f"*resume: {ARMS[0]}:oom-once is already complete in *metrics.jsonl*"])
    out = pytester.path / "out"
    assert sorted(p.name for p in out.iterdir()) == runs, "the resume continued the killed run, made no other"
    run = out / runs[0]
    assert sorted(p.name for p in run.iterdir()) == ["complete.json", "metrics.jsonl", "run.json", "summary.json"]
    after = _records(run / "metrics.jsonl")
    steps = Counter((r["config"], r["step_id"]) for r in after)
    assert steps == Counter({(a, s): 1 for a in ARMS for s in range(STEPS)}), steps
    assert [r for r in after if r["config"] == ARMS[0]] == first, "a complete test was replayed again"
    assert all(r["seed"] == 0 and r["params"] == {} for r in after)
    summary = {s["config"]: s for s in json.loads((run / "summary.json").read_text())}
    assert set(summary) == set(ARMS) and all(s["total_steps"] == STEPS for s in summary.values())
    assert summary["static-toolcall"]["oom_kills"] == 1
    # the run is finished now: a further resume starts a new run, and the finished one stays as it was
    kept = (run / "metrics.jsonl").read_bytes()
    again = run_study(pytester, "--agentcgroup-resume", *workers)
    again.assert_outcomes(passed=4)
    newer = sorted(p.name for p in out.iterdir())
    assert len(newer) == 3 and newer[1].startswith("0002_") and (out / "latest").resolve() == (out / newer[1]).resolve()
    assert (run / "metrics.jsonl").read_bytes() == kept
    assert Counter((r["config"], r["step_id"]) for r in _records(out / newer[1] / "metrics.jsonl")) == steps
    assert leaked(host) == [] and our_cgroups(host, killed) == [], "the killed run's roots were not cleared"


MATRIX = """
[experiments.exp1.matrix]
seeds = [0, 1]
ablations = [{ name = "half-limit", arms = { static-toolcall = { memory_max_mb = 64 } } }, { name = "as-is" }]
sizes = [{ name = "fast", time_scale = 0.5 }]
"""


@pytest.mark.slow
def test_matrix_axes_are_test_ids_and_record_fields(pytester):
    cgroups_or_skip()
    write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    with open(pytester.path / "study.toml", "a") as f:
        f.write(MATRIX)
    ids = [line for line in run_study(pytester, "--collect-only", "-q").outlines if "::" in line]
    assert len(ids) == 4 * 2 * 2
    assert "test_exp1.py::test_exp1[static-toolcall:oom-once:seed1:half-limit:fast]" in ids
    assert ids == [line for line in run_study(pytester, "--collect-only", "-q").outlines if "::" in line]

    result = run_study(pytester, "-k", "static-toolcall and seed1")
    result.assert_outcomes(passed=2)
    recs = _records(pytester.path / "out" / "latest" / "metrics.jsonl")
    assert {(r["seed"], r["params"]["ablation"], r["params"]["size"]) for r in recs} == {
        (1, "half-limit", "fast"), (1, "as-is", "fast")}
    assert all(r["replayed_duration_ms"] in (None, 0.0, 100.0) for r in recs)     # size=fast: time_scale 0.5
    summary = json.loads((pytester.path / "out" / "latest" / "summary.json").read_text())
    assert sorted((s["seed"], s["params"]["ablation"]) for s in summary) == [(1, "as-is"), (1, "half-limit")]


def test_an_arm_no_point_changes_runs_once_per_seed_named_by_no_point(pytester):
    """A sweep of static-toolcall's limit: unlimited, static-env and static-high would measure the same
    thing at every point, so they run once per seed; an override of the experiment (time_scale) changes
    every arm, so then every arm runs at every point."""
    write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    with open(pytester.path / "study.toml", "a") as f:
        f.write('[experiments.exp1.matrix]\nseeds = [0, 1]\nablations = [{ name = "p50", arms = { static-toolcall = '
                '{ memory_max_mb = 64 } } }, { name = "max", arms = { static-toolcall = { memory_max_mb = 512 } } }]\n')
    ids = sorted(line.split("[")[1].rstrip("]") for line in run_study(pytester, "--collect-only", "-q").outlines
                 if "::" in line)
    assert ids == sorted([f"{arm}:oom-once:seed{s}" for arm in ("unlimited", "static-env", "static-high") for s in (0, 1)]
                         + [f"static-toolcall:oom-once:seed{s}:{p}" for s in (0, 1) for p in ("p50", "max")])
    with open(pytester.path / "study.toml", "a") as f:
        f.write('sizes = [{ name = "fast", time_scale = 0.5 }]\n')
    ids = [line for line in run_study(pytester, "--collect-only", "-q").outlines if "::" in line]
    assert len(ids) == 4 * 2 * 2 and "test_exp1.py::test_exp1[unlimited:oom-once:seed1:max:fast]" in ids


def test_bad_matrix_is_one_clear_message(pytester):
    write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    with open(pytester.path / "study.toml", "a") as f:
        f.write('[experiments.exp1.matrix]\nablations = [{ name = "x", arms = { nope = { memory_max_mb = 1 } } }]\n')
    result = run_study(pytester, "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*study.toml: experiments.exp1.matrix.ablations[[]0[]].arms.nope: no arm of that name*"])
    assert "Traceback" not in result.stdout.str()


def test_resume_reads_what_a_killed_parallel_run_left(tmp_path):
    """A parallel run killed before its controller merged: DIR has its old file and worker files,
    one of them cut mid-line. A resumed store sees one version of each test, every step once."""
    from pytest_agentcgroup.metrics.store import METRICS_FILE, ResultsStore, begin_session, run_key

    def rec(arm, step):
        return json.dumps({"experiment": "exp1", "config": arm, "trace_id": "t/a", "step_id": step,
                           "seed": 0, "params": {}, "executed": True, "latency_ms": 1.0, "mem_high_events": 0,
                           "mem_max_events": 0, "oom_kills": 0, "timed_out": False}) + "\n"
    (tmp_path / METRICS_FILE).write_text(rec("a", 0) + rec("a", 1) + rec("b", 0))     # an older run
    (tmp_path / "gw0").mkdir()
    (tmp_path / "gw0" / METRICS_FILE).write_text(rec("b", 0) + rec("b", 1))           # b redone, complete
    (tmp_path / "gw1").mkdir()
    (tmp_path / "gw1" / METRICS_FILE).write_text(rec("c", 0) + rec("c", 1)[:20])      # c cut mid-line
    begin_session(tmp_path)                         # what the controller does before the first test
    store = ResultsStore(tmp_path, resume=True)
    key = lambda arm: run_key("exp1", arm, "t/a")  # noqa: E731
    assert [store.complete(key(a), 2) for a in "abc"] == [True, True, False]
    store.restart(key("c"))
    store.append(json.loads(rec("c", 0)))
    store.append(json.loads(rec("c", 1)))
    store.close()
    lines = [json.loads(x) for x in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert Counter((r["config"], r["step_id"]) for r in lines) == Counter(
        {(a, s): 1 for a in "abc" for s in (0, 1)})
    assert sorted(p.name for p in tmp_path.iterdir()) == [METRICS_FILE, "summary.json"]


def _step(arm, step, latency_ms=1.0):
    return {"experiment": "exp1", "config": arm, "trace_id": "t/a", "step_id": step, "seed": 0, "params": {},
            "executed": True, "latency_ms": latency_ms, "mem_high_events": 0, "mem_max_events": 0,
            "oom_kills": 0, "timed_out": False}


def _write(path, records, mtime_ns):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_resume_after_a_serial_run_ignores_older_worker_files(tmp_path):
    """A parallel run killed, then a full serial run (which rewrote DIR's file), then a resume: the
    killed run's worker file is older than DIR's file, so the serial run's version of the test wins
    (it used to be the stale worker's) and the stale worker directory is gone."""
    from pytest_agentcgroup.metrics.store import METRICS_FILE, ResultsStore, begin_session, run_key

    now = time.time_ns()
    _write(tmp_path / "gw0" / METRICS_FILE, [_step("a", 0, 999.0), _step("a", 1, 999.0)], now - 60 * 10**9)
    _write(tmp_path / METRICS_FILE, [_step("a", 0), _step("a", 1)], now)
    earlier = begin_session(tmp_path)
    assert [r["latency_ms"] for r in earlier] == [1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [METRICS_FILE, "summary.json"]
    store = ResultsStore(tmp_path, resume=True)
    assert store.complete(run_key("exp1", "a", "t/a"), 2)
    assert [s["latency_p95_ms"] for s in store.close()] == [1.0]
    assert [r["latency_ms"] for r in _records(tmp_path / METRICS_FILE)] == [1.0, 1.0]


def test_a_worker_file_newer_than_the_runs_file_wins_the_merge(tmp_path):
    """A parallel run killed before its merge: its worker file is newer than the run's own file, so
    its version of a test replaces the older one."""
    from pytest_agentcgroup.metrics.store import METRICS_FILE, merge_workers

    _write(tmp_path / METRICS_FILE, [_step("a", 0), _step("b", 0)], time.time_ns() - 60 * 10**9)
    _write(tmp_path / "gw1" / METRICS_FILE, [_step("a", 0, 2.0)], time.time_ns())
    records, _ = merge_workers(tmp_path, keep=_records(tmp_path / METRICS_FILE))
    assert [(r["config"], r["latency_ms"]) for r in records] == [("b", 1.0), ("a", 2.0)]


def test_runs_are_numbered_resume_takes_only_an_unfinished_newest_run(tmp_path):
    from pytest_agentcgroup.metrics import store

    assert store.runs(tmp_path / "absent") == [] and store.unfinished_run(tmp_path) is None
    first = store.new_run(tmp_path)
    assert first.name.startswith("0001_") and not first.exists()      # choosing makes nothing
    first.mkdir()
    _write(first / store.METRICS_FILE, [_step("a", 0)], time.time_ns())
    assert store.unfinished_run(tmp_path) == first                     # no complete.json: unfinished
    store.mark_finished(first, 0)
    assert store.unfinished_run(tmp_path) is None
    second = store.new_run(tmp_path)
    assert second.name.startswith("0002_")
    _write(second / "gw0" / store.METRICS_FILE, [_step("a", 0)], time.time_ns())    # a parallel run's
    store.point_latest(second)
    assert (tmp_path / "latest").resolve() == second.resolve()
    assert store.resolve_run(tmp_path) == second                      # the results dir: its newest run
    assert store.resolve_run(tmp_path / "latest") == tmp_path / "latest"    # the link is a run dir
    assert store.resolve_run(first) == first
    (tmp_path / "empty").mkdir()
    with pytest.raises(store.NoRun, match="not a results directory"):
        store.resolve_run(tmp_path / "empty")


_HOLDER = """
import sys, time
from pathlib import Path
from pytest_agentcgroup.metrics import store
fd = store.claim(Path(sys.argv[1]), new=False)
print("held", flush=True)
time.sleep(60)
"""


def test_a_run_another_live_process_writes_is_never_resumed(tmp_path):
    """A real second process holds the unfinished newest run (store.claim, as a writing session
    does): resume_run does not take it; once that process is gone, it does."""
    from pytest_agentcgroup.metrics import store

    run = store.new_run(tmp_path)
    run.mkdir(parents=True)
    _write(run / store.METRICS_FILE, [_step("a", 0)], time.time_ns())
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert store.in_use(run)
        assert store.resume_run(tmp_path) == (None, None, run)
    finally:
        holder.kill()
        holder.wait(10)
    assert not store.in_use(run)
    found, fd, live = store.resume_run(tmp_path)
    try:
        assert (found, live) == (run, None) and store.in_use(run)      # now ours: nobody else may take it
    finally:
        store.release(fd)
    assert sorted(p.name for p in run.iterdir()) == [store.METRICS_FILE], "the lock adds nothing to the run"


@pytest.mark.slow
def test_resume_while_the_run_is_still_written_starts_a_new_run(pytester, slow_project):
    """A session still writing its run (alive, not killed); a second session with resume must not
    take it over: it writes a new run and says so, and the live session's run holds only its own
    records."""
    host = cgroups_or_skip()
    metrics = pytester.path / "out" / "latest" / "metrics.jsonl"
    live = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--agentcgroup-config",
                             "study.toml", "--agentcgroup-out", "out", "-q", "-k", "not static-high"],
                            cwd=pytester.path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (metrics.exists() and metrics.read_text().strip()):
            time.sleep(0.05)
        first = (pytester.path / "out" / "latest").resolve()
        assert first.name.startswith("0001_") and live.poll() is None, "the first session is not writing"
        second = run_study(pytester, "--agentcgroup-resume", "-k", "static-high")
        second.assert_outcomes(passed=1)
        second.stdout.fnmatch_lines([f"*resume: {first} is being written by another live session*new run*0002_*"])
        assert live.wait(180) == 0
    finally:
        if live.poll() is None:
            live.kill()
            live.wait(30)
    recs = _records(first / "metrics.jsonl")
    assert {r["config"] for r in recs} == set(ARMS) - {"static-high"} and (first / "complete.json").is_file()
    newer = [p for p in (pytester.path / "out").iterdir() if p.name.startswith("0002_")]
    assert len(newer) == 1 and {r["config"] for r in _records(newer[0] / "metrics.jsonl")} == {"static-high"}
    assert leaked(host) == []


def test_a_results_directory_as_baseline_is_never_the_run_being_written(tmp_path):
    """resolve_run: run directories beat an old top-level metrics.jsonl beside them, and the run
    this session writes (resumed or new) is never its own baseline."""
    from pytest_agentcgroup.metrics import store

    _write(tmp_path / store.METRICS_FILE, [_step("old", 0)], time.time_ns())     # before runs had directories
    first = tmp_path / "0001_20260101T000000"
    _write(first / store.METRICS_FILE, [_step("a", 0)], time.time_ns())
    store.mark_finished(first, 0)
    second = tmp_path / "0002_20260101T010000"
    _write(second / store.METRICS_FILE, [_step("a", 0)], time.time_ns())          # unfinished: resumed
    store.point_latest(second)
    assert store.resolve_run(tmp_path) == second, "the newest run wins over the old top-level file"
    assert store.resolve_run(tmp_path, exclude=second) == first
    assert store.resolve_run(tmp_path / "latest", exclude=second) == first
    assert store.resolve_run(first, exclude=second) == first
    with pytest.raises(store.NoRun, match="is the run this session writes"):
        store.resolve_run(second, exclude=second)
    only = tmp_path / "only"
    _write(only / "0001_20260101T000000" / store.METRICS_FILE, [_step("a", 0)], time.time_ns())
    with pytest.raises(store.NoRun, match="its only run is the one this session writes"):
        store.resolve_run(only, exclude=only / "0001_20260101T000000")
