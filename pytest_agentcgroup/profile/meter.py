"""One step measured in a cgroup of its own: the replayer's Placement for profiling.

Each executing step gets a fresh leaf cgroup (`s<step_id>`) under the trace's cgroup (or under its
container's, for the docker executor), bounded by a hard memory limit and a pids limit, and a
sampler thread reads its memory usage every `period_s` from before the program starts until it
has ended (cgroups/usage.py, keeping the readings). What the kernel itself counts for the cgroup is
read once nothing of the step runs any more:

- peak: v2 memory.peak (5.19+), v1 memory.max_usage_in_bytes — the kernel's own high-water mark, which
  a sampler can miss between two readings. Where the kernel has none (v2 before 5.19) the curve's
  highest reading stands in (`peak_from` "samples"; the profile labels it `derived`, not `recorded`);
- CPU: cpu.stat usage_usec of the unified tree (user + system, the step's whole process tree);
- IO: io.stat rbytes + wbytes (v2 with the io controller): block IO only, so run.py drops it where
  the workspace is a tmpfs (the steps' writes would read as 0). A hybrid host with no io controller
  in the unified tree (and no v1 blkio joined) has no per-cgroup IO count for the step, so there
  `io_bytes` is None: not measured, never 0 by default;
- OOM kills (v2 memory.events.local oom_kill, v1 memory.oom_control oom_kill), limit hits, forks
  refused at pids.max.

The step's own process tree includes what starts it (setpriv, bwrap or the docker executor's
nsenter): a few MiB and milliseconds that an agent's tool call would not pay, part of every figure.
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field

from ..cgroups.node import MB, Cgroup
from ..cgroups.usage import UsageSampler

#: the sampling period asked for (250 Hz; a curve wants at least 100 Hz); what a step got is measured
SAMPLE_PERIOD_S = 0.004


@dataclass
class StepMeasure:
    """What one step's cgroup recorded."""
    peak_bytes: int
    peak_from: str                 # "kernel" (memory.peak / max_usage_in_bytes) | "samples"
    cpu_usec: int | None           # None: cpu.stat not readable (cgroups/node.py Counters)
    io_bytes: int | None           # None: the kernel gives this cgroup no IO count here
    oom_kills: int
    max_events: int
    pids_max_events: int
    window_ms: float
    curve: list[tuple[float, int]] = field(default_factory=list)   # (ms after the window opened, bytes)

    @property
    def sample_hz(self) -> float | None:
        """Readings per second the sampler achieved over the step (None: too short to say)."""
        if len(self.curve) < 3 or self.window_ms <= 0:
            return None
        return (len(self.curve) - 1) / (self.window_ms / 1000.0)


class StepMeter:
    """Placement (replay/replayer.py) that measures each step. `workload`: the trace's inner cgroup;
    `nest_in()`, when given, the cgroup steps are made under instead (the docker executor's
    container). `last` is the measure of the step that ended last."""

    def __init__(self, workload: Cgroup, controllers: tuple[str, ...], *, memory_max_mb: int, pids_max: int,
                 period_s: float = SAMPLE_PERIOD_S, nest_in=None):
        self.workload, self.controllers, self.nest_in = workload, controllers, nest_in
        self.memory_max_mb, self.pids_max = memory_max_mb, pids_max
        self.sampler = UsageSampler(period_s, keep_samples=True)
        self.step_cg: Cgroup | None = None
        self.last: StepMeasure | None = None

    def begin_step(self, step) -> list[str]:
        parent = self.nest_in() if self.nest_in else self.workload
        cg = parent.child(f"s{step.step_id}", self.controllers)
        try:
            cg.set_memory_max(int(self.memory_max_mb) * MB)
            if "pids" in self.controllers:
                cg.set_pids_max(int(self.pids_max))
            cg.counters()                 # open the counter files before the step, not after it
        except BaseException:
            cg.remove()
            raise
        self.step_cg, self.last = cg, None
        self.sampler.start(cg)
        return cg.join_files()

    def kill_step(self) -> None:
        if self.step_cg is not None and self.step_cg.populated():
            self.step_cg.kill()

    def end_step(self, step) -> dict[str, float]:
        cg, self.step_cg = self.step_cg, None
        window = self.sampler.stop()
        curve = list(self.sampler.curve)
        try:
            deadline = time.monotonic() + 5.0
            while cg.populated() and time.monotonic() < deadline:    # killed processes take a moment
                time.sleep(0.002)
            c = cg.counters()
            io = io_bytes(cg)
        finally:
            cg.remove()
        sampled = max((v for _, v in curve), default=0)
        peak, source = (c.peak_bytes, "kernel") if c.peak_bytes is not None else (sampled, "samples")
        self.last = StepMeasure(peak_bytes=peak, peak_from=source, cpu_usec=c.cpu_usec, io_bytes=io,
                                oom_kills=c.oom_kills, max_events=c.max_events, pids_max_events=c.pids_max_events,
                                window_ms=window.get("usage_window_ms", 0.0), curve=curve)
        return {"peak_bytes": peak, "cpu_usec": c.cpu_usec, "oom_kills": c.oom_kills, "max_events": c.max_events,
                "pids_max_events": c.pids_max_events, **window}

    def close(self) -> None:
        self.sampler.close()


def io_bytes(cg: Cgroup) -> int | None:
    """Bytes read + written by the cgroup's processes to block devices (v2 io.stat rbytes + wbytes
    over every device), or None where this cgroup has no io.stat (no io controller)."""
    text = cg._read("unified", "io.stat")
    if not text and not (cg.unified / "io.stat").exists():
        return None
    total = 0
    for line in text.splitlines():
        for kv in line.split()[1:]:
            key, _, val = kv.partition("=")
            if key in ("rbytes", "wbytes") and val.isdigit():
                total += int(val)
    return total


def peak_rss_mib() -> float:
    """This process's own peak resident memory, MiB (the profiler's; its steps are measured apart)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
