"""Worker isolation for parallel runs (`-n N --agentcgroup-isolate`): xdist worker i of N gets the
i-th of N disjoint slices of the CPUs this process may use, and 1/N of the memory it may use, so
concurrent experiments do not measure each other.

* CPUs, hybrid (v1 cpuset hierarchy): a cpuset cgroup `<own cpuset>/<run root name>` with the
  worker's slice; the worker process moves into it, so every step it spawns inherits the slice
  (the cpuset hierarchy is separate from the memory one, so memory accounting does not change).
* CPUs, v2: `cpuset.cpus` on the worker's run root: cpuset is enabled in the subtree_control of
  the cgroup pytest runs in (needs the cpuset controller delegated to it; delegate.py).
* memory: a hard limit on the worker's run root (v1 memory.limit_in_bytes / v2 memory.max), which
  every test's and step's cgroup sits under.
"""
from __future__ import annotations

import os
from pathlib import Path

from .host import CgroupUnavailable, hierarchies
from .node import remove_tree
from .tree import RunTree, sweep_stale_in


def cpu_slice(index: int, count: int, cpus: list[int] | None = None) -> list[int]:
    """The index-th of `count` disjoint, contiguous slices of `cpus` (default: this process's)."""
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if count > len(cpus):
        raise CgroupUnavailable(f"{count} workers but only {len(cpus)} CPU(s) ({_ranges(cpus)}): a disjoint "
                                f"cpuset per worker needs -n {len(cpus)} or fewer")
    per, extra = divmod(len(cpus), count)
    start = index * per + min(index, extra)
    return cpus[start:start + per + (1 if index < extra else 0)]


def _ranges(cpus: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5' (the cpuset list format)."""
    out, run = [], []
    for c in sorted(cpus):
        if run and c != run[-1] + 1:
            out.append(run)
            run = []
        run.append(c)
    if run:
        out.append(run)
    return ",".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def _memory_limit(tree: RunTree) -> int:
    """What this process may use: its memory cgroup's limit, or the machine's RAM if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    host = tree.host
    f = host.v1["memory"] / "memory.limit_in_bytes" if host.mode == "hybrid" else host.unified / "memory.max"
    try:
        text = f.read_text().strip()
    except OSError:
        return total
    return total if text == "max" else min(total, int(text))


def _v1_cpuset_dir() -> Path | None:
    """This process's cgroup in the v1 cpuset hierarchy (None: not mounted)."""
    return next((p for key, p in hierarchies(os.getpid()).items() if "cpuset" in key.split(",")), None)


class WorkerIsolation:
    def __init__(self, tree: RunTree, index: int, count: int):
        self.cpus = cpu_slice(index, count)
        self.memory_bytes = _memory_limit(tree) // count
        self._cpuset: Path | None = None
        self._parent: Path | None = None
        if tree.host.mode == "hybrid":
            parent = _v1_cpuset_dir()
            if parent is None or not os.access(parent, os.W_OK):
                raise CgroupUnavailable("no writable v1 cpuset hierarchy for this process "
                                        f"({parent or 'cpuset not mounted'})")
            sweep_stale_in(parent)
            self._parent, self._cpuset = parent, parent / tree.root.unified.name
            self._cpuset.mkdir()
            try:
                (self._cpuset / "cpuset.cpus").write_text(_ranges(self.cpus))
                mems = (parent / "cpuset.effective_mems").read_text().strip() or (parent / "cpuset.mems").read_text().strip()
                (self._cpuset / "cpuset.mems").write_text(mems)
                (self._cpuset / "cgroup.procs").write_text(str(os.getpid()))
            except OSError as exc:
                self.close()
                raise CgroupUnavailable(f"cannot set up cpuset {self._cpuset}: {exc.strerror}") from None
        else:
            tree.enable_at_root(("cpuset",))      # CgroupUnavailable: cpuset is not delegated here
            (tree.root.unified / "cpuset.cpus").write_text(_ranges(self.cpus))
        tree.root.set_memory_max(self.memory_bytes)

    @property
    def outside(self) -> list[str]:
        """cgroup.procs of the cpuset this process had before isolation: where a process shared by
        all workers (dockerd) must start, not in this worker's slice."""
        return [str(self._parent / "cgroup.procs")] if self._cpuset is not None else []

    def close(self) -> None:
        """Move this process back to its own cpuset and remove the worker's."""
        if self._cpuset is None:
            return
        try:
            (self._parent / "cgroup.procs").write_text(str(os.getpid()))
        except OSError:
            pass
        remove_tree(self._cpuset)
        self._cpuset = None
