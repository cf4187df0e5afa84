"""The environment a run measured in, for the benchmark JSON's `machine_info["agentcgroup"]`: a
result is only comparable with another one taken on a like host (kernel, cgroup layout, BPF
features, CPU, package versions, seeds)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path

PACKAGES = ("pytest-agentcgroup", "pytest", "pytest-benchmark", "pytest-xdist", "hypothesis", "playwright")


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


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


def snapshot(*, seeds: list[int] | None = None, run_tree: dict | None = None) -> dict:
    """Everything machine_info["agentcgroup"] holds. Cheap except the BPF probe (one tiny program
    load, cached per process). `run_tree`: the controllers the run's cgroups had and the optional
    ones left out with why (merge_run_trees), None when no run tree was made."""
    uname = os.uname()
    return {
        "run_tree": run_tree,
        "kernel": {"release": uname.release, "version": uname.version, "machine": uname.machine},
        "cgroups": _cgroups(),
        "bpf_features": _bpf_features(),
        "bcc_version": _bcc_version(),
        "cpu": {"model": _cpu_model(), "count": os.cpu_count(),
                "allowed": sorted(os.sched_getaffinity(0))},
        "python": platform.python_version(),
        "packages": _versions(),
        "seeds": sorted(set(seeds or [0])),
    }
