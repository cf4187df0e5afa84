"""Pure cgroup v2: make the cgroup this process runs in give the run's cgroups their controllers.

On v2 a cgroup's children get a controller only when (1) the cgroup has it itself (listed in its
cgroup.controllers: its parent delegated it), (2) lists it in its cgroup.subtree_control, which
(3) a non-root cgroup may only do while it holds no process (the no-internal-processes rule).
pytest usually runs in a cgroup that holds processes: itself, the shell that started it, xdist
workers (a login session's scope, a `systemd-run --scope`, a container's cgroup). So, as systemd
does with a delegated unit's payload and container runtimes with a container's init, every process
of that cgroup is moved into a leaf of its own, and then the controllers are enabled:

    <base>/                         pytest's cgroup: subtree_control +memory +pids (+cpuset)
        agentcgroup-init/           what <base> held: pytest, the shell that started it, workers
        agentcgroup-<pid>-<start>/  a run root (tree.py)

The root cgroup is exempt from (3): there nothing moves. `release()` undoes it, when the last live
run under <base> has ended: the controllers are disabled again and the processes moved back.
Runs of several sessions share <base>: taking (ensure + making a run root) and giving back (the
last-run check + release) happen under an exclusive flock on <base>'s directory (`locked()`), so
a run starting while the last one ends never loses its controllers halfway.

A cgroup systemd manages (a `.scope`/`.service` unit) is used only when it is delegated to us
(Delegate=yes: systemd marks it with the `trusted.delegate` — for a user manager's units
`user.delegate` — extended attribute, and stays out of its subtree); otherwise systemd owns its
subtree_control and its processes, and taking them over (as root could) would fight systemd:
CgroupUnavailable names the fix (`systemd-run --scope -p Delegate=yes`).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import subprocess
from pathlib import Path

from .host import INIT_LEAF, CgroupHost, CgroupUnavailable
from .node import OPTIONAL, enable_subtree

HOW = ("run pytest in a cgroup delegated to you with these controllers, e.g. "
       "`systemd-run --user --scope -p Delegate=yes pytest …` (a user's systemd session delegates "
       "memory and pids) or, as root, `systemd-run --scope -p Delegate=yes pytest …`")


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []


def _write(path: Path, text: str) -> None:
    with open(path, "w") as fh:
        fh.write(text)


_UNIT = re.compile(r".+\.(scope|service)$")
SYSTEMD_RUNNING = Path("/run/systemd/system")     # sd_booted(): systemd is pid 1


def _xattr(path: Path, name: str) -> bytes | None:
    try:
        return os.getxattr(path, name)
    except OSError:
        return None


def undelegated_systemd_unit(cgroup: Path, *, systemd: bool | None = None) -> str | None:
    """The systemd unit `cgroup` is, when systemd manages it and has not delegated it; else None.
    Delegated: the `trusted.delegate`/`user.delegate` xattr systemd sets (v251+), else (older
    systemd, a system unit) `systemctl show -p Delegate`."""
    systemd = SYSTEMD_RUNNING.is_dir() if systemd is None else systemd
    if not systemd or not _UNIT.match(cgroup.name):
        return None
    if any(_xattr(cgroup, x) == b"1" for x in ("trusted.delegate", "user.delegate")):
        return None
    managers = [["--user"], []] if os.geteuid() != 0 else [[]]      # a user's units are its manager's
    for manager in managers:
        try:
            out = subprocess.run(["systemctl", *manager, "show", "-p", "Delegate", "--value", cgroup.name],
                                 capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip() == "yes":
            return None
    return cgroup.name


class Delegation:
    """Controllers enabled in `host.unified`'s cgroup.subtree_control for the run roots below it."""

    def __init__(self, host: CgroupHost):
        self.base = host.unified
        self.is_root = host.is_root
        self.init = self.base / INIT_LEAF
        self.enabled: list[str] = []          # what this object turned on (the root cgroup's undo)
        self._lock_fd: int | None = None
        self._depth = 0

    @contextlib.contextmanager
    def locked(self):
        """An exclusive flock on the base cgroup's directory (any process that may use the base can
        open it; nothing is added to it), re-entrant within this object."""
        if self._depth == 0:
            fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
            self._lock_fd = fd
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                fd, self._lock_fd = self._lock_fd, None
                os.close(fd)                  # closing releases the flock

    def ensure(self, controllers: tuple[str, ...], optional: tuple[str, ...] = OPTIONAL) -> dict[str, str]:
        """Make `controllers` available to the base's children, or raise CgroupUnavailable saying
        exactly what is missing: a controller not delegated, no write access, processes in the way.
        An `optional` one that is not delegated, or that the kernel refuses alone (node.REFUSED), is
        left out instead: returns {controller: why} for those."""
        base = self.base
        unit = undelegated_systemd_unit(base)
        if unit is not None:
            raise CgroupUnavailable(
                f"{base} is systemd's unit {unit}, not delegated (no Delegate=yes): its controllers and "
                f"processes are systemd's to manage, and taking them over would fight it: {HOW}")
        available = _words(base / "cgroup.controllers")
        refused = {c: f"{c} not delegated to {base} (its cgroup.controllers: {' '.join(available) or 'none'})"
                   for c in controllers if c in optional and c not in available}
        missing = [c for c in controllers if c not in available and c not in optional]
        if missing:
            raise CgroupUnavailable(
                f"controller(s) {' '.join(missing)} not delegated to {base} (its cgroup.controllers: "
                f"{' '.join(available) or 'none'}; the parent's cgroup.subtree_control does not give "
                f"them): {HOW}")
        todo = [c for c in controllers if c not in refused and c not in _words(base / "cgroup.subtree_control")]
        if not todo:
            return refused
        if not os.access(base / "cgroup.subtree_control", os.W_OK):
            raise CgroupUnavailable(
                f"cannot enable {' '.join(todo)} in {base}/cgroup.subtree_control: not writable by uid "
                f"{os.geteuid()} (this cgroup is not delegated to this user): {HOW}")
        for attempt in range(5):               # a process forked between the move and the write: again
            if not self.is_root:
                self._move_into_init()
            try:
                refused.update(enable_subtree(base / "cgroup.subtree_control", todo, optional))
            except OSError as exc:
                if exc.errno == errno.EBUSY and attempt < 4:
                    continue
                left = _words(base / "cgroup.procs")
                raise CgroupUnavailable(
                    f"cannot enable {' '.join(todo)} in {base}/cgroup.subtree_control: {exc.strerror}"
                    + (f" (it still holds pid(s) {' '.join(left[:10])})" if left else "") + f": {HOW}") from None
            finally:                           # what is on now is ours to undo, even after a failure
                on = _words(base / "cgroup.subtree_control")
                self.enabled += [c for c in todo if c in on and c not in self.enabled]
            return refused
        return refused                         # not reached: the last attempt raises

    def _move_into_init(self) -> None:
        """Every process of the base cgroup into its INIT_LEAF (made if missing)."""
        try:
            self.init.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupUnavailable(f"cannot create {self.init}: {exc.strerror} (the processes of {self.base} "
                                    f"must move into a leaf before it can enable controllers): {HOW}") from None
        for pid in _words(self.base / "cgroup.procs"):
            try:
                _write(self.init / "cgroup.procs", pid)
            except ProcessLookupError:
                continue                          # it exited meanwhile
            except OSError as exc:
                raise CgroupUnavailable(
                    f"cannot move pid {pid} ({_comm(pid)}) from {self.base} into {self.init}: {exc.strerror} "
                    f"(a cgroup that holds processes cannot give controllers to its children): {HOW}") from None

    def release(self) -> list[str]:
        """Undo, when no other run needs it (the caller checks): disable the controllers and move the
        processes of INIT_LEAF back. Returns what could not be undone, for the caller to report."""
        left: list[str] = []
        if self.init.is_dir():
            # The base held processes before the first run moved them: its subtree_control was
            # empty then, so everything in it now was enabled for the runs (runc enables more).
            active = _words(self.base / "cgroup.subtree_control")
        else:
            active = [c for c in self.enabled if c in _words(self.base / "cgroup.subtree_control")]
        if active:
            try:
                _write(self.base / "cgroup.subtree_control", " ".join(f"-{c}" for c in active))
            except OSError as exc:          # a cgroup below (not ours) still uses them
                return [f"{self.base}/cgroup.subtree_control: cannot disable {' '.join(active)}: {exc.strerror}"]
        self.enabled = []
        if not self.init.is_dir():
            return left
        for pid in _words(self.init / "cgroup.procs"):
            try:
                _write(self.base / "cgroup.procs", pid)
            except ProcessLookupError:
                continue
            except OSError as exc:
                left.append(f"pid {pid}: cannot move back to {self.base}: {exc.strerror}")
        try:
            self.init.rmdir()
        except OSError as exc:
            left.append(f"{self.init}: {exc.strerror}")
        return left


def _comm(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
