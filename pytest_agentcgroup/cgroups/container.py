"""Step cgroups inside a container's cgroup.

What Docker's cgroupfs driver does (runc, on a hybrid v1+v2 host):
the container's cgroup is `<cgroup-parent>/<container id>` in *every* mounted hierarchy (all v1
controllers, name=systemd and the unified tree). An absolute cgroup-parent is taken from each
hierarchy's root; a relative one from runc's own cgroup in that hierarchy, which is dockerd's when
dockerd was started from this session. So the plugin hands the executor the workload cgroup's path
*relative to this session's cgroup* — the same in every hierarchy by construction of the run tree,
even where the session sits at different depths (e.g. memory at /process_api/<id>, the rest at /)
— and the container lands directly under the test's workload cgroup in every hierarchy.

`container_cgroup()` then reads where the container's init really is and returns a Cgroup over the
container's directories, under which the steps' cgroups are made (ArmPlacement `nest_in`). If the
engine put the container anywhere else (a dockerd started outside this session), it raises naming
both paths rather than measuring the wrong cgroup. runc also made our run-root and workload names
in the hierarchies we do not use (blkio, freezer, name=systemd, ...): they are adopted into the run
root's and the workload's path sets so that their normal removal removes them too.

On pure cgroup v2 runc resolves a relative cgroup-parent differently: from the *parent* of its own
cgroup (runc libcontainer/cgroups/fs2 `_defaultDirPath`: "the current user scope most probably has
tasks in it already"). So there the executor is handed the workload's absolute path in the v2
hierarchy (`/agentcgroup-…/<test>` below the mount, or the cgroup namespace's root), which runc
takes from the hierarchy's root whoever started dockerd. The container's cgroup holds its init, and
a cgroup with processes cannot give controllers to children (no internal processes), so the init is
first moved into a leaf `init` and the container's cgroup becomes an inner node.
"""
from __future__ import annotations

import errno
import time
from pathlib import Path

from .host import CgroupUnavailable, hierarchies
from .node import Cgroup
from .tree import RunTree


def cgroup_parent(tree: RunTree, workload: Cgroup) -> str:
    """`--cgroup-parent` for a container under `workload`: on hybrid its path relative to this
    process's own cgroup, on v2 its absolute path in the hierarchy (see the module docstring)."""
    host = tree.host
    if host.mode == "v2" and host.mount is not None:
        return "/" + str(workload.unified.relative_to(host.mount))
    return str(workload.unified.relative_to(host.unified))


def container_cgroup(tree: RunTree, workload: Cgroup, init_pid: int) -> Cgroup:
    """A Cgroup over the container's directories in the hierarchies `workload` uses."""
    where = hierarchies(init_pid)
    paths = {}
    for key, own in workload.paths.items():
        if key.startswith("docker:"):        # adopted runc directories (an earlier container's)
            continue
        found = where.get(key) or next((p for k, p in where.items() if key in k.split(",")), None)
        if found is None or found.parent != own:
            raise CgroupUnavailable(
                f"the container's {key} cgroup is {found}, not a child of this test's cgroup {own}: "
                "the Docker engine must run in this session's cgroups (let the plugin start dockerd; "
                "stop a system dockerd first)")
        paths[key] = found
    # runc's directories in hierarchies we do not use: the workload's path (run root included)
    # re-made there; the workload may sit deeper than the run root's child (a tenant of a test)
    rel = workload.unified.relative_to(tree.root.unified.parent).parts
    for key, path in where.items():
        if key not in workload.paths and not any(k in workload.paths for k in key.split(",")):
            if path.parent.parts[-len(rel):] == rel:
                workload.paths.setdefault(f"docker:{key}", path.parent)
                tree.root.paths.setdefault(f"docker:{key}", Path(*path.parent.parts[:len(path.parent.parts) - len(rel) + 1]))
    cg = Cgroup(workload.host, paths, inner=True)      # steps are made below it, none join it
    if workload.host.mode == "v2":
        leaf = cg.unified / "init"
        leaf.mkdir(exist_ok=True)
        for attempt in range(5):
            for pid in cg.pids():
                try:
                    (leaf / "cgroup.procs").write_text(str(pid))
                except ProcessLookupError:
                    continue                       # it exited meanwhile
            try:
                cg._enable_subtree(tuple(c for c in ("memory", "pids", "cpu") if c in tree.controllers))
                break
            except OSError as exc:
                # EBUSY: a process forked into the container's cgroup between the move and the write
                # (the container's init starting its first child): move again,
                # after a moment for the fork storm of its start to settle
                if exc.errno != errno.EBUSY:
                    raise
                if attempt == 4:
                    left = cg.pids()
                    raise CgroupUnavailable(
                        f"cannot enable controllers in {cg.unified}/cgroup.subtree_control: {exc.strerror}"
                        + (f" (it still holds pid(s) {' '.join(map(str, left[:10]))})" if left else "")
                        + ": the container keeps starting processes in its own cgroup") from None
                time.sleep(0.05 * (attempt + 1))
        # a refusal (cpu) on the container's cgroup is the run's too: its steps have no cpu.* files
        tree.refused.update(cg.refused)
    return cg


def steps_in_container(tree: RunTree, workload: Cgroup, executor):
    """`nest_in` for ArmPlacement: the cgroup of the executor's current container (its `init_pid`),
    looked up once per container."""
    found: dict[int, Cgroup] = {}

    def nest_in() -> Cgroup:
        pid = executor.init_pid
        if pid is None:
            raise RuntimeError("the executor has no running container")
        if pid not in found:
            found.clear()
            found[pid] = container_cgroup(tree, workload, pid)
        return found[pid]
    return nest_in
