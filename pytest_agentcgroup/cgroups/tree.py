"""The run's cgroup hierarchy: one root per run, one cgroup per test, one child per step.

    <this process's cgroup>/agentcgroup-<pid>-<start ticks>/   run root (one per RunTree), inner
        <test>/                                                 the workload (inner): limits of env-wide arms
            p<n>/ (s<step_id>/ unpooled)                        one tool call (a leaf): per-step limits, counters

On pure v2 the controllers come from this process's cgroup, which first moves its processes into a
leaf of their own (delegate.py); the last run to end under it undoes that.

The run root's name says which process made it. A run killed with SIGKILL cannot clean up, so
every new run first removes the run roots whose maker is gone (`sweep_stale`).
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import warnings
from pathlib import Path

from ..proc import start_ticks
from .delegate import Delegation
from .host import INIT_LEAF, CgroupHost, CgroupUnavailable, check_writable, hierarchies
from .node import OPTIONAL, Cgroup, remove_tree

PREFIX = "agentcgroup-"
_ROOT_RE = re.compile(rf"^{PREFIX}(\d+)-(\d+)(?:-\d+)?$")
_made = itertools.count()      # run roots this process made: one process may hold several at once
#: What the run's cgroups get. cpu (cpu.weight/cpu.max, v1 cpu.shares/cfs quota: arms with CPU
#: settings) is used where the host has it, for every arm alike, so that arms differ only by their
#: settings: on hybrid every step also joins a v1 cpu cgroup (run root > test, > step where the arm
#: sets CPU), so the run competes for CPU as one group with the host's other processes at its own
#: cpu cgroup's level; likewise pids (a step's own v1 pids cgroup only where the arm sets pids_max).
#: cpu is optional (node.OPTIONAL): left out where it is not delegated or the kernel refuses it (v2),
#: or not mounted (v1); RunTree.refused says why.
CONTROLLERS = ("memory", "pids", "cpu")


def run_root_name(pid: int | None = None) -> str:
    """`agentcgroup-<pid>-<start ticks>[-<n>]`: who made it, and the n-th root it made."""
    pid = os.getpid() if pid is None else pid
    n = next(_made)
    return f"{PREFIX}{pid}-{start_ticks(pid)}" + (f"-{n}" if n else "")


def _parents(host: CgroupHost) -> dict[str, Path]:
    """Where run roots live: our cgroup in the hierarchies we use and, on the live host, in every
    other mounted one too, where a container engine makes our names for its containers (runc
    creates `<cgroup-parent>/<id>` in all hierarchies; see container.py) that we must remove."""
    parents = {"unified": host.unified, **host.v1}
    try:
        live = hierarchies(os.getpid())
    except OSError:
        live = {}
    own = live.get("unified")
    if own is not None and own.name == INIT_LEAF:    # moved there by delegate.py
        own = own.parent
    if own == host.unified:                          # not a test's fake cgroupfs
        for key, path in live.items():
            if key != "unified" and not any(c in parents for c in key.split(",")):
                parents[f"other:{key}"] = path
    return parents


def live_run_roots(parent: Path) -> list[Path]:
    """The run roots under `parent` whose maker still runs."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return []
    return [e for e in entries if (m := _ROOT_RE.match(e.name)) and e.is_dir()
            and start_ticks(int(m.group(1))) == int(m.group(2))]


def sweep_stale(host: CgroupHost) -> list[Path]:
    """Remove run roots left by runs whose process no longer exists. Returns what was removed."""
    return [p for parent in _parents(host).values() for p in sweep_stale_in(parent)]


def sweep_stale_in(parent: Path) -> list[Path]:
    """sweep_stale for one parent directory (also used for the v1 cpuset of isolated workers)."""
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        m = _ROOT_RE.match(entry.name)
        if not m or not entry.is_dir():
            continue
        pid, ticks = int(m.group(1)), int(m.group(2))
        if start_ticks(pid) == ticks:
            continue                      # its maker still runs (another session, an xdist worker)
        kill = entry / "cgroup.kill"
        if kill.exists():
            try:
                kill.write_text("1")
            except OSError:
                pass
        remove_tree(entry)
        removed.append(entry)
    return removed


