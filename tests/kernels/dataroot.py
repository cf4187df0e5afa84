"""The project's Docker image as a Docker data root for the VM guest's engine, made on the host.

The guest has no network to build the image, and its own `docker load` of the host's `docker save`
took minutes of emulation on a loaded host (dockerd unpacking and hashing the layer). Here a
dockerd of its own on the host loads the host engine's `docker save` stream, is stopped, and its
data root's image store and layers are tarred: the guest unpacks that as its /var/lib/docker, where
the dockerd the plugin starts in the guest finds them (both run the host's dockerd binary, the
guest sharing the host's root; it reads the overlay2 store it finds). The private dockerd shares
nothing with the host's engine: its own data root, exec root, socket, pid file and config (trust
key in it), containerd namespaces of its own should it find a system containerd, no bridge,
iptables or IP forwarding (it runs no container), and it dies with the thread that started it.
Everything is built in a root-only directory of its own and only the finished tarball is moved into
the guest's writable directory.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
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
    root and write it to `tar` (its dockerd's log beside it); DataRootFailed naming the step that
    failed."""
    import docker
    work = Path(tempfile.mkdtemp(prefix="agentcgroup-dataroot-"))
    root, log = work / "root", work / "dockerd.log"
    try:
        root.mkdir()
        with private_dockerd(root, log=log, timeout_s=timeout_s) as client:
            try:
                client.images.load(engine.client.images.get(name).save(named=True))
                client.images.get(name)
            except docker.errors.DockerException as exc:
                raise DataRootFailed(f"the host's private dockerd could not load {name}: {exc}") from None
        tarred = subprocess.run(["tar", "-C", str(root), "--xattrs", "--xattrs-include=*", "-cf",
                                 str(work / "root.tar"), *KEPT], capture_output=True, text=True)
        if tarred.returncode != 0:
            raise DataRootFailed(f"tar of the data root failed ({tarred.returncode}): {tarred.stderr.strip()[-500:]}")
        shutil.move(work / "root.tar", tar)
    finally:
        if log.exists():
            shutil.copyfile(log, tar.with_name(tar.name + ".dockerd.log"))
        shutil.rmtree(work, ignore_errors=True)
    return tar


@contextlib.contextmanager
def private_dockerd(root: Path, *, log: Path, timeout_s: float = 300.0):
    """A dockerd of its own on the data root `root` (an existing directory), everything else in a
    new root-only directory, yielding a Docker SDK client of it; stopped, with the containerd it
    started, on the way out."""
    import docker
    dockerd = programs.require("dockerd", needed_by="the guest's Docker data root")
    run = Path(tempfile.mkdtemp(prefix="acg-dr-"))      # short: unix sockets live under it (108 bytes)
    try:
        config = run / "daemon.json"
        # the trust key dockerd 20.10 keeps is named in daemon.json only ("deprecated-key-path")
        config.write_text(json.dumps({"deprecated-key-path": str(run / "key.json")}) + "\n")
        namespace = f"agentcgroup-dataroot-{run.name}"
        with open(log, "ab") as fh:
            proc = subprocess.Popen(
                [dockerd, "--config-file", str(config), "--data-root", str(root), "--exec-root", str(run / "exec"),
                 "--pidfile", str(run / "dockerd.pid"), "--host", f"unix://{run / 'docker.sock'}",
                 "--containerd-namespace", namespace, "--containerd-plugins-namespace", namespace + "-plugins",
                 "--storage-driver", STORAGE_DRIVER, "--bridge=none", "--iptables=false", "--ip-masq=false",
                 "--ip-forward=false", "--exec-opt", "native.cgroupdriver=cgroupfs"],
                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_parent)
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


#: loaded before any fork: the child only calls it (no dynamic loading between fork and exec)
_LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child: SIGKILL when the thread that started it ends (a session that dies mid-load)."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _connect(docker, sock: Path, proc: subprocess.Popen, timeout_s: float, log: Path):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-5:])
            raise DataRootFailed(f"the host's private dockerd exited with {proc.returncode} (log {log}):\n{tail}")
        if sock.exists():
            try:                                # the SDK asks the server's API version on creation
                client = docker.DockerClient(base_url=f"unix://{sock}", timeout=10)
                client.api.timeout = 600        # a load of hundreds of MB on a loaded host
                return client
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
