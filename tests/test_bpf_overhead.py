"""Overhead of the memcg observer (default: reclaim, OOM, run-queue latency; and with the
opt-in per-page-fault counter): a fork/exec + allocation microbenchmark in a watched cgroup,
with and without the observer attached, interleaved (A B A B ...) in one run. Prints the median
ratio; the issue's goal is <= 3 % slowdown. Only a generous sanity bound is asserted."""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_agentcgroup.bpf import features

pytestmark = [pytest.mark.root, pytest.mark.slow]   # loads eBPF programs (and makes cgroups)

WORKER = r"""
import mmap, os, sys, time
MB = 1 << 20
for line in sys.stdin:
    n = int(line)
    t = time.perf_counter_ns()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/true", ["/bin/true"])
        os.waitpid(pid, 0)
        m = mmap.mmap(-1, 8 * MB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for i in range(0, 8 * MB, 4096): m[i] = 1
        m.close()
    print(time.perf_counter_ns() - t, flush=True)
"""
PAIRS, ITER = 8, 60


@pytest.fixture
def run_tree(request):
    """The shared `tree` fixture, once the BPF features these tests need are known to be here."""
    why = features.missing("root", "bcc", "bpf_syscall", "ringbuf", "tracefs")
    if why:
        pytest.skip(why)
    return request.getfixturevalue("tree")


@pytest.mark.parametrize("page_faults", [False, True], ids=["default", "with_page_faults"])
def test_bpf_observer_overhead(run_tree, request, page_faults):
    if page_faults and (why := features.missing("tp:exceptions/page_fault_user")):
        pytest.skip(why)                                    # an x86-only tracepoint
    from pytest_agentcgroup.bpf.loader import our_programs
    from pytest_agentcgroup.bpf.memcg_observer import MemcgObserver
    cg = run_tree.workload("overhead", inner=False)
    files = cg.join_files()
    w = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, bufsize=1, preexec_fn=lambda: [Path(f).write_text("0") for f in files])

    def block() -> float:
        w.stdin.write(f"{ITER}\n")
        w.stdin.flush()
        return int(w.stdout.readline()) / ITER / 1e3       # us per iteration

    what = "reclaim+OOM+runq" + ("+page faults" if page_faults else "")
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capman = request.config.pluginmanager.get_plugin("capturemanager")

    def attempt(k: int) -> tuple[float, str]:
        base, obs_t = [], []
        for _ in range(PAIRS):
            base.append(block())
            with MemcgObserver(page_faults=page_faults) as obs:
                obs.watch(cg.id)
                obs_t.append(block())
                assert obs.stats(cg.id).page_faults > 0 or not page_faults
        med = statistics.median(o / b for o, b in zip(obs_t, base))
        line = (f"observer overhead ({what}): fork/exec+8MB touch, {PAIRS} interleaved pairs x {ITER} iterations: "
                f"without {statistics.median(base):.0f} us/iter, with {statistics.median(obs_t):.0f} us/iter, "
                f"median ratio {med:.3f} ({(med - 1) * 100:+.1f} %; goal <= +3 %)" + (f" [attempt {k}]" if k > 1 else ""))
        if tr is not None and capman is not None:
            with capman.global_and_fixture_disabled():
                tr.write_line("")
                tr.write_line(line)
        print(line)
        return med, line

    try:
        block()                                             # warm-up
        # The sanity bound below, not the +3 % goal, is what fails. A burst of load from the rest of
        # a busy session (the VM, the image build) can land on a few observer halves of the 8 pairs:
        # up to 3 attempts, each printed; a real 1.5x cost fails them all.
        for k in range(1, 4):
            med, line = attempt(k)
            if med < 1.5:
                break
    finally:
        w.stdin.close()
        w.wait(10)
    assert our_programs(held_by={os.getpid()}) == []
    assert med < 1.5, line                                  # sanity bound only
