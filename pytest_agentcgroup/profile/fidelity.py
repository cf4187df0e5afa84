"""The emulator's fidelity run (`agentcgroup traces fidelity`, cli/fidelity.py): every recorded step
replayed with the `emulate` executor, in a cgroup of its own, and compared with its recording per
step (metrics/fidelity.py: the goals, the comparison and the gate).

Each step is emulated in a cgroup of its own (cgroups/placement.py ArmPlacement, an unlimited arm)
made ahead, with the emulator's launcher already joined to it: pool=True, the spawn path the
experiments replay through. (A spawn that joins in the forked child is slower, the more so while
the kernel tears down another run's cgroups: timed from before the spawn, the emulator would start
that much later with less of the step left.) It is measured with the counters the recording used:
the kernel's per-cgroup peak (v2 memory.peak | v1 memory.max_usage_in_bytes), the cgroup's CPU
(cpu.stat usage_usec: user + system over every process of the step) and the wall time from spawn
to reap. The emulator's own exit and reap are measured right before the replays and taken off each
curve step's end (replay/executors/emulate.py: the recorded duration holds the real command's
exit). With `repeat` > 1 each step's figure is the median of its repetitions.

Durations are only comparable on a host as idle as the recording's: beside the load average, the
report gives the share of the replays' wall time in which some task waited for a CPU (the kernel's
PSI, /proc/pressure/cpu "some", host-wide; None without PSI), so a miss under contention shows it.
"""
from __future__ import annotations

import statistics
import time
from typing import NamedTuple

from ..arms import Arm
from ..cgroups import RunTree, detect
from ..cgroups.placement import ArmPlacement
from ..metrics.fidelity import Figures, errors, original, recorded
from ..replay import EmulateExecutor, replay
from ..replay.executors.base import DEFAULT_TIMEOUT_S
from ..replay.executors.emulate import measure_exit_tail_ms
from ..traces.ir import Step, Trace

MB = 1024 * 1024


class Emulated(NamedTuple):
    rows: list[dict]                # one per compared step
    exit_tail_ms: float             # the emulator's exit and reap, taken off each curve step's end
    cpu_wait_pct: float | None      # share of the replays' wall time some task waited for a CPU


def cpu_wait_us() -> int | None:
    """The kernel's running total of time (us) in which some task waited for a CPU, host-wide
    (/proc/pressure/cpu "some"); None without PSI (CONFIG_PSI off, or psi=0 on the command line)."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
        return int(some[-1].removeprefix("total=")) if some and some[0] == "some" else None
    except (OSError, ValueError, IndexError):
        return None


def emulate(traces: list[Trace], *, repeat: int = 1, on_step=None) -> Emulated:
    """Emulate every recorded step `repeat` times in a cgroup of its own: one row per step, the
    emulator's exit and reap (ms, measured first) taken off each curve step's end, and how much of
    the time the host's CPUs were contended meanwhile."""
    tree = RunTree(detect())        # no cgroups: said before the emulator is built and probed
    rows = []
    try:
        tail_ms = measure_exit_tail_ms()
        wait0, t0 = cpu_wait_us(), time.monotonic()
        for trace in traces:
            steps = tuple(s for s in trace.steps if recorded(s) is not None)
            if not steps:
                continue
            runs = []
            # a long recorded step is not cut at the executor's default timeout (a recorded
            # timeout_ms still applies, as it did to the real command)
            timeout_s = max(DEFAULT_TIMEOUT_S, 2 * max(s.duration_ms.value for s in steps) / 1000.0 + 10.0)
            for i in range(repeat):
                work = tree.workload(f"fidelity-{i}")
                runs.append(replay(Trace(trace.trace_id, trace.source, steps),
                                   EmulateExecutor(time_scale=1.0, step_timeout_s=timeout_s, exit_tail_ms=tail_ms),
                                   # pooled, as the experiments replay: the joins are off the step's clock
                                   ArmPlacement(Arm("unlimited"), work, tree.controllers, pool=True)))
            for k, step in enumerate(steps):
                rows.append(_row(trace, step, [r[k] for r in runs]))
                if on_step:
                    on_step(rows[-1])
        wait1, t1 = cpu_wait_us(), time.monotonic()
    finally:
        tree.close()
    waited = (100.0 * (wait1 - wait0) / ((t1 - t0) * 1e6) if wait0 is not None and wait1 is not None and t1 > t0
              else None)
    return Emulated(rows, tail_ms, waited)


def _row(trace: Trace, step: Step, results) -> dict:
    failed = [r for r in results if not r.executed or r.exit_code != 0 or r.timed_out]
    row = {"trace_id": trace.trace_id, "step_id": step.step_id, "cmd": " ".join((step.command or "").split())[:80],
           "repeats": len(results)}
    if failed:                  # the emulator is ours: a failed emulation meets no goal
        r = failed[0]
        row["failed"] = r.error or ("timed out" if r.timed_out else f"exit {r.exit_code}, signal {r.signal}")
    med = lambda xs: statistics.median(xs) if xs and None not in xs else None      # noqa: E731
    got = Figures(med([r.counters.get("peak_bytes") for r in results if r.executed]) / MB
                  if all(r.executed and r.counters.get("peak_bytes") is not None for r in results) else None,
                  med([r.latency_ms for r in results if r.executed]),
                  # cpu.stat not read (None) is no CPU figure, not a CPU miss blamed on the emulator
                  med([r.counters["cpu_usec"] / 1000.0 if r.counters.get("cpu_usec") is not None else None
                       for r in results if r.executed]))
    want = recorded(step)
    row["emulated"] = errors(want, got)
    if failed:
        for e in row["emulated"].values():
            e["met"] = False
    orig = original(step)
    if orig is not None:
        row["original"] = errors(want, orig)
    return row
