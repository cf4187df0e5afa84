"""Noisy neighbours replayed for real under the sandbox: the fork bomb is contained by its pids
limit (the kernel refuses forks, the host stays responsive, the step ends at its timeout and leaves
nothing), the allocation stress is held at its memory limit, the CPU hog really burns CPU."""
from __future__ import annotations

import shutil
import statistics
import threading
import time
from pathlib import Path

import pytest

from pytest_agentcgroup.arms import Arm

from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.cgroups.node import MB
from pytest_agentcgroup.replay import SandboxExecutor, replay
from pytest_agentcgroup.proc import run
from pytest_agentcgroup.traces.corpus import Corpus

TRACES = Path(__file__).resolve().parents[1] / "traces"


def noisy(name: str):
    return Corpus.open(TRACES).load(f"synthetic/noisy-{name}")


def probe_ms() -> float:
    """How long the host takes to start and reap a trivial process: what a fork bomb would ruin."""
    return run(["/bin/true"], timeout_s=30).wall_ms


@pytest.fixture
def sandbox():
    if not shutil.which("bwrap"):
        pytest.skip("bubblewrap (bwrap) is not installed")
    return SandboxExecutor(step_timeout_s=30)


def test_fork_bomb_is_contained_by_its_pids_limit(tree, sandbox):
    before = [probe_ms() for _ in range(20)]
    work = tree.workload("forkbomb")
    during, stop = [], threading.Event()

    def keep_probing():
        while not stop.is_set():
            during.append(probe_ms())
            time.sleep(0.02)
    prober = threading.Thread(target=keep_probing)
    prober.start()
    try:
        t0 = time.monotonic()
        (r,) = replay(noisy("forkbomb"), sandbox, ArmPlacement(Arm("noisy", pids_max=64), work, tree.controllers))
        took = time.monotonic() - t0
    finally:
        stop.set()
        prober.join()
    # the figures, printed not asserted (a shared 2-core host makes timings noisy; speed is the
    # benchmarks' business): the probe's spawn time before and during the bomb, the step's wall time
    base, load = statistics.median(before), statistics.median(during) if during else float("nan")
    print(f"probe spawn median: {base:.2f} ms before, {load:.2f} ms during the fork bomb "
          f"({len(during)} probes); the step took {took:.1f} s (timeout 5 s)")
    # the limit was hit: the kernel refused forks (pids.events max)
    assert r.counters["pids_max_events"] > 0, r.counters
    # the step ended at its timeout, or earlier when its own shell's fork failed at the limit (dash
    # exits then: "Cannot fork"); either way its whole cgroup was killed and a trivial process
    # still started meanwhile
    assert r.timed_out or (r.exit_code or 0) != 0, r
    assert during, "no probe process could be started while the fork bomb ran"
    # nothing left: no process in the workload, no step cgroup
    assert work.pids() == [] and not [p for p in work.unified.iterdir() if p.is_dir()]
    work.remove()
    assert not work.unified.exists()


def test_alloc_stress_is_held_at_its_memory_limit(tree, sandbox):
    if not shutil.which("stress-ng"):
        pytest.skip("stress-ng is not installed")
    work = tree.workload("alloc")
    (r,) = replay(noisy("alloc"), sandbox, ArmPlacement(Arm("noisy", memory_max_mb=256, pids_max=64), work, tree.controllers))
    assert r.counters["max_events"] > 0, r.counters                      # it pushed against the limit
    assert r.counters["peak_bytes"] <= 257 * MB, r.counters
    work.remove()


def test_cpu_hog_burns_cpu(tree, sandbox):
    if not shutil.which("stress-ng"):
        pytest.skip("stress-ng is not installed")
    work = tree.workload("cpu")
    (r,) = replay(noisy("cpu"), sandbox, ArmPlacement(Arm("noisy", pids_max=64), work, tree.controllers))
    assert r.exit_code == 0, r
    # 2 workers x 6 s on a machine shared with other work: well over one CPU-second per wall second
    assert r.counters["cpu_usec"] > 0.5 * r.latency_ms * 1000, (r.counters, r.latency_ms)
    work.remove()
