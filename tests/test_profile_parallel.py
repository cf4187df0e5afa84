"""`agentcgroup traces profile -n N`: worker processes on disjoint CPU slices write what a serial run
writes (every trace, the manifest, resumable), and the first worker that cannot go on stops the run
with one message."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_agentcgroup.cgroups import detect
from pytest_agentcgroup.cgroups.isolate import cpu_slice
from pytest_agentcgroup.profile.run import ProfileError, Settings, profile_traces
from pytest_agentcgroup.traces.corpus import Corpus
from pytest_agentcgroup.traces.ir import Step, Trace, read_traces, write_trace

from helpers import leaked


pytestmark = pytest.mark.slow

#: a step whose exit code says the lowest CPU it may run on (10 + CPU), after a pause long enough
#: that every worker has started before the queue is empty
ON_CPU = "sleep 2; exit $((10 + $(python3 -c 'import os; print(min(os.sched_getaffinity(0)))')))"


@pytest.fixture
def two_cpus(can_profile):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip(f"-n 2 needs 2 CPUs; this process may use {len(os.sched_getaffinity(0))}")


def write(tmp_path: Path, trace_id: str, steps) -> Path:
    path = tmp_path / "in" / (trace_id.replace("/", "_") + ".json")
    path.parent.mkdir(exist_ok=True)
    write_trace(Trace(trace_id, {"format": "test"}, tuple(steps)), path)
    return path


def test_workers_run_on_disjoint_cpus_and_write_every_trace_and_the_manifest(tmp_path, two_cpus):
    paths = [write(tmp_path, f"t/{i}", [Step(0, "bash", {"command": ON_CPU, "cwd": "/workspace"}),
                                        Step(1, "bash", {"command": ON_CPU, "cwd": "/workspace"})])
             for i in range(6)]
    out, lines = tmp_path / "out", []
    done = profile_traces(paths, out, Settings(memory_max_mb=256), progress=lines.append, workers=2)
    assert sorted(done["profiled"]) == [f"t/{i}" for i in range(6)] and done["skipped"] == []
    assert done["peak_rss_mib"]["largest_worker"] > 10
    slices = [{10 + c for c in cpu_slice(i, 2)} for i in range(2)]
    seen = []
    for i in range(6):
        (t,) = read_traces(out / "t" / f"{i}.json")
        codes = {s.outcome.exit_code for s in t.steps}
        # both steps of a trace on one worker's slice, and that slice only
        assert len(codes) == 1 and any(codes <= s for s in slices), (t.trace_id, codes, slices)
        seen.append(codes)
        # the provenance says which CPUs: the worker's slice, the one the steps saw
        assert {10 + c for c in t.source["profiled"]["machine"]["step_cpus"]} in slices
        assert all(s.duration_ms.provenance == "recorded" and s.duration_ms.value >= 2000 for s in t.steps)
    assert all(any(c <= s for c in seen) for s in slices), f"a worker profiled nothing: {seen}"
    assert set(Corpus.open(out).ids("profiled")) == {f"t/{i}" for i in range(6)}
    assert sum(": step " in ln and ln.startswith("[worker ") for ln in lines) == 12
    # resumable as a serial run is: everything complete, nothing run again
    again = profile_traces(paths, out, Settings(memory_max_mb=256), workers=2)
    assert again["profiled"] == [] and len(again["skipped"]) == 6
    assert leaked(detect()) == [], "a worker's run root or cpuset outlived it"


def test_a_worker_that_cannot_go_on_stops_the_run_naming_the_trace(tmp_path, two_cpus):
    from pytest_agentcgroup.traces.task import Task
    ok = write(tmp_path, "t/ok", [Step(0, "bash", {"command": "sleep 1", "cwd": "/workspace"})])
    bad = tmp_path / "in" / "task.json"
    write_trace(Trace("t/acme__widget-7", {"format": "test"}, (Step(0, "bash", {"command": "ls", "cwd": "/testbed"}),),
                      task=Task(instance_id="acme__widget-7", path="/testbed")), bad)
    with pytest.raises(ProfileError, match=r"worker \d \(CPUs [\d,]+\): trace t/acme__widget-7 ran on task "
                                           r"acme__widget-7 .*its workspace is missing here"):
        profile_traces([ok, bad], tmp_path / "out", Settings(memory_max_mb=256), workers=2)
    import multiprocessing
    assert multiprocessing.active_children() == [], "a worker outlived the run"
    assert leaked(detect()) == []
    # a trace a worker finished before the stop is listed (t/ok, handed out first, may have been)
    out = tmp_path / "out"
    if (out / "t" / "ok.json").exists():
        assert "t/ok" in Corpus.open(out).ids("profiled")


def test_a_memory_share_below_the_step_limit_is_refused_naming_both(tmp_path, two_cpus):
    """1/N of the memory under each worker: a step limit above it would OOM-kill in parallel what a
    serial run lets through."""
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    path = write(tmp_path, "t/a", [Step(0, "bash", {"command": "true", "cwd": "/workspace"})])
    with pytest.raises(ProfileError, match=r"its share of the memory \(\d+ MiB, 1/2 of what this command may use\) "
                                           rf"is below --memory-max-mb {total_mb}"):
        profile_traces([path], tmp_path / "out", Settings(memory_max_mb=total_mb), workers=2)
    assert leaked(detect()) == []


def test_more_workers_than_cpus_is_one_message_before_anything_runs(tmp_path):
    path = write(tmp_path, "t/a", [Step(0, "bash", {"command": "true"})])
    n = len(os.sched_getaffinity(0)) + 1
    done = subprocess.run([sys.executable, "-m", "pytest_agentcgroup.cli", "traces", "profile", str(path),
                           "-o", str(tmp_path / "out"), "-n", str(n)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"-n {n}: {n} workers but only {n - 1} CPU(s)" in done.stderr, done.stderr
    assert not (tmp_path / "out" / "t").exists()

