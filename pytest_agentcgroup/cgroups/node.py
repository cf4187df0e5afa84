"""One cgroup, in whichever layout the host has: create, limit, join, count, kill, remove.

In `hybrid` mode a Cgroup is a set of same-named directories: one in the v1 memory hierarchy (and
pids/cpu when an arm limits those) and one in the unified v2 tree. A process joins all of them, so
limits and memory counters come from v1 while the cgroup id (what BPF programs see), cpu.stat,
cgroup.kill and PSI come from v2. In `v2` mode there is just the unified directory.
"""
from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path

from .host import CgroupHost

MB = 1024 * 1024


@dataclass
class Counters:
    """Kernel counters of one cgroup, read from cgroupfs. Local to the cgroup (not its children)."""
    peak_bytes: int = 0        # v2 memory.peak | v1 memory.max_usage_in_bytes
    cpu_usec: int = 0          # v2 cpu.stat usage_usec (the unified tree has it in both layouts)
    high_events: int = 0       # v2 memory.events.local high | v1 upward usage-threshold crossings
    max_events: int = 0        # v2 memory.events.local max | v1 memory.failcnt
    oom_kills: int = 0         # v2 memory.events.local oom_kill | v1 memory.oom_control oom_kill

    def minus(self, before: "Counters") -> "Counters":
        """Event deltas; peak and cpu are kept as they are now (they are not events)."""
        return Counters(self.peak_bytes, self.cpu_usec - before.cpu_usec,
                        *(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)[2:]))


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _keyed(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, val = line.partition(" ")
        if val.strip().lstrip("-").isdigit():
            out[key] = int(val)
    return out


class Cgroup:
    def __init__(self, host: CgroupHost, paths: dict[str, Path]):
        self.host = host
        self.paths = paths           # "unified" -> v2 dir; in hybrid also "memory"/"pids"/"cpu" -> v1 dirs
        self._threshold_fd: int | None = None   # v1 soft-limit crossing notifications (eventfd)
        self._threshold_crossings = 0           # crossings seen on the current eventfd
        self._earlier_breaches = 0              # upward crossings of soft limits set before it

    # -- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def make(cls, host: CgroupHost, parents: dict[str, Path], name: str,
             controllers: tuple[str, ...] = ("memory",)) -> "Cgroup":
        paths = {}
        wanted = ["unified"] + ([c for c in controllers if c in parents] if host.mode == "hybrid" else [])
        try:
            for key in wanted:
                path = parents[key] / name
                path.mkdir(exist_ok=False)
                paths[key] = path
        except BaseException:
            cls(host, paths).remove()
            raise
        cg = cls(host, paths)
        if host.mode == "v2":
            cg._enable_subtree(controllers)
        return cg

    def child(self, name: str, controllers: tuple[str, ...] = ("memory",)) -> "Cgroup":
        return Cgroup.make(self.host, self.paths, name, controllers)

    def _enable_subtree(self, controllers) -> None:
        # v2: a cgroup's children get a controller only when the parent lists it in
        # cgroup.subtree_control. Our own nodes never hold processes, so this cannot hit EBUSY.
        want = " ".join(f"+{c}" for c in controllers)
        _write(self.paths["unified"] / "cgroup.subtree_control", want)

    @property
    def unified(self) -> Path:
        return self.paths["unified"]

    @property
    def id(self) -> int:
        """The v2 cgroup id, as bpf_get_current_cgroup_id() reports it (the directory's inode)."""
        return os.stat(self.unified).st_ino

    def join_files(self) -> list[str]:
        """cgroup.procs files a process writes "0" into to join this cgroup (before it execs)."""
        return [str(p / "cgroup.procs") for p in self.paths.values()]

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.unified / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def kill(self) -> None:
        """Kill every process in this cgroup and its children (v2 cgroup.kill; SIGKILL per pid as fallback)."""
        kill_file = self.unified / "cgroup.kill"
        if kill_file.exists():
            try:
                _write(kill_file, "1")
                return
            except OSError:
                pass
        for pid in self.pids():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    def remove(self, *, timeout_s: float = 5.0) -> None:
        """Kill what is left, then rmdir this cgroup's directories (children first), with retries.

        A killed process leaves its cgroup only once the kernel has finished tearing it down, so
        rmdir can fail with EBUSY for a moment after cgroup.kill.
        """
        if self._threshold_fd is not None:
            os.close(self._threshold_fd)
            self._threshold_fd = None
        if "unified" in self.paths and self.unified.exists():
            self.kill()
        for path in self.paths.values():
            remove_tree(path, timeout_s=timeout_s)

    # -- limits ----------------------------------------------------------------------------------
    def set_memory_max(self, nbytes: int | None) -> None:
        """A hard limit (None: no limit)."""
        if self.host.mode == "v2":
            _write(self.unified / "memory.max", "max" if nbytes is None else str(nbytes))
            # a hard limit means "killed at this size", not "pushed to swap at this size"
            if (self.unified / "memory.swap.max").exists():
                _write(self.unified / "memory.swap.max", "0")
        else:
            # v1 memory+swap (memsw) is left unlimited: the hosts this runs on have no swap; on
            # one that has, a step could swap instead of being killed at the limit.
            _write(self.paths["memory"] / "memory.limit_in_bytes", "-1" if nbytes is None else str(nbytes))

    def set_oom_killer(self, enabled: bool) -> None:
        """v1 only (memory.oom_control): with the OOM killer disabled, a task that hits the hard limit
        is parked in the kernel (state D, `under_oom 1`) until memory is freed, the limit is raised
        or the killer is re-enabled, instead of being killed. v2 has no such switch."""
        if self.host.mode == "v2":
            raise OSError(f"{self.unified}: cgroup v2 cannot disable the OOM killer")
        _write(self.paths["memory"] / "memory.oom_control", "0" if enabled else "1")

    def set_memory_high(self, nbytes: int) -> None:
        """A soft limit. v2: memory.high (throttles and reclaims above it, counts `high` events).

        v1 has no throttling soft limit. Its nearest honest equivalent: memory.soft_limit_in_bytes
        (the kernel reclaims toward it only under global memory pressure) plus a usage-threshold
        notification at the same value (cgroup.event_control + eventfd), which counts each time
        usage crosses it. So on v1 breaches are counted exactly but nothing is throttled.
        """
        if self.host.mode == "v2":
            _write(self.unified / "memory.high", str(nbytes))
            return
        mem = self.paths["memory"]
        _write(mem / "memory.soft_limit_in_bytes", str(nbytes))
        if self._threshold_fd is not None:      # a new soft limit replaces the old notification
            self._earlier_breaches = self._upward_crossings()
            os.close(self._threshold_fd)
            self._threshold_fd, self._threshold_crossings = None, 0
        efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        ufd = os.open(mem / "memory.usage_in_bytes", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write(mem / "cgroup.event_control", f"{efd} {ufd} {nbytes}")
        except OSError:
            os.close(efd)
            raise
        finally:
            os.close(ufd)
        self._threshold_fd = efd

    def set_pids_max(self, n: int) -> None:
        target = self.unified if self.host.mode == "v2" else self.paths["pids"]
        _write(target / "pids.max", str(n))

    # -- counters --------------------------------------------------------------------------------
    def counters(self) -> Counters:
        c = Counters()
        stat = self.unified / "cpu.stat"
        if stat.exists():
            c.cpu_usec = _keyed(stat).get("usage_usec", 0)
        if self.host.mode == "v2":
            u = self.unified
            peak = u / "memory.peak"
            c.peak_bytes = int(peak.read_text()) if peak.exists() else int((u / "memory.current").read_text())
            ev_file = u / "memory.events.local"
            ev = _keyed(ev_file if ev_file.exists() else u / "memory.events")
            c.high_events, c.max_events, c.oom_kills = ev.get("high", 0), ev.get("max", 0), ev.get("oom_kill", 0)
            return c
        mem = self.paths.get("memory")
        if mem is None:
            return c
        c.peak_bytes = int((mem / "memory.max_usage_in_bytes").read_text())
        c.max_events = int((mem / "memory.failcnt").read_text())
        c.oom_kills = _keyed(mem / "memory.oom_control").get("oom_kill", 0)
        c.high_events = self._upward_crossings()
        return c

    def _upward_crossings(self) -> int:
        # The eventfd counts crossings in both directions; usage starts below the threshold, so
        # crossings alternate up, down, up... and the upward ones are the odd-numbered ones.
        if self._threshold_fd is None:
            return self._earlier_breaches
        try:
            self._threshold_crossings += os.eventfd_read(self._threshold_fd)
        except BlockingIOError:
            pass
        return self._earlier_breaches + (self._threshold_crossings + 1) // 2


def remove_tree(path: Path, *, timeout_s: float = 5.0) -> None:
    """rmdir a cgroup directory and every cgroup below it, deepest first, retrying on EBUSY."""
    if not path.exists():
        return
    dirs = [Path(root) for root, _, _ in os.walk(path)]
    deadline = time.monotonic() + timeout_s
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.EAGAIN) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
