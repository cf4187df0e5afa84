"""The `emulate` executor: each step runs the resource emulator (replay/emulator.c, compiled on
first use by replay/emulator_build.py) with the step's recorded profile, durations scaled by the time scale. A step's memory curve (a recorded
profile's) goes to the emulator as a small file in the executor's workdir, thinned to the points
where it moved by CURVE_STEP_MB or more (and always its highest one, raised to the recorded peak), so a long step sampled at
100 Hz does not reach the command line or cost the emulator a long read.

A recorded duration runs from the spawn to the reap, so it holds the real command's own exit. An
emulation timed from the same spawn (T0_ENV) that works to that end adds its own exit and reap on
top. `exit_tail_ms` takes that off a curve step's end: measure_exit_tail_ms() measures it (the
fidelity comparison does, right before its replays, and reports it); the experiments leave it 0
(every arm replays with the same overhead, and they compare arms, not recordings)."""
from __future__ import annotations

import shutil
import statistics
import tempfile
from pathlib import Path

from ...errors import ExecutorUnavailable
from ...proc import SpawnError, run
from ...traces.ir import Step, Trace
from ..emulator_build import emulator_binary
from .base import DEFAULT_TIMEOUT_S, Launch

T0_ENV = "AGENTCGROUP_EMULATE_T0"     # read by emulator.c
CURVE_STEP_MB = 0.5         # half the emulator's own grain (1 MiB pieces)
TAIL_PROBES, TAIL_PROBE_MS = 7, 50.0    # the probe outlasts the emulator's start-up by far


def measure_exit_tail_ms() -> float:
    """The emulator's exit and reap as a step is timed (proc.run, its clock from T0_ENV): the median
    overshoot of TAIL_PROBES empty emulations of TAIL_PROBE_MS each (0 if it came out early).
    Raises ExecutorUnavailable when the emulator cannot be built or does not run."""
    binary = emulator_binary()
    workdir = tempfile.mkdtemp(prefix="agentcgroup-emulate-")
    try:
        curve = Path(workdir) / "probe.txt"
        curve.write_text("0 0\n")
        argv = [binary, "0", "0", "0", "0", f"{TAIL_PROBE_MS:.3f}", workdir, f"--curve={curve}"]
        over = []
        for _ in range(TAIL_PROBES):
            r = run(argv, cwd=workdir, timeout_s=10.0, clock_env=T0_ENV)
            if r.exit_code != 0 or r.timed_out:
                raise ExecutorUnavailable(f"the emulator {binary} failed an empty emulation (exit {r.exit_code}, "
                                          f"signal {r.signal}{', timed out' if r.timed_out else ''})")
            over.append(r.wall_ms - TAIL_PROBE_MS)
        return max(0.0, statistics.median(over))
    except SpawnError as exc:
        raise ExecutorUnavailable(f"the emulator cannot be started: {exc}") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def thin_curve(t_ms, mb) -> list[tuple[float, float]]:
    """The curve's first and last points, its highest, and every point that moved CURVE_STEP_MB or
    more from the last one kept."""
    top = max(range(len(mb)), key=mb.__getitem__)
    kept = [(t_ms[0], mb[0])]
    for i in range(1, len(mb)):
        if i == top or i == len(mb) - 1 or abs(mb[i] - kept[-1][1]) >= CURVE_STEP_MB:
            kept.append((t_ms[i], mb[i]))
    return kept


def with_peak(points: list[tuple[float, float]], peak_mb: float | None) -> list[tuple[float, float]]:
    """The curve's highest point raised to the recorded peak where that is higher: the kernel's
    memory.peak sees a spike between two samples, which no sample does."""
    if peak_mb is None or not points:
        return points
    top = max(range(len(points)), key=lambda i: points[i][1])
    return [(t, max(mb, peak_mb)) if i == top else (t, mb) for i, (t, mb) in enumerate(points)]


class EmulateExecutor:
    """Every step with replay data runs the resource emulator; durations are scaled by time_scale
    (the only executor that scales: sandbox and docker run real commands at real speed).

    Memory peaks are not scaled: a limit means the same thing at any speed. A step without any
    replay data still runs (an empty emulation: the spawn and cgroup cost only), so every step of
    every arm is measured the same way.
    """
    name = "emulate"

    def __init__(self, *, time_scale: float = 1.0, step_timeout_s: float = DEFAULT_TIMEOUT_S,
                 exit_tail_ms: float = 0.0):
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        if not exit_tail_ms >= 0:
            raise ValueError(f"exit_tail_ms must be >= 0, got {exit_tail_ms}")
        self.time_scale = time_scale
        self.exit_tail_ms = exit_tail_ms      # real milliseconds: not scaled with the trace
        self.step_timeout_s = step_timeout_s
        self.workdir: str | None = None

    def start(self, trace: Trace) -> None:
        emulator_binary()       # built now (or ExecutorUnavailable naming what is missing), before any step
        self.workdir = tempfile.mkdtemp(prefix="agentcgroup-emulate-")

    def stop(self) -> None:
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def launch(self, step: Step) -> Launch | None:
        p = step.profile
        val = lambda m: m.value if m is not None else 0.0      # noqa: E731
        s = self.time_scale
        if self.workdir is None:        # launched without start(): stop() still removes it
            self.workdir = tempfile.mkdtemp(prefix="agentcgroup-emulate-")
        duration = val(step.duration_ms) * s
        # timed from the spawn, a curve's emulation ends its own exit early (the recorded duration
        # holds the real command's); without a curve it times itself from its own start
        end = max(0.0, duration - self.exit_tail_ms) if p.curve is not None else duration
        argv = [emulator_binary(), str(int(val(p.peak_mb) * 1024 * 1024)),
                f"{val(p.ramp_ms) * s:.3f}", f"{val(p.cpu_ms) * s:.3f}", str(int(val(p.io_bytes))),
                f"{end:.3f}", self.workdir]
        if p.curve is not None:
            path = Path(self.workdir) / f"curve-{step.step_id}.txt"
            points = with_peak(thin_curve(p.curve.t_ms, p.curve.mb), p.peak_mb.value if p.peak_mb else None)
            path.write_text("".join(f"{t * s:.3f} {mb:.3f}\n" for t, mb in points))
            argv.append(f"--curve={path}")      # an ALLOC_LOG may still be appended (Experiment 5)
        # The emulated step must never outlive its own (scaled) length by much: the timeout is the
        # trace's own timeout scaled, but at least the emulation plus a generous start-up margin.
        timeout = self.step_timeout_s
        if step.args.get("timeout_ms"):
            timeout = min(timeout, max(step.args["timeout_ms"] / 1000.0 * s, duration / 1000.0 + 10.0))
        # A curve's clock starts at the spawn, as the recording's did: proc.run stamps the origin of
        # the step's wall time (spawn to reap, after the step's cgroup is made) into T0_ENV, and the
        # emulator times itself from it (CLOCK_MONOTONIC is system-wide), so both durations start there.
        return Launch(argv=argv, cwd=self.workdir, timeout_s=timeout, clock_env=T0_ENV if p.curve is not None else None)