class RunTree:
    """The run root. `workload(name)` makes a test's cgroup; `close()` removes everything.

    `controllers`: what the run's cgroups get (v2: enabled in every inner node's subtree_control;
    hybrid: the v1 hierarchies used; cpu only where available, see CONTROLLERS). `refused`: the
    optional controllers left out, each with why. `undone` lists what close() could not undo on v2."""

    def __init__(self, host: CgroupHost, *, controllers: tuple[str, ...] = CONTROLLERS):
        check_writable(host)
        self.host = host
        self.refused: dict[str, str] = {} if host.mode == "v2" else {
            c: f"no v1 {c} hierarchy mounted for this process" for c in controllers if c in OPTIONAL and c not in host.v1}
        self.controllers = tuple(c for c in controllers if host.mode == "v2" or c in host.v1)
        self.stale_removed = sweep_stale(host)
        self.delegation = Delegation(host) if host.mode == "v2" else None
        self.undone: list[str] = []
        with self._shared():
            try:
                if self.delegation is not None:       # inside the try: a failure halfway is undone
                    self._refuse(self.delegation.ensure(self.controllers))
                self.root = Cgroup.make(host, _parents(host), run_root_name(), self.controllers, inner=True)
                self._refuse(self.root.refused)
            except PermissionError as exc:
                self._release()
                raise CgroupUnavailable(f"cannot create cgroups under {Path(exc.filename).parent}: "
                                        f"{exc.strerror} (run as root, or in a delegated cgroup)") from None
            except BaseException:
                self._release()
                raise
        self._names: set[str] = set()

    def _refuse(self, refused: dict[str, str]) -> None:
        """Leave out the optional controllers the kernel (or the delegation) would not give."""
        self.refused.update(refused)
        self.controllers = tuple(c for c in self.controllers if c not in refused)

    def _shared(self):
        """The delegation's lock (v2): another session's run may be starting or ending under the
        same cgroup; taking and giving back the controllers must not interleave."""
        return self.delegation.locked() if self.delegation is not None else contextlib.nullcontext()

    def enable_at_root(self, controllers: tuple[str, ...]) -> None:
        """v2: give the run root more controllers (e.g. cpuset for worker isolation) without passing
        them on to the tests' cgroups. CgroupUnavailable names a controller that is not delegated."""
        if self.delegation is not None:
            with self._shared():
                self.delegation.ensure(controllers, optional=())     # asked for: required

    def workload(self, name: str, *, inner: bool = True) -> Cgroup:
        """A test's cgroup under the run root: inner (steps, tenants get cgroups below it), or with
        inner=False a leaf that processes join directly (e.g. a browser tenant's process tree)."""
        name = _safe_name(name)
        base, n = name, 1
        while name in self._names:
            n += 1
            name = f"{base}.{n}"
        self._names.add(name)
        cg = self.root.child(name, self.controllers, inner=inner)
        self.refused.update(cg.refused)      # its steps then have no cpu.* files (node._cpu_write says so)
        return cg

    def close(self) -> None:
        with self._shared():
            self.root.remove()
            for key, parent in _parents(self.host).items():   # what a container engine made in our name
                if key not in self.root.paths:
                    remove_tree(parent / self.root.unified.name)
            self._release()
        if self.undone:                  # one line at session end (pytest shows warnings from there)
            warnings.warn(CgroupsLeftBehind(f"{self.host.unified}: delegation not fully undone: "
                                            + "; ".join(self.undone)), stacklevel=2)

    def _release(self) -> None:
        # the last run under this cgroup (any process, any session) gives back what delegate.py took
        if self.delegation is not None and not live_run_roots(self.host.unified):
            self.undone = self.delegation.release()


class CgroupsLeftBehind(UserWarning):
    """What closing a run could not undo in the cgroup it ran in (controllers, moved processes)."""


def _safe_name(name: str) -> str:
    """A cgroup directory name: no slashes, no leading dot, at most 200 bytes."""
    name = re.sub(r"[^A-Za-z0-9_.@:+-]+", "_", name).lstrip(".") or "_"
    return name[:200]
