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
exit). With `repeat` > 1 each step's figure is the median of its repetitions (its duration: of those
no steal disturbed, `duration_repeats` of them).

Durations are only comparable on a host as idle as the recording's: beside the load average, the
report gives the share of the replays' wall time in which some task waited for a CPU (the kernel's
PSI, /proc/pressure/cpu "some", host-wide; None without PSI) and the hypervisor's steal, so a miss
under contention shows it; a replay disturbed by steal is run again (emulate()).
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
    steal_pct: float | None         # share of the CPUs' time the hypervisor gave to others (None: no /proc/stat)
    replays: int                    # trace replays run, the ones run again included
    disturbed: int                  # of those, with steal above STEAL_LIMIT_PCT
    disturbed_kept: int             # of those, kept: the trace's budget of replays run again was spent

    def host(self) -> dict:
        """What was measured of the host meanwhile, as metrics/fidelity.py result() takes it."""
        return {"cpu_wait_pct": self.cpu_wait_pct, "steal_pct": self.steal_pct, "steal_limit_pct": STEAL_LIMIT_PCT,
                "replays": self.replays, "disturbed": self.disturbed, "disturbed_kept": self.disturbed_kept}


#: a trace's replay during which the hypervisor took more than this share of the CPUs' time is run again,
#: at most RERUNS_PER_REPEAT times per repetition asked for (steal comes in bursts that can outlast a round)
STEAL_LIMIT_PCT = 1.0
RERUNS_PER_REPEAT = 2


def cpu_wait_us() -> int | None:
    """The kernel's running total of time (us) in which some task waited for a CPU, host-wide
    (/proc/pressure/cpu "some"); None without PSI (CONFIG_PSI off, or psi=0 on the command line)."""
    try:
        with open("/proc/pressure/cpu") as f:
            some = f.readline().split()
        return int(some[-1].removeprefix("total=")) if some and some[0] == "some" else None
    except (OSError, ValueError, IndexError):
        return None


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, all) clock ticks of every CPU so far (/proc/stat "cpu": user .. steal); None unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        ticks = [int(x) for x in fields[1:9]]
        return (ticks[7], sum(ticks)) if fields[0] == "cpu" and len(ticks) == 8 else None
    except (OSError, ValueError, IndexError):
        return None


def steal_pct(before, after) -> float | None:
    """The share (%) of the CPUs' time stolen between two cpu_ticks() readings; None unreadable."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return 100.0 * (after[0] - before[0]) / (after[1] - before[1])


def emulate(traces: list[Trace], *, repeat: int = 1) -> Emulated:
    """Emulate every recorded step `repeat` times in a cgroup of its own: one row per step, the
    emulator's exit and reap (ms, measured first) taken off each curve step's end, and how much of
    the time the host's CPUs were contended meanwhile.

    The repetitions take turns (the whole corpus once, then again), so a burst of noise from
    outside lands on one repetition of a step, not on all. A trace's replay during which the
    hypervisor ran something else on our CPUs for more than STEAL_LIMIT_PCT of their time (steal:
    the emulator then falls behind its schedule, as no real command would have when recorded) is run
    again, at most RERUNS_PER_REPEAT * `repeat` times per trace; past that budget the disturbed
    replays are kept and counted. A step's duration is then the median of its undisturbed
    repetitions; where all of them were disturbed, the row says so (`duration_stolen`) and the gate
    does not count its duration either way (metrics/fidelity.py gate)."""
    tree = RunTree(detect())        # no cgroups: said before the emulator is built and probed
    todo = [(trace, steps) for trace in traces
            if (steps := tuple(s for s in trace.steps if recorded(s) is not None))]
    kept: dict[int, list] = {k: [] for k in range(len(todo))}
    retries = {k: RERUNS_PER_REPEAT * repeat for k in range(len(todo))}
    disturbed = disturbed_kept = replays = 0
    try:
        tail_ms = measure_exit_tail_ms()
        wait0, ticks0, t0 = cpu_wait_us(), cpu_ticks(), time.monotonic()
        while pending := [k for k in kept if len(kept[k]) < repeat]:
            for k in pending:
                trace, steps = todo[k]
                # a long recorded step is not cut at the executor's default timeout (a recorded
                # timeout_ms still applies, as it did to the real command)
                timeout_s = max(DEFAULT_TIMEOUT_S, 2 * max(s.duration_ms.value for s in steps) / 1000.0 + 10.0)
                work = tree.workload(f"fidelity-{replays}")
                before = cpu_ticks()
                run = replay(Trace(trace.trace_id, trace.source, steps),
                             EmulateExecutor(time_scale=1.0, step_timeout_s=timeout_s, exit_tail_ms=tail_ms),
                             # pooled, as the experiments replay: the joins are off the step's clock
                             ArmPlacement(Arm("unlimited"), work, tree.controllers, pool=True))
                replays += 1
                stolen = steal_pct(before, cpu_ticks())
                hit = stolen is not None and stolen > STEAL_LIMIT_PCT
                if hit:
                    disturbed += 1
                    if retries[k] > 0:
                        retries[k] -= 1
                        continue
                    disturbed_kept += 1
                kept[k].append((run, hit))
        wait1, ticks1, t1 = cpu_wait_us(), cpu_ticks(), time.monotonic()
        rows = [_row(trace, step, [run[i] for run, _ in kept[k]], [run[i] for run, hit in kept[k] if not hit])
                for k, (trace, steps) in enumerate(todo) for i, step in enumerate(steps)]
    finally:
        tree.close()
    waited = (100.0 * (wait1 - wait0) / ((t1 - t0) * 1e6) if wait0 is not None and wait1 is not None and t1 > t0
              else None)
    return Emulated(rows, tail_ms, waited, steal_pct(ticks0, ticks1), replays, disturbed,
                    disturbed_kept)


def _row(trace: Trace, step: Step, results, unstolen=None) -> dict:
    """The step's figures over `results` (its repetitions); its duration over `unstolen` (those no
    steal disturbed) when there is one, else over all, the row then saying `duration_stolen`."""
    failed = [r for r in results if not r.executed or r.exit_code != 0 or r.timed_out]
    row = {"trace_id": trace.trace_id, "step_id": step.step_id, "cmd": " ".join((step.command or "").split())[:80],
           "repeats": len(results)}
    timed = results if unstolen is None else unstolen
    if not timed:
        timed, row["duration_stolen"] = results, True
    row["duration_repeats"] = len(timed)
    if failed:                  # the emulator is ours: a failed emulation meets no goal
        r = failed[0]
        row["failed"] = r.error or ("timed out" if r.timed_out else f"exit {r.exit_code}, signal {r.signal}")
    med = lambda xs: statistics.median(xs) if xs and None not in xs else None      # noqa: E731
    got = Figures(med([r.counters.get("peak_bytes") for r in results if r.executed]) / MB
                  if all(r.executed and r.counters.get("peak_bytes") is not None for r in results) else None,
                  med([r.latency_ms for r in timed if r.executed]),
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
