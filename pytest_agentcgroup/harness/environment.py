"""The environment a run measured in, for the benchmark JSON's `machine_info["agentcgroup"]` and the
run directory's run.json: a result is only comparable with another one taken on a like host
(kernel, cgroup layout, BPF features, CPU, memory, package versions, seeds) from the same code
(the checkout's commit). Read by the run's controller (controller.py), and by each xdist worker
for its own machine, which its reports carry to the controller (session.py).

May import: cgroups/ (the host's layout), bpf/ (features), programs (git). Nothing of the pytest side."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

from .. import programs

PACKAGES = ("pytest-agentcgroup", "pytest", "pytest-benchmark", "pytest-xdist", "hypothesis", "playwright")


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_mib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024          # the kernel gives kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def _versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def _bcc_version() -> str | None:
    try:
        import bcc
    except ImportError:
        return None
    return getattr(bcc, "__version__", None) or "unknown"


def _cgroups() -> dict:
    from ..cgroups.host import CgroupUnavailable, detect
    try:
        return detect().describe()
    except CgroupUnavailable as exc:
        return {"mode": None, "unavailable": str(exc)}


def merge_run_trees(trees: list[dict]) -> dict | None:
    """One {"controllers", "refused"} for the run from those of its processes (xdist workers): a
    controller counts as the run's only where every process had it; every refusal is kept."""
    if not trees:
        return None
    have = [c for c in trees[0]["controllers"] if all(c in t["controllers"] for t in trees)]
    refused = {}
    for t in trees:
        for c, why in t["refused"].items():
            refused.setdefault(c, why)
    return {"controllers": have, "refused": refused}


def _bpf_features() -> dict[str, bool]:
    from ..bpf import features
    return {name: ok for name, (ok, _why) in features.probe().items()}


def host() -> dict:
    """The machine: kernel, cgroup layout, CPU, memory, Python and package versions. No BPF probe
    and no bcc import, so that it is cheap enough to take as a run starts (run.json)."""
    uname = os.uname()
    return {
        "kernel": {"release": uname.release, "version": uname.version, "machine": uname.machine},
        "cgroups": _cgroups(),
        "cpu": {"model": _cpu_model(), "count": os.cpu_count(),
                "allowed": sorted(os.sched_getaffinity(0))},
        "memory_mib": _memory_mib(),
        "python": platform.python_version(),
        "packages": _versions(),
    }


def node() -> str:
    """This machine's name (the hostname) as records and complete.json's `hosts` name it."""
    return platform.node() or "unknown"


def machine() -> dict:
    """The machine a process measures on, as complete.json's `hosts` keeps it: its name and host()."""
    return {"hostname": node(), **host()}


def record_fields(cgroup_mode: str | None) -> dict:
    """What each step record says of the machine that measured it: hostname, kernel release and
    cgroup mode (the rest of it is in complete.json's `hosts` under that name)."""
    return {"host": node(), "kernel": os.uname().release, "cgroup_mode": cgroup_mode}


#: the checkout the package is imported from (an editable install's; a wheel's is no checkout)
CHECKOUT = Path(__file__).resolve().parents[2]


def checkout_commit(root: Path = CHECKOUT) -> dict | None:
    """{"commit", "dirty"} of the git checkout at `root` (dirty: tracked files changed since the
    commit), or None when it is not a checkout or git is not installed."""
    git = programs.which("git")
    if git is None:
        return None

    def ask(*args: str) -> str | None:
        try:
            done = subprocess.run([git, "-C", str(root), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None
    commit = ask("rev-parse", "--verify", "HEAD")
    if not commit:
        return None
    status = ask("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def snapshot(*, seeds: list[int] | None = None, run_tree: dict | None = None) -> dict:
    """Everything machine_info["agentcgroup"] holds: host() and the BPF features. Cheap except the
    BPF probe (one tiny program load, cached per process). `run_tree`: the controllers the run's
    cgroups had and the optional ones left out with why (merge_run_trees), None when no run tree
    was made."""
    return {
        "run_tree": run_tree,
        **host(),
        "bpf_features": _bpf_features(),
        "bcc_version": _bcc_version(),
        "seeds": sorted(set(seeds or [0])),
    }
