"""The project's Docker image as a Docker data root for the VM guest's engine, made on the host.

The guest has no network to build the image, and its own `docker load` of the host's `docker save`
took 4-5 minutes of emulation on a loaded host (dockerd unpacking and hashing the layer). Here a
dockerd of its own on the host (own data root, exec root, socket, pid file and an empty config; no
bridge, no iptables: it runs no container) loads the host engine's `docker save` stream, is
stopped, and its data root is tarred: the guest unpacks that as its /var/lib/docker, where the
dockerd the plugin starts in the guest finds the image. Both run the host's dockerd binary (the
guest shares the host's root), so the layout is the one it reads; overlay2 is named on both sides.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from pytest_agentcgroup import programs

#: what the guest's dockerd needs of the data root: the image store and its layers (not the private
#: engine's containerd state, scratch or trust key)
KEPT = ("image", "overlay2")
STORAGE_DRIVER = "overlay2"


class DataRootFailed(Exception):
    """The data root could not be made (the message says which step and why)."""


def write_data_root(engine, name: str, tar: Path, *, timeout_s: float = 300.0) -> Path:
    """Load image `name` from `engine` (engines/docker.py DockerEngine) into a private dockerd's data
    root and write it to `tar`; DataRootFailed naming the step that failed."""
    import docker
    root = tar.with_name(tar.name + ".d")
    root.mkdir()
    try:
        with private_dockerd(root, log=tar.with_name(tar.name + ".dockerd.log"), timeout_s=timeout_s) as client:
            try:
                client.images.load(engine.client.images.get(name).save(named=True))
                client.images.get(name)
            except docker.errors.DockerException as exc:
                raise DataRootFailed(f"the host's private dockerd could not load {name}: {exc}") from None
        tarred = subprocess.run(["tar", "-C", str(root), "--xattrs", "--xattrs-include=*", "-cf", str(tar), *KEPT],
                                capture_output=True, text=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if tarred.returncode != 0:
        raise DataRootFailed(f"tar of the data root failed ({tarred.returncode}): {tarred.stderr.strip()[-500:]}")
    return tar


@contextlib.contextmanager
def private_dockerd(root: Path, *, log: Path, timeout_s: float = 300.0):
    """A dockerd of its own on `root` (own exec root, socket, pid file, empty config), yielding a
    Docker SDK client of it; stopped, with the containerd it started, on the way out."""
    import docker
    dockerd = programs.require("dockerd", needed_by="the guest's Docker data root")
    run = Path(tempfile.mkdtemp(prefix="acg-dr-"))      # short: unix sockets live under it (108 bytes)
    (run / "daemon.json").write_text("{}\n")
    try:
        with open(log, "ab") as fh:
            proc = subprocess.Popen(
                [dockerd, "--config-file", str(run / "daemon.json"), "--data-root", str(root),
                 "--exec-root", str(run / "exec"), "--pidfile", str(run / "dockerd.pid"),
                 "--host", f"unix://{run / 'docker.sock'}", "--storage-driver", STORAGE_DRIVER, "--bridge=none",
                 "--iptables=false", "--ip-masq=false", "--exec-opt", "native.cgroupdriver=cgroupfs"],
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            client = _connect(docker, run / "docker.sock", proc, timeout_s, log)
            try:
                yield client
            finally:
                client.close()
        finally:
            _stop(proc)
    finally:
        shutil.rmtree(run, ignore_errors=True)


def _connect(docker, sock: Path, proc: subprocess.Popen, timeout_s: float, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:])
            raise DataRootFailed(f"the host's private dockerd exited with {proc.returncode} (log {log}):\n{tail}")
        if sock.exists():
            try:                                # the SDK asks the server's API version on creation
                return docker.DockerClient(base_url=f"unix://{sock}", timeout=600)
            except Exception:                   # DockerException, or requests' own while it starts
                pass
        time.sleep(0.2)
    raise DataRootFailed(f"the host's private dockerd did not answer within {timeout_s:.0f} s (log {log})")


def _stop(proc: subprocess.Popen) -> None:
    """dockerd stops the containerd it started on SIGTERM; its whole session is killed if it does not."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
