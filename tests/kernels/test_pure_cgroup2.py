"""The cgroup, BPF and hostile tests and a one-trace Experiment 1, on real Debian kernels that mount
only cgroup v2 (this host is hybrid v1+v2; most users' hosts are pure v2).

One test per kernel series (`--agentcgroup-kernels`: 6.12 by default, `all` = 6.1, 6.12, 7.3).
The hostile suite's docker cases run in the guest too: while the guest boots, a dockerd of the
host's own loads the project's image into a data root (dataroot.py), which the guest unpacks as its
/var/lib/docker (no network there to build it).
Each boots the kernel under qemu (vmharness.py), runs one pytest session inside, and asserts:
the guest really ran that kernel on pure cgroup v2 (its own probe: `/proc/self/cgroup` is `0::/…`
only, no v1 cgroup mount, `uname -r`), the session ran tests and none failed or erred (failures
are listed with the end of their report), Experiment 1 counted the one OOM kill under
static-toolcall exactly once and nowhere else, and its benchmark JSON recorded cgroup v2 and the
kernel. A kernel that set-up should have installed and did not is a failure, not a skip.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_agentcgroup import programs

from . import dataroot, vmharness
from .checks import (OOM_TRACE, docker_problems, docker_verdict, exp1_problems, require_kernel, write_oom_corpus,
                     write_vm_config)

pytestmark = [pytest.mark.vm, pytest.mark.root, pytest.mark.slow, pytest.mark.docker, pytest.mark.network]
#: run in the guest: the cgroup and BPF tests, plus the hostile suite where this checkout has it
SUBSET = ("tests/test_cgroups.py", "tests/test_cgroups_refused.py", "tests/test_bpf_programs.py", "tests/test_bpf_controller.py",
          "tests/test_bpf_features.py", "tests/hostile")
def guest_run(out: Path, repo: Path = vmharness.REPO) -> vmharness.PytestRun:
    """The subset and Experiment 1 in one pytest session: each pytest start costs the guest minutes
    of imports over 9p under emulation (measured: ~3 min before the first test). The exp1 options
    only concern experiments; the tests under tests/ build their own cgroups and studies."""
    subset = tuple(p for p in SUBSET if (repo / p).exists())
    corpus = write_oom_corpus(out / "exp1-traces")
    config = write_vm_config(out / "exp1-agentcgroup.toml", repo)
    exp1 = ("experiments/test_exp1_domain_mismatch.py", "--agentcgroup-config", str(config),
            "--agentcgroup-traces", str(corpus), "--agentcgroup-subset", OOM_TRACE,
            "--benchmark-json", str(out / "exp1-benchmark.json"))
    return vmharness.PytestRun("subset", subset + exp1)


def acquire_engine():
    """The host's Docker engine for the guest's image, or (None, why) where the host has none (the
    guest's docker cases then skip, and the verdict says so). A host whose set-up installed dockerd
    must serve: a broken set-up must not pass as "no docker"."""
    from pytest_agentcgroup.engines.docker import DockerEngine
    from pytest_agentcgroup.errors import ExecutorUnavailable
    try:
        return DockerEngine.acquire(), ""
    except ExecutorUnavailable as exc:
        if os.geteuid() == 0 and programs.which("dockerd"):
            pytest.fail(f"the host has dockerd but no engine for the guest's image: {exc}", pytrace=False)
        return None, f"no docker on the host: {exc}"


def save_image(engine, tar: Path, result: dict) -> None:
    """The project's local image (engines/docker.py LOCAL_IMAGE, built on the host if missing) as
    a Docker data root in `tar` for the guest's engine, which has no network to build it
    (dataroot.py); then the guest is told it is whole, or why it will not come (also kept in
    result["failure"]). Runs while the guest boots; releases the engine as a session does."""
    try:
        result["name"] = engine.ensure_image()
        dataroot.write_data_root(engine, result["name"], tar)
        vmharness.mark_image(tar)
    except Exception as exc:                    # ExecutorUnavailable, DataRootFailed, the SDK's errors, a full disk
        result["failure"] = f"the host has a Docker engine but could not give the guest its image: {exc}"
        tar.unlink(missing_ok=True)             # a partial tarball: hundreds of MB on the guest's disk
        try:
            vmharness.mark_image(tar, result["failure"])
        except OSError as mark:                 # the guest then waits IMAGE_WAIT_S; the failure still counts
            result["failure"] += f" (and the guest could not be told: {mark})"
    finally:
        engine.release()


@dataclass
class SubsetBoot:
    kernel: vmharness.Kernel
    result: vmharness.GuestResult
    image: Path | None          # the docker image tarball the guest loaded, if the host had an engine
    what: str                   # that image's name, or why there was none


def boot_subset(out: Path, kernel_series: str) -> SubsetBoot:
    """The guest's run (in the background: tests/background.py). The image is built and saved while
    the guest boots and starts its engine (they take minutes each under emulation)."""
    kernel = require_kernel(kernel_series)
    engine, what = acquire_engine()
    image, saved = (out / "docker-root.tar" if engine else None), {}
    saver = threading.Thread(target=save_image, args=(engine, image, saved), daemon=True) if engine else None
    if saver:
        try:
            saver.start()
        except BaseException:
            engine.release()
            raise
    try:
        # the session's longest chain (one core of emulation for most of it): ahead of the rest
        result = vmharness.boot(kernel, out, [guest_run(out)], docker_image=image, nice=-5,
                                 local_headers=True)
    except vmharness.KernelMissing as exc:       # vng itself missing after set-up
        if image:
            vmharness.mark_image(image, str(exc))
        pytest.fail(str(exc), pytrace=False)
    finally:
        if saver:
            saver.join()
        if image:                                # a few hundred MB: loaded by now, or cut short
            image.unlink(missing_ok=True)
    if "failure" in saved:
        pytest.fail(saved["failure"], pytrace=False)
    return SubsetBoot(kernel, result, image, saved.get("name", what))


@pytest.mark.background(run=boot_subset, lane="vm")
def test_pure_cgroup2_subset(kernel_series: str, background_result: SubsetBoot, kernel_verdicts: list[str]):
    booted = background_result
    kernel, result, image, out = booted.kernel, booted.result, booted.image, booted.result.out
    problems = result.problems()
    if result.runs["subset"].rc is not None:
        problems += exp1_problems(out, kernel)
        if image is not None:
            problems += docker_problems(result.runs["subset"])
    kernel_verdicts.append(f"{result.verdict()} (docker: {docker_verdict(out, image, booted.what)})")
    assert not problems, f"{result.verdict()}\nguest files: {out}\n\n" + "\n\n".join(problems)
