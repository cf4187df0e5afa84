"""What the VM tests share (test_pure_cgroup2.py, test_delegated_user.py, test_vmharness.py): the
one-trace Experiment 1 corpus and config the guest runs, and the checks of what the guest wrote.
An ordinary module, so that no test module imports another."""
from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from pytest_agentcgroup.metrics.store import METRICS_FILE, NoRun, resolve_run

from . import vmharness

#: the synthetic trace of the Experiment 1 run (trace ids are `<format>/<name>`)
OOM_TRACE = "synthetic/vm-oom-once"
#: (command, recorded peak MiB): step 1's 528 MiB is above static-toolcall's 512 MiB per-step limit
#: (experiments/agentcgroup.toml) and below static-env's 1024 MiB and the dynamic arm's 2048 MiB
#: ceiling; its command is a test run, a low-priority kind the dynamic arm throttles instead. Only
#: 16 MiB above 512: under the soft limits (static-high, bpf-soft) the kernel throttles every page
#: above memory.high with a delay that grows with the overage, and under emulation each MiB of it
#: costs those arms' runs seconds.
OOM_STEPS = (("ls", 20), ("python -m pytest tests", 528), ("cat setup.py", 30))
OOM_STEP = 1
#: how many OOM kills each arm of experiments/agentcgroup.toml must count on that trace
EXPECTED_KILLS = {"unlimited": 0, "static-env": 0, "static-toolcall": 1, "static-high": 0,
                  "agentcgroup": 0, "bpf-soft": 0}


def write_oom_corpus(root: Path) -> Path:
    """A corpus (manifest + one trace) for Experiment 1 in the guest; every number is synthetic."""
    root.mkdir(parents=True, exist_ok=True)
    steps = [{"step_id": i, "tool": "bash", "args": {"command": cmd},
              "duration_ms": {"value": 2000, "provenance": "synthetic"},
              "profile": {"peak_mb": {"value": peak, "provenance": "synthetic"},
                          "ramp_ms": {"value": 1000, "provenance": "synthetic"}}}
             for i, (cmd, peak) in enumerate(OOM_STEPS)]
    trace = {"schema": "agentcgroup-trace/1", "trace_id": OOM_TRACE, "steps": steps,
             "source": {"format": "synthetic", "note": "tests/kernels/checks.py: one step above "
                                                       "the static per-step limit"}}
    (root / "vm-oom-once.json").write_text(json.dumps(trace))
    (root / "manifest.json").write_text(json.dumps({
        "schema": "agentcgroup-manifest/1", "subsets": {"vm": [OOM_TRACE]},
        "traces": [{"trace_id": OOM_TRACE, "file": "vm-oom-once.json"}]}))
    return root


# exp1's claims for the guest's one trace (write_oom_corpus): its step 1 is above 512 MiB, so the
# shipped claims about the smoke traces (no step reaches 512 MiB) do not apply to it
VM_EXP1_CLAIMS = """claims = [
  "static-toolcall.oom_kills == unlimited.oom_kills + 1",     # the one step above 512 MiB, killed once
  "agentcgroup.oom_kills == 0",                               # throttled and granted, not killed
]
"""


def write_vm_config(path: Path, repo: Path = vmharness.REPO) -> Path:
    """experiments/agentcgroup.toml, arms and budgets as shipped, minus its latency budgets
    (`latency_overhead_*`): they are sized for the host, and qemu's software emulation runs code
    ~10x slower, so they would fail for the emulator's sake, not for anything cgroup v2 does; and
    exp1's claims replaced by the guest trace's (VM_EXP1_CLAIMS)."""
    shipped = (repo / "experiments" / "agentcgroup.toml").read_text()
    text = "".join(ln for ln in shipped.splitlines(keepends=True)
                   if not re.match(r"\s*latency_overhead_\w+\s*=", ln))
    exp1 = text.index("[experiments.exp1]")
    start = text.index("\nclaims = [", exp1) + 1
    end = text.index("\n]\n", start) + 3
    assert text.find("\n[", exp1 + 1) > start, "exp1's claims are not in its own table"
    path.write_text(text[:start] + VM_EXP1_CLAIMS + text[end:])
    return path


