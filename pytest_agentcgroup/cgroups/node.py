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
    pids_max_events: int = 0   # forks refused at pids.max: pids.events max (v2 unified | v1 pids)

    def minus(self, before: "Counters") -> "Counters":
        """Event deltas; peak and cpu are kept as they are now (they are not events)."""
        return Counters(self.peak_bytes, self.cpu_usec - before.cpu_usec,
                        *(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)[2:]))


def _write(path: Path, value: str) -> None:
    # the flags of open(path, "w"), without Python's text layer (this is on the step's path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read_or(path: Path, default: str = "") -> str:
    """A cgroupfs file's content, or `default` when it does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return default
    try:
        return os.read(fd, 1 << 16).decode()
    finally:
        os.close(fd)


def _keyed_text(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
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
        self._fds: dict[tuple[str, str], int] = {}   # counter files kept open (counters())

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
        return [int(x) for x in _read_or(self.unified / "cgroup.procs").split()]

    def populated(self) -> bool:
        """Any process in this cgroup or below (v2 cgroup.events; kept open, so cheap to ask)."""
        events = self._read("unified", "cgroup.events")
        return "populated 0" not in events if events else bool(self.pids())

    def kill(self) -> None:
        """Kill every process in this cgroup and its children (v2 cgroup.kill; SIGKILL per pid as fallback)."""
        try:
            _write(self.unified / "cgroup.kill", "1")
            return
        except OSError:          # no cgroup.kill (kernel < 5.14), or the cgroup is gone
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
        self._close_files()
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
        # Read on every step's critical path: the files stay open (pread at offset 0 makes the
        # kernel generate them afresh), and a file this kernel lacks is looked for only once.
        c = Counters()
        c.cpu_usec = _keyed_text(self._read("unified", "cpu.stat")).get("usage_usec", 0)
        pids_key = "unified" if self.host.mode == "v2" else "pids"
        c.pids_max_events = _keyed_text(self._read(pids_key, "pids.events")).get("max", 0)
        if self.host.mode == "v2":
            peak = self._read("unified", "memory.peak") or self._read("unified", "memory.current")
            c.peak_bytes = int(peak) if peak else 0
            ev = _keyed_text(self._read("unified", "memory.events.local") or self._read("unified", "memory.events"))
            c.high_events, c.max_events, c.oom_kills = ev.get("high", 0), ev.get("max", 0), ev.get("oom_kill", 0)
            return c
        if "memory" not in self.paths:
            return c
        c.peak_bytes = int(self._read("memory", "memory.max_usage_in_bytes"))
        c.max_events = int(self._read("memory", "memory.failcnt"))
        c.oom_kills = _keyed_text(self._read("memory", "memory.oom_control")).get("oom_kill", 0)
        c.high_events = self._upward_crossings()
        return c

    def usage_bytes(self) -> int:
        """Memory charged to this cgroup and its children now (v2 memory.current | v1 memory.usage_in_bytes)."""
        text = self._read("unified", "memory.current") if self.host.mode == "v2" else \
            self._read("memory", "memory.usage_in_bytes")
        return int(text) if text else 0

    def _read(self, key: str, name: str) -> str:
        """A counter file's current content ("" if this cgroup or kernel has no such file)."""
        fd = self._fds.get((key, name))
        if fd is None:
            if key not in self.paths:
                return ""
            try:
                fd = os.open(self.paths[key] / name, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                fd = -1
            self._fds[(key, name)] = fd
        return os.pread(fd, 1 << 16, 0).decode() if fd >= 0 else ""

    def _close_files(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            if fd >= 0:
                os.close(fd)

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
