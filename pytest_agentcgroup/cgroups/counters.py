"""What the kernel counted for one cgroup (Counters), and the parsers of the cgroupfs files they are
read from (node.py Cgroup.counters reads them on every step's path)."""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Counters:
    """Kernel counters of one cgroup, read from cgroupfs. Local to the cgroup (not its children),
    except where `events_hierarchical` says the kernel only had the hierarchical memory.events."""
    peak_bytes: int | None = 0  # v2 memory.peak (5.19+; None before) | v1 memory.max_usage_in_bytes
    cpu_usec: int | None = 0   # v2 cpu.stat usage_usec (the unified tree has it in both layouts); None: not read
    high_events: int = 0       # v2 memory.events.local high | v1 upward usage-threshold crossings
    max_events: int = 0        # v2 memory.events.local max | v1 memory.failcnt
    oom_kills: int = 0         # v2 memory.events.local oom_kill | v1 memory.oom_control oom_kill
    pids_max_events: int = 0   # forks refused at pids.max: pids.events(.local, 6.13+) max (v2 | v1 pids)
    # time some task of the cgroup (and its children) waited for memory: reclaim, a throttle at
    # memory.high, refaults (v2 memory.pressure "some" total, PSI; in the unified tree of both
    # layouts, where a v1 memcg's reclaim is charged too); None without PSI
    mem_stall_usec: int | None = 0
    # v2 before 5.2 has no memory.events.local: memory.events counts this cgroup *and* its children
    events_hierarchical: bool = False

    def minus(self, before: "Counters") -> "Counters":
        """Deltas of the events, the cpu time and the stall; the peak is kept as it is now."""
        def delta(now, then):
            return None if now is None or then is None else now - then
        return Counters(self.peak_bytes, delta(self.cpu_usec, before.cpu_usec),
                        *(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)[2:-2]),
                        delta(self.mem_stall_usec, before.mem_stall_usec),
                        events_hierarchical=self.events_hierarchical)


def stall_usec(pressure: str) -> int | None:
    """The `some` line's total (µs) of a PSI pressure file; None for an empty one (no PSI)."""
    for line in pressure.splitlines():
        if line.startswith("some "):
            total = line.rpartition("total=")[2]
            return int(total) if total.isdigit() else None
    return None


def keyed_text(text: str) -> dict[str, int]:
    pairs = (line.partition(" ")[::2] for line in text.splitlines())
    return {key: int(val) for key, val in pairs if val.strip().lstrip("-").isdigit()}
