"""The docker executor against a real dockerd and the locally built image: each step runs in the
container's namespaces but in its own cgroup nested under the container's, which measures and
limits it; nothing (container, cgroup) is left behind. Skips naming the reason without an engine."""
from __future__ import annotations

import fcntl
import io
import os
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from pytest_agentcgroup.arms import Arm

from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.cgroups.container import cgroup_parent, steps_in_container
from pytest_agentcgroup.cgroups.node import MB
from pytest_agentcgroup.engines.docker import DockerEngine
from pytest_agentcgroup.replay import DockerExecutor, ExecutorUnavailable, replay
from pytest_agentcgroup.engines.docker import SESSION_LABEL, image_lock_file, swerebench_image
from pytest_agentcgroup.traces.ir import Step, Trace

from helpers import EXP_MODULE


def bash(i: int, cmd: str, **args) -> Step:
    return Step(i, "bash", {"command": cmd, **args})


def replay_in_docker(engine, tree, name, steps, arm=Arm("unlimited"), on_step=None):
    work = tree.workload(name)
    ex = DockerExecutor(engine, cgroup_parent=cgroup_parent(tree, work), step_timeout_s=30)
    placement = ArmPlacement(arm, work, tree.controllers, nest_in=steps_in_container(tree, work, ex))
    seen = []

    def look(result):                    # while the container still runs
        seen.append((result, Path(f"/proc/{ex.init_pid}/cgroup").read_text(),
                     {key: p for key, p in placement.nest_in().paths.items()}))
        if on_step:
            on_step(ex, result)
    results = replay(Trace(f"test/{name}", {"format": "test"}, tuple(steps)), ex, placement, on_step=look)
    return work, ex, results, seen


def test_steps_run_in_the_container_in_their_own_nested_cgroups(agentcgroup_docker, tree):
    files = {}

    def grab(ex, result):               # read the step's output files from the container's root
        root = Path(f"/proc/{ex.init_pid}/root/workspace")
        files[result.step_id] = {f.name: f.read_text() for f in root.iterdir() if f.is_file()}
    steps = [bash(0, "cat /proc/self/cgroup > cg; cat /proc/net/dev > net; hostname > host; "
                     "cat /etc/debian_version > ver; cd /tmp"),
             bash(1, "pwd > /workspace/pwd; python3 -c 'b = bytearray(96 * 2**20); b[::4096] = b\"x\" * len(b[::4096])'"),
             bash(2, "true"),
             Step(3, "noop")]
    work, ex, results, seen = replay_in_docker(agentcgroup_docker, tree, "nest", steps, on_step=grab)
    assert [r.exit_code for r in results[:3]] == [0, 0, 0] and not results[3].executed
    # inside the container: its root file system (bookworm), its hostname, no network but loopback
    out = files[0]
    assert out["ver"].startswith("12"), out
    assert out["host"].strip() != os.uname().nodename
    assert [ln.split(":")[0].strip() for ln in out["net"].splitlines()[2:]] == ["lo"], out["net"]
    assert files[1]["pwd"].strip() == "/tmp"           # the shell's cwd carried across steps
    # ... but in a cgroup of its own, a child of the container's, itself a child of the workload; the
    # arm limits neither pids nor cpu, so a hybrid host's v1 pids and cpu groups stay the container's
    # (placement.py: bounded and counted there)
    step_cg = {ln.split(":", 2)[1] or "unified": ln.split(":", 2)[2] for ln in out["cg"].splitlines()}
    init_cg = {ln.split(":", 2)[1] or "unified": ln.split(":", 2)[2] for ln in seen[0][1].splitlines()}
    for key in tree.controllers + ("unified",):
        k = next(c for c in step_cg if key in c.split(","))
        want = init_cg[k] if key in ("pids", "cpu") and k != "unified" else init_cg[k] + "/s0"
        assert step_cg[k] == want, (key, step_cg[k], init_cg[k])
        assert Path(seen[0][2][key]).parent == work.paths[key]
    # each step measured on its own: the 96 MiB step, not the others
    assert results[1].counters["peak_bytes"] >= 96 * MB, results[1].counters
    assert results[2].counters["peak_bytes"] < 16 * MB, results[2].counters
    assert results[1].counters["cpu_usec"] > 0
    # the container is gone after the trace; the workload removes the rest
    assert ex.container is None
    assert not agentcgroup_docker.client.containers.list(all=True, filters={"label": "agentcgroup.trace=test/nest"})
    work.remove()
    assert not any(p.exists() for p in work.paths.values())


