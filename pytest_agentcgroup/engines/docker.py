"""A Docker engine to run containers in: the one already running, or a `dockerd` we start and stop.

`DockerEngine.acquire()` connects to the engine at DOCKER_HOST (default /var/run/docker.sock). When
none answers it starts Debian's `dockerd` in the background (own session, own log file, no bridge,
no iptables rules: our containers have no network) and waits for its socket. Sessions that use an
engine register themselves in /run/agentcgroup-dockerd/users/; the last one to leave stops the
dockerd that one of them started, so concurrent sessions (xdist workers, two pytest runs) share it
and nothing we started outlives us. A dockerd started by someone else is never stopped.

Every acquisition has a tag of its own, `<pid>-<start ticks>-<n>`: it names the users/ file and labels
the containers made through it (`agentcgroup.session=<tag>`). `release()` removes its own, and
`acquire()` removes those of processes that no longer exist (a run killed with SIGKILL). The tag is
per acquisition, not per process, because one process may hold two at once (a session's engine and
a test that acquires and releases one in the same pytest process): releasing the second must
neither unregister the first nor remove its containers.

`ensure_image()` gives the image steps run in when no SWE-rebench image is present: a Debian
bookworm minbase root file system with python3, made by `debootstrap` from the Debian mirror the
host's apt uses (apt_sources.py) and `docker import`ed, so no image registry is needed. It is built
once and then reused (building it takes minutes). `remove_project_images()` removes it and every other
agentcgroup/... image (`agentcgroup images clean`, run by CI so that every run builds it anew).
"""
from __future__ import annotations

import fcntl
import itertools
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

from ..errors import ExecutorUnavailable
from ..proc import SpawnError, start, start_ticks
from ..programs import require, which
from .rootfs import DebootstrapFailed, debootstrap, prune_for_image

# Every image this project makes is named agentcgroup/<name>:<tag>; `remove_images()` removes them
# all. AGENTCGROUP_LOCAL_IMAGE names another tag for the local image (a throw-away build to test it).
IMAGE_NAMESPACE = "agentcgroup/"
#: the tag says what is in the image: a new one when its content changes (2: pruned, rootfs.prune_for_image),
#: since an image of the tag, once built, is reused
LOCAL_IMAGE = os.environ.get("AGENTCGROUP_LOCAL_IMAGE") or "agentcgroup/bookworm-python:2"
SESSION_LABEL = "agentcgroup.session"
STATE_DIR = Path("/run/agentcgroup-dockerd")


def session_tag(pid: int | None = None) -> str | None:
    """`<pid>-<start ticks>`: names a process unambiguously (pid reuse guard); None if it is gone."""
    pid = os.getpid() if pid is None else pid
    ticks = start_ticks(pid)
    return None if ticks is None else f"{pid}-{ticks}"


_acquisitions = itertools.count()


def _alive(tag: str) -> bool:
    """Whether the process an acquisition tag (`<pid>-<ticks>-<n>`, or a process tag) names still runs."""
    pid, ticks = (tag.split("-") + ["", ""])[:2]
    return pid.isdigit() and session_tag(int(pid)) == f"{pid}-{ticks}"