def exp1_problems(out: Path, kernel: vmharness.Kernel, *, arms=tuple(EXPECTED_KILLS),
                  results: str = "subset-results") -> list[str]:
    """The OOM kill counted exactly once under static-toolcall (and nowhere else among `arms`), and
    the benchmark JSON's environment naming cgroup v2 and this kernel."""
    problems = []
    try:
        metrics = resolve_run(out / results) / METRICS_FILE    # the run's own directory
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except (OSError, ValueError, NoRun) as exc:
        metrics = out / results
        return [f"exp1: cannot read {metrics}: {exc}"]
    kills, killed_steps, steps = Counter(), {}, Counter()
    for r in records:
        if r.get("trace_id") != OOM_TRACE:
            continue
        steps[r["config"]] += 1
        kills[r["config"]] += r.get("oom_kills") or 0
        if r.get("oom_kills"):
            killed_steps.setdefault(r["config"], []).append(r["step_id"])
    for arm, want in ((a, EXPECTED_KILLS[a]) for a in arms):
        if steps[arm] == 0:
            problems.append(f"exp1: arm {arm} recorded no step of {OOM_TRACE} in {metrics}")
        elif kills[arm] != want:
            problems.append(f"exp1: arm {arm} counted {kills[arm]} OOM kills (steps {killed_steps.get(arm, [])}), "
                            f"expected {want}")
    if kills["static-toolcall"] == 1 and killed_steps["static-toolcall"] != [OOM_STEP]:
        problems.append(f"exp1: static-toolcall's kill was step {killed_steps['static-toolcall']}, expected {OOM_STEP}")
    bench = out / "exp1-benchmark.json"
    try:
        env = json.loads(bench.read_text())["machine_info"]["agentcgroup"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return problems + [f"exp1: no machine_info.agentcgroup in {bench}: {exc!r}"]
    if env.get("cgroups", {}).get("mode") != "v2":
        problems.append(f"exp1: {bench} machine_info.agentcgroup.cgroups is {env.get('cgroups')}, not mode v2")
    if env.get("kernel", {}).get("release") != kernel.release:
        problems.append(f"exp1: {bench} machine_info.agentcgroup.kernel is {env.get('kernel')}, "
                        f"not release {kernel.release}")
    return problems


def docker_problems(run: vmharness.RunOutcome) -> list[str]:
    """With the image loaded, every docker case of the hostile suite must have run in the guest,
    and at least one must have passed there."""
    if run.junit is None:
        return []
    out = [f"a docker case did not run in the guest: {r}" for r in run.junit.skip_reasons if "[docker" in r]
    if not any("[docker" in t for t in run.junit.passed_ids):
        out.append("no docker case passed in the guest (no [docker] case of the hostile suite "
                   "is in its JUnit as passed)")
    return out


def docker_verdict(out: Path, image: Path | None, what: str) -> str:
    """How the guest's image preload went, for the verdict: its docker-load.rc as written."""
    if image is None:
        return what
    try:
        rc = (out / "docker-load.rc").read_text()
    except OSError:
        rc = None
    return f"{what} loaded" if rc is not None and rc.strip() == "0" else \
        f"{what} NOT loaded (docker-load.rc {rc.strip() if rc is not None else 'missing'})"


def require_kernel(series: str) -> vmharness.Kernel:
    """The installed kernel; a skip only where this host cannot install one at all."""
    if os.geteuid() != 0:
        pytest.skip("booting kernels for the pure cgroup v2 tests needs root (hostsetup.sh installs them as root)")
    if shutil.which("apt-get") is None:
        pytest.skip("no apt-get: hostsetup.sh installs the Debian kernels and qemu through apt")
    try:
        return vmharness.find_kernel(series)
    except vmharness.KernelMissing as exc:
        pytest.fail(f"set-up did not provide kernel {series}: {exc}", pytrace=False)