def test_a_step_over_its_limit_is_oom_killed_inside_the_container(agentcgroup_docker, tree):
    steps = [bash(0, "python3 -c 'b = bytearray(200 * 2**20); b[::4096] = b\"x\" * len(b[::4096])'"), bash(1, "echo ok")]
    work, ex, results, _ = replay_in_docker(agentcgroup_docker, tree, "oom", steps,
                                            Arm("static-toolcall", memory_max_mb=64))
    assert results[0].counters["oom_kills"] >= 1 and results[0].exit_code != 0, results[0]
    assert results[1].exit_code == 0 and results[1].counters["oom_kills"] == 0
    work.remove()


def test_a_script_a_step_writes_runs_as_it_did_where_the_trace_was_recorded(agentcgroup_docker, tree):
    steps = [bash(i, f"printf '#!/bin/sh\\nexit 7\\n' > {d}/x.sh && chmod +x {d}/x.sh && {d}/x.sh")
             for i, d in enumerate(("/workspace", "/tmp", "/root"))]
    work, ex, results, _ = replay_in_docker(agentcgroup_docker, tree, "scripts", steps)
    assert [r.exit_code for r in results] == [7, 7, 7], results        # 126 where the tmpfs is noexec
    work.remove()


def test_hostile_step_cannot_escape(agentcgroup_docker, tree):
    steps = [bash(0, "mknod /tmp/sda b 8 0"),                 # no mknod capability
             bash(1, "echo x > /etc/owned"),                  # read-only root file system
             bash(2, "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), timeout=2)'"),
             bash(3, "sleep 60", timeout_ms=500)]              # the step's timeout kills it
    work, ex, results, _ = replay_in_docker(agentcgroup_docker, tree, "hostile", steps)
    assert all(r.exit_code != 0 or r.signal for r in results[:3]), results
    assert results[3].timed_out and results[3].latency_ms < 5000
    work.remove()


