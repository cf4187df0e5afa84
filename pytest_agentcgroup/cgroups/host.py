"""Which cgroup layout this host has, and where this process sits in it.

Two layouts are supported:

* `v2`     – one unified hierarchy with controllers (most current distributions).
* `hybrid` – controllers on v1 hierarchies (/sys/fs/cgroup/memory, /pids, ...) and a
             controller-less v2 tree (usually /sys/fs/cgroup/unified) that still gives cgroup ids
             for BPF, cpu.stat, PSI, cgroup.kill and cgroup.freeze.

Everything the run creates lives *under* the cgroup this process is in (never beside it), so the
run is accounted to whoever started it and a container's or session's limits still hold. On v2 the
processes of that cgroup may have been moved into its `agentcgroup-init` leaf (delegate.py); a
process found there belongs to the parent, which is the cgroup the run uses.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: v1 controllers we use in hybrid mode. memory is required; the others are used when an arm asks.
V1_CONTROLLERS = ("memory", "pids", "cpu")
#: v2: the leaf the processes of the run's cgroup are moved into (delegate.py)
INIT_LEAF = "agentcgroup-init"


class CgroupUnavailable(RuntimeError):
    """This host or this process cannot create cgroups; the message names what is missing."""


@dataclass(frozen=True)
class CgroupHost:
    mode: str                       # "v2" or "hybrid"
    unified: Path                   # this process's cgroup in the v2 tree (the parent of its INIT_LEAF)
    v1: dict[str, Path]             # hybrid only: controller -> this process's v1 cgroup
    mount: Path | None = None       # where the v2 hierarchy is mounted (its root cgroup)

    @property
    def is_root(self) -> bool:
        """The v2 root cgroup, exempt from the no-internal-processes rule."""
        return self.mount is not None and self.unified == self.mount

    @property
    def controllers(self) -> tuple[str, ...]:
        if self.mode == "hybrid":
            return tuple(self.v1)
        try:
            return tuple((self.unified / "cgroup.controllers").read_text().split())
        except OSError:
            return ()

    def describe(self) -> dict:
        return {"mode": self.mode, "unified": str(self.unified),
                "v1": {k: str(v) for k, v in self.v1.items()}, "controllers": list(self.controllers)}


def _mounts(mountinfo: str) -> list[tuple[str, str, list[str]]]:
    """(mount point, fs type, super options) for every cgroup mount."""
    out = []
    for line in Path(mountinfo).read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(rfields) >= 3 and rfields[0] in ("cgroup", "cgroup2"):
            out.append((fields[4].replace("\\040", " "), rfields[0], rfields[2].split(",")))
    return out


def detect(*, mountinfo: str = "/proc/self/mountinfo", proc_cgroup: str = "/proc/self/cgroup") -> CgroupHost:
    try:
        mounts = _mounts(mountinfo)
        membership = Path(proc_cgroup).read_text().splitlines()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {exc.filename}: {exc.strerror}") from None
    unified_mount = next((m for m, fs, _ in mounts if fs == "cgroup2"), None)
    v1_mounts = {c: m for m, fs, opts in mounts if fs == "cgroup" for c in opts if c in V1_CONTROLLERS}
    rel_v2, rel_v1 = None, {}
    for line in membership:
        hid, ctrls, rel = line.split(":", 2)
        if hid == "0" and ctrls == "":
            rel_v2 = rel
        for c in ctrls.split(","):
            if c in V1_CONTROLLERS:
                rel_v1[c] = rel
    if unified_mount is None or rel_v2 is None:
        raise CgroupUnavailable("no cgroup v2 hierarchy is mounted (needed for cgroup ids, cpu.stat, kill)")
    unified = Path(unified_mount) / rel_v2.lstrip("/")
    if "memory" in v1_mounts and "memory" in rel_v1:
        v1 = {c: Path(v1_mounts[c]) / rel_v1[c].lstrip("/") for c in V1_CONTROLLERS if c in v1_mounts and c in rel_v1}
        return CgroupHost(mode="hybrid", unified=unified, v1=v1, mount=Path(unified_mount))
    if unified.name == INIT_LEAF:
        unified = unified.parent
    # which controllers the run needs, and whether they can be had, is delegate.py's to say
    return CgroupHost(mode="v2", unified=unified, v1={}, mount=Path(unified_mount))


def check_writable(host: CgroupHost) -> None:
    """Raise CgroupUnavailable naming the first cgroup directory we may not create children in."""
    dirs = [host.unified, *host.v1.values()]
    for d in dirs:
        if not os.access(d, os.W_OK | os.X_OK):
            who = "root" if os.geteuid() != 0 else "write access"
            raise CgroupUnavailable(f"cannot create cgroups under {d}: needs {who} "
                                    "(run as root, or in a cgroup delegated to this user)")


def hierarchies(pid: int, mountinfo: str = "/proc/self/mountinfo") -> dict[str, Path]:
    """key -> the directory of `pid`'s cgroup, for every mounted hierarchy (key: "unified", or the
    hierarchy's controllers / name= as /proc/PID/cgroup lists them, e.g. "cpu,cpuacct")."""
    mounts = _mounts(mountinfo)
    out = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hid, ctrls, rel = line.split(":", 2)
        if hid == "0":
            point = next((m for m, fs, _ in mounts if fs == "cgroup2"), None)
        else:
            point = next((m for m, fs, opts in mounts if fs == "cgroup" and set(ctrls.split(",")) <= set(opts)), None)
        if point is not None:
            out["unified" if hid == "0" else ctrls] = Path(point) / rel.lstrip("/")
    return out