class DockerEngine:
    """A connected Docker SDK client plus what we must undo when done."""

    def __init__(self, client, state_dir: Path = STATE_DIR):
        self.client = client
        self.tag = f"{session_tag()}-{next(_acquisitions)}"     # this acquisition's (module docstring)
        self.state_dir = state_dir

    # -- acquire / release -----------------------------------------------------------------------
    @classmethod
    def acquire(cls, *, start: bool = True, timeout_s: float = 60.0, state_dir: Path = STATE_DIR,
                join: Sequence[str] = ()) -> "DockerEngine":
        """Connect to a running engine, or start dockerd (in the cgroups whose cgroup.procs files
        `join` names, if any: an isolated xdist worker's own cpuset is not the place for an engine all
        workers share). Raises ExecutorUnavailable naming what is missing (the SDK, dockerd, the
        permission to start it, or the engine not coming up)."""
        try:
            import docker
        except ImportError:
            raise ExecutorUnavailable("the docker executor needs the Docker SDK for Python "
                                      "(pip install 'pytest-agentcgroup[docker]')") from None
        with _Lock(state_dir):
            client = _connect(docker)
            if client is None:
                if not start:
                    raise ExecutorUnavailable("no Docker engine is reachable (DOCKER_HOST or /var/run/docker.sock)")
                _start_dockerd(docker, state_dir, timeout_s, join)
                client = _connect(docker)
            engine = cls(client, state_dir)
            (state_dir / "users").mkdir(parents=True, exist_ok=True)
            (state_dir / "users" / engine.tag).touch()
        try:
            engine.remove_containers(stale_only=True)
        except BaseException:
            try:                                    # unregistered again (and dockerd stopped if ours alone);
                engine.release(state_dir=state_dir)
            except Exception:
                pass                                # what went wrong first is what the caller hears
            raise
        return engine

    def release(self, *, state_dir: Path = STATE_DIR) -> None:
        """Remove our containers; stop the dockerd we (or an earlier session) started when no live
        session uses it any more."""
        try:
            self.remove_containers()
        finally:
            self.client.close()
            with _Lock(state_dir):
                users = state_dir / "users"
                (users / self.tag).unlink(missing_ok=True)
                left = []
                for user in users.iterdir() if users.is_dir() else ():
                    if _alive(user.name):
                        left.append(user.name)
                    else:
                        user.unlink(missing_ok=True)     # a session killed before it could leave
                pidfile = state_dir / "dockerd.pid"
                if not left and pidfile.exists():
                    _stop_dockerd(pidfile)

    def remove_containers(self, *, stale_only: bool = False) -> list[str]:
        """Remove (force) our session's containers, or with stale_only those of dead sessions."""
        removed = []
        for c in self.client.containers.list(all=True, filters={"label": SESSION_LABEL}):
            owner = c.labels.get(SESSION_LABEL, "")
            if (owner != self.tag and _alive(owner)) or (stale_only and owner == self.tag):
                continue
            try:
                c.remove(force=True)
                removed.append(c.id)
            except Exception:        # already gone (docker.errors.NotFound, APIError 409 removal in progress)
                pass
        return removed

    # -- images ----------------------------------------------------------------------------------
    def has_image(self, name: str) -> bool:
        import docker
        try:
            self.client.images.get(name)
            return True
        except docker.errors.ImageNotFound:
            return False

    def project_images(self) -> list[str]:
        """The tags of every image this project made (named agentcgroup/...) present in the engine."""
        # one listing call: the SDK's images.list() then inspects each image, and one that another
        # session removes meanwhile would raise NotFound
        return sorted(t for img in self.client.api.images() for t in img.get("RepoTags") or ()
                      if t.startswith(IMAGE_NAMESPACE))

    def remove_images(self, names: Sequence[str] | None = None) -> list[str]:
        """Remove the named images (default: `project_images()` and LOCAL_IMAGE); those absent are
        skipped. Returns the tags removed. An image a container still uses is not forced away:
        ExecutorUnavailable names it and the container."""
        import docker
        removed = []
        if names is None:
            names = sorted(set(self.project_images()) | {LOCAL_IMAGE})
        for name in names:
            try:
                self.client.images.remove(name)
                removed.append(name)
            except docker.errors.ImageNotFound:
                pass
            except docker.errors.APIError as exc:     # 409: a container (running or not) uses it
                raise ExecutorUnavailable(f"cannot remove image {name}: {exc.explanation or exc}") from None
        return removed

    def ensure_image(self, name: str = LOCAL_IMAGE, *, mirror: str | None = None, rootfs: Path | None = None) -> str:
        """The local bookworm+python3 image, built with debootstrap + docker import when missing,
        from `mirror` or else the Debian mirror the host's apt is configured with (pruned of apt's
        lists, docs and translations: rootfs.prune_for_image). `rootfs`: import that root file
        system instead (a workspace's system root, workspaces/roots.py)."""
        if self.has_image(name):
            return name
        # One build per image at a time: sessions (xdist workers) that find it missing together
        # wait for the first one's build instead of each running debootstrap and importing a copy.
        with _Lock(self.state_dir, image_lock_file(name)):
            if self.has_image(name):
                return name
            if rootfs is not None:
                return self._import(name, rootfs)
            return self._build_image(name, mirror)

    def _build_image(self, name: str, mirror: str | None) -> str:
        with tempfile.TemporaryDirectory(prefix="agentcgroup-rootfs-") as tmp:
            rootfs = Path(tmp) / "rootfs"
            try:
                debootstrap(rootfs, suite="bookworm", include=["python3"], mirror=mirror)
            except DebootstrapFailed as exc:
                raise ExecutorUnavailable(f"image {name} is missing and cannot be built: {exc}") from None
            prune_for_image(rootfs)
            return self._import(name, rootfs)

    def _import(self, name: str, rootfs: Path) -> str:
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            # the low-level API: the SDK's high-level `images` collection has no import
            self.client.api.import_image(src=tar.stdout, stream_src=True, repository=name.split(":")[0],
                                         tag=name.split(":")[1] if ":" in name else "latest",
                                         changes=['CMD ["/bin/sh"]'])
        finally:
            tar.stdout.close()
            rc = tar.wait()
        if rc != 0 and self.has_image(name):         # a partial tar must not stand as the image
            self.remove_images([name])
        if rc != 0 or not self.has_image(name):
            raise ExecutorUnavailable(f"docker import of the root file system {rootfs} did not produce {name}"
                                      + (f" (tar exited {rc})" if rc else ""))
        return name