@pytest.mark.root   # without root acquire() says first that dockerd's state directory needs root
def test_no_engine_is_a_clear_skip_reason(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(ExecutorUnavailable, match="no Docker engine is reachable"):
        DockerEngine.acquire(start=False)


def test_swerebench_image_name():
    # x86_64 is part of SWE-rebench's own image names (its images are built for x86_64 only)
    assert swerebench_image("pydicom__pydicom-2065") == "swerebench/sweb.eval.x86_64.pydicom_1776_pydicom-2065"


# -- removing the project's images (`agentcgroup images clean`, run by .ci/run before the tests) ----

def tiny_image(engine, name: str) -> None:
    """An image of one file, imported in a second: a stand-in for the local image, which takes
    minutes to build and which other sessions may be using."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("marker")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"x\n"))
    repo, _, tag = name.partition(":")
    engine.client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag)
    assert engine.has_image(name)


def images_clean(*names: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pytest_agentcgroup.cli", "images", "clean"]
    for name in names:
        argv += ["--image", name]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300)


def test_the_local_image_runs_python_without_apt_lists_docs_or_translations(agentcgroup_docker):
    """The image is pruned (rootfs.prune_for_image) and what steps use still works in it."""
    engine = agentcgroup_docker
    name = engine.ensure_image()
    out = engine.client.containers.run(name, ["sh", "-c",
        "python3 -c 'import json, ctypes, subprocess; print(\"py ok\")' && "
        "ls -A /var/lib/apt/lists /var/cache/apt /usr/share/doc /usr/share/man /usr/share/locale | grep -v : | grep . | wc -l"],
        remove=True, network_disabled=True).decode()
    assert out.split() == ["py", "ok", "0"], out


def test_a_build_waits_for_the_one_under_way_and_takes_its_image(agentcgroup_docker):
    """Two sessions finding the image missing build it once: the second waits on the build lock and
    then finds the first one's image (a build of its own would fail at once: its mirror is bogus)."""
    engine = agentcgroup_docker
    name = f"agentcgroup/build-lock-test:{os.getpid()}"
    fd = os.open(engine.state_dir / image_lock_file(name), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)                       # another session's build under way
    got: dict = {}

    def second_session():
        try:
            got["image"] = engine.ensure_image(name, mirror="file:///nonexistent-mirror")
        except Exception as exc:
            got["error"] = exc
    waiter = threading.Thread(target=second_session)
    try:
        waiter.start()
        time.sleep(1.0)
        assert waiter.is_alive() and not got, got       # waiting, not building
        tiny_image(engine, name)                         # the other build's result
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    try:
        waiter.join(60)
        assert got == {"image": name}
    finally:
        if engine.has_image(name):
            engine.client.images.remove(name)
        (engine.state_dir / image_lock_file(name)).unlink(missing_ok=True)     # a name of this run only


def test_images_clean_removes_a_project_image_and_is_silent_when_none_is_left(agentcgroup_docker):
    engine = agentcgroup_docker
    ours, other = f"agentcgroup/clean-test:{os.getpid()}", f"agentcgroup-not-ours/clean-test:{os.getpid()}"
    tiny_image(engine, ours)
    tiny_image(engine, other)
    try:
        # the default set: every agentcgroup/... tag, nothing else
        assert ours in engine.project_images() and other not in engine.project_images()
        first = images_clean(ours)
        assert (first.returncode, first.stdout, first.stderr) == (0, f"removed image {ours}\n", ""), first.stderr
        assert not engine.has_image(ours)
        again = images_clean(ours)
        assert (again.returncode, again.stdout, again.stderr) == (0, "", ""), again.stderr
        assert engine.has_image(other)
    finally:
        for name in (ours, other):
            if engine.has_image(name):
                engine.client.images.remove(name)


def test_images_clean_refuses_an_image_a_container_uses_naming_it(agentcgroup_docker):
    engine = agentcgroup_docker
    name = f"agentcgroup/clean-test-used:{os.getpid()}"
    tiny_image(engine, name)
    box = engine.client.containers.create(name, ["/marker"], labels={SESSION_LABEL: engine.tag})
    try:
        out = images_clean(name)
        assert out.returncode == 1 and out.stdout == "", out
        assert f"cannot remove image {name}" in out.stderr and "Traceback" not in out.stderr, out.stderr
        assert engine.has_image(name)
    finally:
        box.remove(force=True)
        engine.client.images.remove(name)


def test_plugin_runs_an_experiment_with_the_docker_executor(pytester, study, agentcgroup_docker):
    pytester.makepyfile(test_exp=EXP_MODULE)
    res = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--agentcgroup-config={study}",
                                        "--agentcgroup-executor=docker", "--agentcgroup-arms=unlimited", "-q", "-rs")
    res.assert_outcomes(passed=1)
    assert not agentcgroup_docker.client.containers.list(
        all=True, filters={"label": "agentcgroup.trace=synthetic/oom-once"})


def test_a_second_acquisition_in_the_same_process_leaves_the_first_registered(agentcgroup_docker):
    """The kernels VM test acquires an engine to `docker save` the image and releases it, in the
    pytest process whose session fixture holds one already. That release once unregistered the
    session too (both had the process's tag), stopped the dockerd it had started, and every docker
    test after it failed. Each acquisition is registered, and labels its containers, on its own."""
    first = agentcgroup_docker
    users = first.state_dir / "users"
    name = f"agentcgroup/second-acquisition-test:{os.getpid()}"
    tiny_image(first, name)
    box = first.client.containers.create(name, ["/marker"], labels={SESSION_LABEL: first.tag})
    second, released = None, False
    try:
        second = DockerEngine.acquire(state_dir=first.state_dir)
        assert second.tag != first.tag and (users / second.tag).exists() and (users / first.tag).exists()
        second.release(state_dir=first.state_dir)
        released = True
        assert not (users / second.tag).exists()
        assert (users / first.tag).exists()               # still registered: dockerd is not stopped
        assert first.client.ping()
        assert first.client.containers.get(box.id)        # the second's release left the first's container
    finally:
        if second is not None and not released:
            second.release(state_dir=first.state_dir)
        box.remove(force=True)
        first.client.images.remove(name)
