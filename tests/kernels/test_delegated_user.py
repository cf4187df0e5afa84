"""A user without root on a pure cgroup v2 host, in a cgroup delegated to it — as a systemd user
session (`systemd-run --user --scope -p Delegate=yes`) or a rootless container gets one: the
cgroup tests and Experiment 1's static arms run there, on a real kernel.

The guest (vmharness.py, run `deleg`) delegates /sys/fs/cgroup/deleg to `nobody` the way systemd's
Delegate=yes does (the directory and its cgroup.procs, cgroup.threads and cgroup.subtree_control
chowned to the user; memory and pids given to it by the root cgroup), puts a shell there and runs
pytest as `nobody` with no capability. The plugin must then do by itself what it does as root:
move pytest's processes into a leaf, enable the controllers, make the run's cgroups, limit and
count. What needs root says so and skips (eBPF, the docker engine, the sandbox's tmpfs); what does
not must pass. Asserted: tests ran and none failed, and Experiment 1's static per-step limit
killed the one step above it exactly once (static-toolcall; the others none), recorded as cgroup v2.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from . import vmharness
from .checks import EXPECTED_KILLS, OOM_TRACE, exp1_problems, require_kernel, write_oom_corpus, \
    write_vm_config

pytestmark = [pytest.mark.vm, pytest.mark.root, pytest.mark.slow]   # boots a kernel under qemu
USER = "nobody"
#: the arms a user without root can run: limits and counters only (the policy arms need eBPF: root)
STATIC_ARMS = ("unlimited", "static-env", "static-toolcall", "static-high")


def guest_run(out: Path, repo: Path = vmharness.REPO) -> vmharness.PytestRun:
    corpus = write_oom_corpus(out / "exp1-traces")
    config = write_vm_config(out / "exp1-agentcgroup.toml", repo)
    # the benchmark JSON goes where the user may write (its tmp), and is copied back with the rest
    return vmharness.PytestRun("deleg", (
        "tests/test_cgroups.py", "tests/test_cgroups_refused.py", "experiments/test_exp1_domain_mismatch.py",
        "--agentcgroup-config", str(config), "--agentcgroup-traces", str(corpus),
        "--agentcgroup-subset", OOM_TRACE, "--agentcgroup-arms", ",".join(STATIC_ARMS),
        "--benchmark-json", f"{vmharness.GUEST_TMP}/deleg/out/exp1-benchmark.json"), user=USER)


def boot_delegated(out: Path) -> vmharness.GuestResult:
    """The guest's run (in the background: tests/background.py)."""
    return vmharness.boot(require_kernel("6.12"), out, [guest_run(out)])


@pytest.mark.background(run=boot_delegated, lane="vm-delegated")
def test_delegated_user_runs_without_root(background_result: vmharness.GuestResult, kernel_verdicts: list[str]):
    result, out = background_result, background_result.out
    problems = result.problems()
    run = result.runs["deleg"]
    if run.rc is not None:
        problems += exp1_problems(out, result.kernel, arms=STATIC_ARMS, results="deleg-results")
        log = (out / "deleg.log").read_text(errors="replace") if (out / "deleg.log").exists() else ""
        if "cgroup.procs" in log and "Permission denied" in log:
            problems.append("the delegated user could not move a process (cgroup.procs: Permission denied)")
    kernel_verdicts.append(f"{result.verdict()} (as {USER}, delegated cgroup)")
    assert not problems, f"{result.verdict()}\nguest files: {out}\n\n" + "\n\n".join(problems)
    assert all(a in EXPECTED_KILLS for a in STATIC_ARMS)
