"""One cgroup, in whichever layout the host has: create, limit, join, count, kill, remove.

In `hybrid` mode a Cgroup is a set of same-named directories: one in the v1 memory hierarchy (and
pids/cpu when an arm limits those) and one in the unified v2 tree. A process joins all of them, so
limits and memory counters come from v1 while the cgroup id (what BPF programs see), cpu.stat,
cgroup.kill and PSI come from v2. In `v2` mode there is just the unified directory.

Every Cgroup is one of two kinds, chosen when it is made (`inner=`), because cgroup v2 forbids
mixing them (the no-internal-processes rule): an *inner* node gives controllers to its children
(cgroup.subtree_control) and never holds a process; a *leaf* is joined by processes and enables
nothing. Joining an inner node or making a child of a leaf raises CgroupKindError in both layouts,
so code that would only fail on a v2 kernel fails on a hybrid one too.
"""
from __future__ import annotations

import contextlib
import errno
import os
import time
from pathlib import Path

from .counters import Counters, keyed_text, stall_usec
from .host import CgroupHost, CgroupUnavailable

MB = 1024 * 1024
#: controllers a run can do without: written into cgroup.subtree_control one at a time, so that a
#: kernel refusing one of them alone (cpu: EINVAL with RT group scheduling and realtime tasks below;
#: EOPNOTSUPP for a domain controller in a threaded subtree; ENOENT where it is not delegated) loses
#: that one, with its reason, not the whole tree. memory and pids are always required.
OPTIONAL = ("cpu",)
#: how the kernel refuses one controller (an errno the whole write fails with, e.g. EBUSY for a
#: cgroup that holds processes, is the caller's to handle)
REFUSED = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOENT)
#: v1 cpu.shares bounds (kernel: MIN_SHARES 2, MAX_SHARES 1 << 18); v2 cpu.weight is 1..10000
V1_SHARES_MIN, V1_SHARES_MAX = 2, 262144