def system_image(root: Path) -> str:
    """The image a workspace's system root (<cache>/.../roots/<system>/root, workspaces/roots.py)
    is imported as: agentcgroup/<system>:1."""
    return f"{IMAGE_NAMESPACE}{root.parent.name}:1"


def image_lock_file(name: str) -> str:
    """The lock file (in the state directory) a build of image `name` holds."""
    return "image-" + re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".lock"


def remove_project_images(names: Sequence[str] | None = None, *, state_dir: Path = STATE_DIR) -> list[str]:
    """`remove_images(names)` in an engine acquired for it: dockerd is started when none answers and
    stopped again after (unless another session uses it). Without dockerd installed there can be no
    image to remove: returns []."""
    if which("dockerd") is None and _connect_quietly() is None:
        return []
    engine = DockerEngine.acquire(state_dir=state_dir)     # says so when the Docker SDK is missing
    import docker
    try:
        return engine.remove_images(names)
    except docker.errors.DockerException as exc:       # the engine failing under us: said, not a traceback
        raise ExecutorUnavailable(f"docker: {exc}") from None
    finally:
        engine.release(state_dir=state_dir)


def _connect_quietly():
    try:
        import docker
    except ImportError:
        return None
    client = _connect(docker)
    if client is not None:
        client.close()
    return client


def swerebench_image(instance_id: str) -> str:
    """SWE-rebench's image name for an instance id `<org>__<repo>-<n>`."""
    org, _, rest = instance_id.partition("__")
    return f"swerebench/sweb.eval.x86_64.{org}_1776_{rest}".lower()


# ---------------------------------------------------------------------------------------------

class _Lock:
    """An exclusive flock on STATE_DIR/lock: one session at a time starts, joins or stops dockerd
    (or, on another file, builds an image)."""

    def __init__(self, state_dir: Path, filename: str = "lock"):
        self.state_dir, self.filename = state_dir, filename

    def __enter__(self):
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.state_dir / self.filename, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except PermissionError:
            raise ExecutorUnavailable(f"cannot write {self.state_dir} (starting or sharing dockerd needs root)") from None
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)


def _connect(docker):
    try:
        client = docker.from_env(timeout=30)
        client.ping()
        return client
    except Exception:
        return None


def _start_dockerd(docker, state_dir: Path, timeout_s: float, join: Sequence[str]) -> None:
    dockerd = require("dockerd", needed_by="no Docker engine is reachable, and starting one")
    if os.geteuid() != 0:
        raise ExecutorUnavailable("no Docker engine is reachable, and starting dockerd needs root")
    log = str(state_dir / "dockerd.log")
    with open(log, "ab") as fh:
        # Own session (proc.start): a Ctrl-C at the terminal must not take dockerd down before we
        # have removed our containers. dockerd runs in our cgroups (or those `join` names: the
        # session's own, outside an isolated worker's cpuset), so a relative --cgroup-parent given to
        # a container is relative to this session's cgroups (see cgroups/container.py).
        try:
            # cgroupfs driver: on a systemd host with cgroup v2 dockerd would pick systemd's, which
            # only accepts a `*.slice` cgroup parent, not our relative path (the v1 default already)
            proc = start([dockerd, "--bridge=none", "--iptables=false", "--ip-masq=false",
                           "--exec-opt", "native.cgroupdriver=cgroupfs"],
                          join=join, stdout=fh, stderr=subprocess.STDOUT)
        except SpawnError as exc:
            raise ExecutorUnavailable(f"dockerd: {exc}") from None
    (state_dir / "dockerd.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                (state_dir / "dockerd.pid").unlink(missing_ok=True)
                tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-5:])
                raise ExecutorUnavailable(f"dockerd exited with {proc.returncode} while starting (log {log}):\n{tail}")
            if _connect(docker) is not None:
                return
            time.sleep(0.2)
        raise ExecutorUnavailable(f"dockerd did not answer within {timeout_s:.0f} s (log {log})")
    except BaseException:             # also Ctrl-C while it starts: it runs in its own session
        _stop_dockerd(state_dir / "dockerd.pid")
        raise


def _stop_dockerd(pidfile: Path, timeout_s: float = 20.0) -> None:
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pidfile.unlink(missing_ok=True)
        return
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = ""
    if os.path.basename(exe).startswith("dockerd"):
        os.kill(pid, signal.SIGTERM)        # dockerd stops its containerd and shims on SIGTERM
        deadline = time.monotonic() + timeout_s
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            try:                            # reap it if it is our child
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.05)
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
