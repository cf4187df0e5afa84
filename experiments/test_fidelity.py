"""Fidelity: the emulator replays the shipped recorded-here corpus
(traces/recorded-here: real commands recorded in cgroups by `agentcgroup traces profile`) and at
least 90 % of its steps meet both the peak (±5 % or 4 MiB) and the duration (±10 %) goal, each
step's figure the median of REPEAT emulations (a step's duration: of those no hypervisor steal
disturbed; where every one was, the step counts neither way, and a verdict the steal-timed steps
could turn is not given: the peaks are still gated and the test skips saying so). The whole
distribution (peak, duration, CPU), the worst steps and the load before and after beside them are
printed, as `agentcgroup traces fidelity` prints them. This is where the duration goal is gated (a timed benchmark, not a unit test:
tests/test_fidelity.py checks what does not depend on the load).

Needs root or a delegated cgroup (each emulated step gets a cgroup of its own) and a C compiler
(the emulator is compiled on first use); it skips naming either one missing. The shipped corpus
missing is a failure.
"""
import os
from pathlib import Path

import pytest

from pytest_agentcgroup.cgroups import CgroupUnavailable
from pytest_agentcgroup.metrics import fidelity
from pytest_agentcgroup.profile import fidelity as fidelity_run
from pytest_agentcgroup.replay import ExecutorUnavailable
from pytest_agentcgroup.traces.ir import read_traces

pytestmark = pytest.mark.experiment(name="fidelity")

CORPUS = Path(__file__).resolve().parent.parent / "traces" / "recorded-here"
REPEAT = 3


def test_fidelity_on_the_recorded_here_corpus(capsys):
    files = sorted(CORPUS.glob("*.json"))
    # the corpus is shipped with the project: without it the checkout is broken, not the machine
    assert files, f"no recorded corpus at {CORPUS} (shipped; `make recorded-here` writes it again)"
    traces = [t for f in files for t in read_traces(f)]
    before = os.getloadavg()
    try:
        em = fidelity_run.emulate(traces, repeat=REPEAT)
    except CgroupUnavailable as exc:
        pytest.skip(f"cannot emulate in cgroups: {exc}")
    except ExecutorUnavailable as exc:
        pytest.skip(str(exc))
    after = os.getloadavg()
    rows = em.rows
    res = fidelity.result(rows, before, after, REPEAT, em.exit_tail_ms, em.host())
    load = (f"load average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in before)} before, "
            f"{'/'.join(f'{x:.2f}' for x in after)} after, on {len(os.sched_getaffinity(0))} CPU(s)")
    with capsys.disabled():
        print(f"\nfidelity of the emulator on {CORPUS} ({len(files)} file(s), recorded here):")
        print(fidelity.format_report(res))
        print(f"measured under {load}: durations and CPU are load-sensitive")
    g = res["gate"]
    assert g["steps"] >= len(files), f"only {g['steps']} recorded step(s) compared in {len(files)} file(s)"
    assert not [r for r in rows if r.get("failed")], "an emulation failed (see the worst steps above)"
    if not g["checked"] and g["stolen"] and not g["unmeasured"]:
        # the peaks (the kernel's, load-insensitive) are still gated; the durations cannot be
        peaks = res["emulated"]["peak_mb"]["met_share"]
        assert peaks >= g["goal_share"], f"{100 * peaks:.0f}% of the steps meet the peak goal; the goal is >= 90%"
        pytest.skip(f"the duration goal cannot be checked here: {g['stolen']} of {g['steps']} step(s) were timed only "
                    f"while the hypervisor took the CPUs ({fidelity.contention(res)}); {g['met_both']} meet both goals, "
                    f"so the share is between {100 * g['share']:.0f}% and {100 * g['share_max']:.0f}% "
                    f"(peaks: {100 * peaks:.0f}% met)")
    assert g["passed"], (f"{g['met_both']}/{g['steps']} step(s) ({100 * g['share']:.0f}%) meet both the peak and the "
                         f"duration goal; the goal is >= {100 * g['goal_share']:.0f}% ({load}; {fidelity.contention(res)})")