def v1_shares(weight: int) -> int:
    """cpu.shares for a v2 cpu.weight: both default to "one ordinary task" (weight 100 = 1024
    shares), so weight x 1024 / 100, clamped to v1's range (weight 1 -> 10, 10000 -> 102400)."""
    return max(V1_SHARES_MIN, min(V1_SHARES_MAX, weight * 1024 // 100))


class CgroupKindError(RuntimeError):
    """A process joining an inner cgroup, or a child made under a leaf (see the module docstring)."""


def _write(path: Path, value: str) -> None:
    # the flags of open(path, "w"), without Python's text layer (this is on the step's path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def enable_subtree(subtree_control: Path, controllers, optional=OPTIONAL) -> dict[str, str]:
    """`+controllers` into a cgroup.subtree_control file: the required ones in one write (its
    OSError is the caller's), then each optional one in a write of its own, left out when the
    kernel refuses it (REFUSED). The kernel applies a write all or nothing, so one refused
    controller in a shared write would take the required ones with it. Returns {controller: why}
    for those left out."""
    required = [c for c in controllers if c not in optional]
    if required:
        _write(subtree_control, " ".join(f"+{c}" for c in required))
    refused = {}
    for c in controllers:
        if c not in optional:
            continue
        try:
            _write(subtree_control, f"+{c}")
        except OSError as exc:
            if exc.errno not in REFUSED:
                raise
            name = "EOPNOTSUPP" if exc.errno == errno.EOPNOTSUPP else errno.errorcode[exc.errno]   # not its alias ENOTSUP
            refused[c] = f"{subtree_control}: the kernel refused +{c} ({name}: {exc.strerror})"
    return refused


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


class Cgroup:
    def __init__(self, host: CgroupHost, paths: dict[str, Path], *, inner: bool):
        self.host = host
        self.paths = paths           # "unified" -> v2 dir; in hybrid also "memory"/"pids"/"cpu" -> v1 dirs
        self.inner = inner           # inner: children, no processes; leaf: processes, no children
        self._threshold_fd: int | None = None   # v1 soft-limit crossing notifications (eventfd)
        self._threshold_crossings = 0           # crossings seen on the current eventfd
        self._earlier_breaches = 0              # upward crossings of soft limits set before it
        self._fds: dict[tuple[str, str], int] = {}   # counter files kept open (counters())
        self.refused: dict[str, str] = {}       # v2 inner node: optional controllers the kernel refused
        # hybrid leaf: v1 controller -> the parent's directory its processes join instead of one of
        # their own (make(share=)): under the parent's limits and counted there, none of this one's
        self.shared: dict[str, Path] = {}

    # -- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def make(cls, host: CgroupHost, parents: dict[str, Path], name: str,
             controllers: tuple[str, ...] = ("memory",), *, inner: bool, share: tuple[str, ...] = ()) -> "Cgroup":
        """mkdir `name` under `parents`; an inner node (v2) then enables `controllers` for its children.
        `share` (hybrid, a leaf): v1 controllers whose directory is the parent's (`shared`)."""
        paths = {}
        v1 = [c for c in controllers if c in parents] if host.mode == "hybrid" else []
        shared = {c: parents[c] for c in v1 if c in share and not inner}
        wanted = ["unified"] + [c for c in v1 if c not in shared]
        cg = cls(host, paths, inner=inner)
        cg.shared = shared
        try:
            for key in wanted:
                path = parents[key] / name
                path.mkdir(exist_ok=False)
                paths[key] = path
            if inner and host.mode == "v2":
                cg._enable_subtree(controllers)
        except BaseException:
            cg.remove()
            raise
        return cg

    def child(self, name: str, controllers: tuple[str, ...] = ("memory",), *, inner: bool = False,
              share: tuple[str, ...] = ()) -> "Cgroup":
        """A leaf (processes join it: a step, a tenant's process tree), or with inner=True a node
        that only holds cgroups (a workload whose steps get cgroups of their own). `share`: see make()."""
        if not self.inner:
            raise CgroupKindError(f"{self.unified} is a leaf cgroup (processes join it): it cannot have "
                                  f"child cgroups; make it with inner=True to put {name!r} under it")
        return Cgroup.make(self.host, self.paths, name, controllers, inner=inner, share=share)

    def _enable_subtree(self, controllers) -> None:
        # v2: a cgroup's children get a controller only when the parent lists it in
        # cgroup.subtree_control, and only while the parent holds no process (EBUSY otherwise):
        # why only inner nodes, which nothing joins, do it. An optional one the kernel refuses is
        # left out and said in `refused` (its children then have no cpu.* files: _cpu_write says so).
        self.refused.update(enable_subtree(self.paths["unified"] / "cgroup.subtree_control", controllers))

    @property
    def unified(self) -> Path:
        return self.paths["unified"]

    @property
    def id(self) -> int:
        """The v2 cgroup id, as bpf_get_current_cgroup_id() reports it (the directory's inode)."""
        return os.stat(self.unified).st_ino

    def join_files(self) -> list[str]:
        """cgroup.procs files a process writes "0" into to join this cgroup (before it execs)."""
        if self.inner:
            raise CgroupKindError(f"{self.unified} is an inner cgroup (it gives controllers to its "
                                  "children): no process may join it; make a leaf child for it")
        return [str(p / "cgroup.procs") for p in (*self.paths.values(), *self.shared.values())]

    def pids(self) -> list[int]:
        return [int(x) for x in _read_or(self.unified / "cgroup.procs").split()]

    def populated(self) -> bool:
        """Any process in this cgroup or below (v2 cgroup.events; kept open, so cheap to ask)."""
        events = self._read("unified", "cgroup.events")
        return "populated 0" not in events if events else bool(self.pids())

    def kill(self) -> None:
        """Kill every process in this cgroup and its children: v2 cgroup.kill (5.14+), else
        `kill_frozen()`."""
        try:
            _write(self.unified / "cgroup.kill", "1")
            return
        except OSError:                  # no cgroup.kill (kernel < 5.14), or the cgroup is gone
            if not self.unified.exists():
                return
        self.kill_frozen()

    def kill_frozen(self) -> None:
        """cgroup.kill for kernels before 5.14: freeze the subtree (cgroup.freeze, 5.2+) so nothing in
        it can fork while we look, SIGKILL every pid in every cgroup of it, then thaw so the
        killed tasks can die. Without cgroup.freeze a fork racing the sweep could survive, so
        the sweep repeats until the subtree is empty (or 5 s have passed)."""
        freeze = self.unified / "cgroup.freeze"
        frozen = False
        try:
            _write(freeze, "1")
            frozen = True
        except OSError:
            pass
        try:
            deadline = time.monotonic() + 5.0
            while True:
                pids = [int(x) for d, _, _ in os.walk(self.unified)
                        for x in _read_or(Path(d) / "cgroup.procs").split()]
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
                if frozen or not pids or time.monotonic() > deadline:
                    return
                time.sleep(0.01)
        finally:
            if frozen:
                try:
                    _write(freeze, "0")
                except OSError:
                    pass

    def remove(self, *, timeout_s: float = 5.0) -> None:
        """Kill what is left, then rmdir this cgroup's directories (children first), with retries.
        An empty cgroup costs one rmdir per directory; one the kernel refuses (EBUSY: processes or
        children in it; a killed process stays until torn down) goes the full path, v1 first so
        that the unified directory's cgroup.kill is still there."""
        self._close_files()
        if self._threshold_fd is not None:
            os.close(self._threshold_fd)
            self._threshold_fd = None
        left = sorted(self.paths.values(), key=lambda p: p == self.paths.get("unified"))   # unified last
        while left:
            try:
                os.rmdir(left[0])
            except OSError as exc:
                if exc.errno in (errno.EBUSY, errno.ENOTEMPTY):
                    break                # processes or children in it: the full path below
                if exc.errno != errno.ENOENT:
                    raise
            left.pop(0)
        if left and "unified" in self.paths and self.unified.exists():
            self.kill()
        for path in left:
            remove_tree(path, timeout_s=timeout_s)

    def features(self) -> dict[str, bool]:
        """What this kernel offers for this cgroup (probed, not assumed from a version): a recorded
        memory peak (v2 memory.peak, 5.19+), local memory events (v2 memory.events.local, 5.2+),
        cgroup.kill (5.14+; else kill_frozen), cgroup.freeze (5.2+) and PSI (memory.pressure
        readable: CONFIG_PSI and not psi=0). Ask a cgroup below the root: the root has no limits."""
        u = self.unified

        def readable(path: Path) -> bool:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return False
            try:
                os.read(fd, 4096)
                return True
            except OSError:             # EOPNOTSUPP: PSI compiled in but disabled at boot
                return False
            finally:
                os.close(fd)
        v1 = self.host.mode == "hybrid"
        return {"memory_peak": v1 or (u / "memory.peak").exists(),
                "memory_events_local": v1 or (u / "memory.events.local").exists(),
                "cgroup_kill": (u / "cgroup.kill").exists(), "cgroup_freeze": (u / "cgroup.freeze").exists(),
                "psi": readable(u / "memory.pressure")}

    # -- limits ----------------------------------------------------------------------------------
    def set_memory_max(self, nbytes: int | None) -> None:
        """A hard limit (None: no limit)."""
        if self.host.mode == "v2":
            _write(self.unified / "memory.max", "max" if nbytes is None else str(nbytes))
            # a hard limit means "killed at this size", not "pushed to swap at this size"
            if (self.unified / "memory.swap.max").exists():
                _write(self.unified / "memory.swap.max", "0")
        else:
            # v1 memory+swap (memsw) is left unlimited: without swap it changes nothing; on a host
            # with swap, a step could swap instead of being killed at the limit.
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

    def set_cpu_weight(self, weight: int) -> None:
        """The cgroup's share of CPU against its siblings when they compete: v2 cpu.weight (1..10000,
        100 = an ordinary task), v1 cpu.shares (v1_shares: the same ratio, x 1024 / 100)."""
        if self.host.mode == "v2":
            self._cpu_write("cpu.weight", str(int(weight)))
        else:
            self._cpu_write("cpu.shares", str(v1_shares(int(weight))))

    def set_cpu_max(self, quota_us: int | None, period_us: int = 100_000) -> None:
        """A CPU bandwidth cap: at most `quota_us` of CPU time per `period_us` (None: no cap).
        v2 cpu.max "QUOTA PERIOD"; v1 cpu.cfs_period_us, then cpu.cfs_quota_us (-1: no cap)."""
        if self.host.mode == "v2":
            self._cpu_write("cpu.max", f"{'max' if quota_us is None else int(quota_us)} {int(period_us)}")
        else:
            self._cpu_write("cpu.cfs_period_us", str(int(period_us)))
            self._cpu_write("cpu.cfs_quota_us", "-1" if quota_us is None else str(int(quota_us)))

    def _cpu_write(self, name: str, value: str) -> None:
        # No cpu controller here is one message naming it: a v2 parent without +cpu in its
        # subtree_control has no cpu.* files in its children; a hybrid host without a v1 cpu
        # hierarchy (or a tree made without "cpu") has no "cpu" directory to write to.
        key = "unified" if self.host.mode == "v2" else "cpu"
        if key not in self.paths or not (self.paths[key] / name).exists():
            where = self.paths.get(key, self.unified)
            raise CgroupUnavailable(f"{where}: no {name}: the cpu controller is not enabled for this cgroup "
                                    + ("(v2: its parent's cgroup.subtree_control lacks cpu)" if key == "unified"
                                       else "(hybrid: no v1 cpu hierarchy joined)"))
        _write(self.paths[key] / name, value)

    def set_pids_max(self, n: int) -> None:
        target = self.unified if self.host.mode == "v2" else self.paths["pids"]
        _write(target / "pids.max", str(n))

    # -- counters --------------------------------------------------------------------------------
    def counters(self) -> Counters:
        # Read on every step's critical path: the files stay open (pread at offset 0 makes the
        # kernel generate them afresh), and a file this kernel lacks is looked for only once.
        c = Counters()
        c.cpu_usec = keyed_text(self._read("unified", "cpu.stat")).get("usage_usec")    # None: no cpu.stat
        try:
            c.mem_stall_usec = stall_usec(self._read("unified", "memory.pressure"))
        except OSError:              # PSI off at boot, on kernels that keep the file (EOPNOTSUPP):
            c.mem_stall_usec = None  # not asked again (as a file the kernel lacks)
            os.close(self._fds[("unified", "memory.pressure")])
            self._fds[("unified", "memory.pressure")] = -1
        pids_key = "unified" if self.host.mode == "v2" else "pids"
        # v2 pids.events counts the subtree's refused forks since 6.13; pids.events.local (6.13+)
        # is this cgroup's own, which pids.events was before (and is on v1)
        pids_events = self._read(pids_key, "pids.events.local") or self._read(pids_key, "pids.events")
        c.pids_max_events = keyed_text(pids_events).get("max", 0)
        if self.host.mode == "v2":
            # memory.peak is 5.19+. Before, the peak is unknown (None), never memory.current
            # relabelled: a usage read after the step has ended is not its peak.
            peak = self._read("unified", "memory.peak")
            c.peak_bytes = int(peak) if peak else None
            local = self._read("unified", "memory.events.local")      # 5.2+
            c.events_hierarchical = not local
            ev = keyed_text(local or self._read("unified", "memory.events"))
            c.high_events, c.max_events, c.oom_kills = ev.get("high", 0), ev.get("max", 0), ev.get("oom_kill", 0)
            return c
        if "memory" not in self.paths:
            return c
        c.peak_bytes = int(self._read("memory", "memory.max_usage_in_bytes"))
        c.max_events = int(self._read("memory", "memory.failcnt"))
        c.oom_kills = keyed_text(self._read("memory", "memory.oom_control")).get("oom_kill", 0)
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
