"""The `docker` executor: a trace's steps run inside one container per trace, each step in its own
cgroup nested under the container's.

The container (Docker SDK, a real dockerd) runs only a long-lived init (INIT: a shell that reaps
every process orphaned into the container and never exits). Each step
is `nsenter -t <init> -m -u -i -n -p -w -- setpriv ... sh -c CMD`, started by our spawn, which joins
the step's cgroups *before* it execs: the step runs in the container's namespaces (its root file
system, no network, its PID namespace) but in a cgroup of its own, so every tool call is limited
and counted on its own, as under the other executors. `docker exec` cannot do that: runc puts the
exec'd process in the container's cgroup (and every exec is a round trip through dockerd and runc).

Where the container's cgroup is: the executor is given `cgroup_parent` (the test's workload cgroup,
relative to this session's own cgroups on hybrid, absolute on v2: see cgroups/container.py) and reports `init_pid`; the
cgroup layer reads where the init landed and nests the steps' cgroups there. Replay stays below
cgroups: this module knows paths only as strings.

Steps are hostile (commands from public datasets): no network (`network_mode="none"`), one
harmless capability for the init (INIT_CAP), each step with a reduced capability bounding set (Docker's default set
minus mknod, net_raw, audit_write, setfcap; no sys_admin: no mount, no cgroupfs) and no_new_privs;
/sys and the container's cgroupfs are read-only. The root file system is read-only for the local
image, whose writable places are tmpfs with a size (TMPFS_MB: the workspace 1 GiB, /tmp 512 MiB,
/root 256 MiB, the state dir 64 MiB), so a step that fills them gets ENOSPC and the memory they hold
(charged to the container's cgroup once a step's cgroup is gone) is bounded; for SWE-rebench images
it is writable (their repository lives in it) and bounded by nothing but the host's disk. Orphans a
step leaves are killed with its cgroup and reaped by INIT; `kill -9 -1` from a step reaches every
process of the container but INIT (pid 1 ignores it), so the next step still runs. A working
directory that is not a clean absolute path, and a command too long to pass to a program (over
128 KiB), are refused with the reason in the step's record (executors.StepRefused). The container
is removed when the trace ends, and the engine removes every container of the session at its end
(also after a failure or Ctrl-C).

A `seed` (base.Seed: the task's workspace and its Python environment, set before start) is copied
in before the first step, as a tar on the stdin of a `tar -x` run in the container like a step
(a tmpfs of its own where the root is read-only, TMPFS_MB "workspace" and "env"); the environment's
bin/ leads the steps' PATH. A recorded edit is applied like a step, by editor.py under the image's
/usr/bin/python3 (EDIT_PYTHON), its undo history in the state tmpfs.

Not as strict as `docker run`/`docker exec`: a step entered with nsenter gets no Docker seccomp
profile (Docker applies it only to what runc starts), and it runs as root of the host's user
namespace, with the capabilities above. Of that profile it gets the parts that matter most, from
the steps' seccomp guard (stepguard.py, installed before nsenter): no user namespaces (the profile
denies unshare/clone(CLONE_NEWUSER) without CAP_SYS_ADMIN) and no kernel keys (keyctl, add_key,
request_key fail with EPERM; the step starts in a new, empty session keyring, so neither the
session keyring pytest was started in nor host root's user keyring is reachable). It costs each
step a Python start (its time, and its memory charged to the step's cgroup until it execs nsenter:
a tiny step's peak is that). INIT holds a capability no step has (INIT_CAP), so no step can ptrace it or write its memory. The sandbox executor (bubblewrap, no capabilities at
all) is the stricter one; this one exists to run a task's own image.
"""
from __future__ import annotations

import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

from ...engines.docker import LOCAL_IMAGE, SESSION_LABEL, DockerEngine, swerebench_image, system_image
from ...errors import ExecutorUnavailable
from ...programs import require
from ...traces.ir import Step, Trace
from .base import (DEFAULT_TIMEOUT_S, EXECUTING_TOOLS, Launch, Seed, SeedFailed, StepRefused, check_command,
                   check_seed_places, edit_argv, guarded, inside, read_cwd, require_stepguard, step_cwd, step_script,
                   step_timeout, trace_home)

CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STEP_CAPS = "-all," + ",".join(f"+{c}" for c in (
    "chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
    "net_bind_service", "sys_chroot"))
STATE = "/run/agentcgroup"          # tmpfs in the container: a step's cwd, the edits' undo history
# tmpfs sizes (MiB) of the container's writable places; "home" is the trace's working directory,
# "workspace" and "env" a seed's (base.Seed) source and environment where they are elsewhere
TMPFS_MB = {"home": 1024, "/tmp": 512, "/root": 256, STATE: 64, "workspace": 1024, "env": 1024}
# the interpreter a recorded edit is applied with (editor.py), in the container
EDIT_PYTHON = "/usr/bin/python3"
# how a seed's directory gets into the container: a tar on stdin, unpacked where the steps see it
UNPACK = 'mkdir -p -- "$1" && exec tar -x -f - -C "$1"'
SEED_TIMEOUT_S = 600
# pid 1 of the container. It must reap (an orphan a step leaves is re-parented to it, and a zombie
# holds its pid, counted by pids.max, until reaped) and must never exit: `kill -9 -1` from a step
# kills every process of the PID namespace but pid 1, so Docker's own init (tini, `init=True`),
# which exits when its one child does, would take the container down with it. dash's `wait`
# blocks in wait3(), which reaps any child, re-parented orphans included; the sleep it waits on is
# restarted when a step kills it. Needs only /bin/sh and sleep, which every image has.
INIT = ["/bin/sh", "-c", "trap '' HUP INT TERM; while :; do sleep 2147483647 & wait; done"]
# A capability INIT holds and no step can ever have (STEP_CAPS' bounding set lacks it): the kernel
# lets a process ptrace (or open /proc/PID/mem of) a process of its own uid only when the target's
# permitted capabilities are a subset of its own, so no step can take INIT over — INIT lives in the
# container's cgroup, outside every step's limits, and outlives them. Harmless in INIT's hands.
INIT_CAP = "AUDIT_WRITE"


def instance_id(trace: Trace) -> str | None:
    """The SWE-style instance id a trace ran on (`<org>__<repo>-<n>`), if it says."""
    for key in ("instance_id", "task"):
        if isinstance(trace.source.get(key), str):
            return trace.source[key]
    last = trace.trace_id.rsplit("/", 1)[-1]
    return last if "__" in last else None


class DockerExecutor:
    """Replays a trace's executing steps in a container of `image` (default: the trace's SWE-rebench
    image when present locally, else the local bookworm image, built once when missing).

        engine = DockerEngine.acquire()              # or the `agentcgroup_docker` session fixture
        ex = DockerExecutor(engine, cgroup_parent="agentcgroup-123-456/tenant-b")
        ex.start(trace); ex.init_pid; ex.launch(step) -> Launch | None; ex.stop()
    """
    name = "docker"
    time_scale = 1.0            # real commands at real speed: time_scale is the emulator's only

    def __init__(self, engine: DockerEngine | None, *, cgroup_parent: str | None, image: str | None = None,
                 step_timeout_s: float = DEFAULT_TIMEOUT_S, pids_limit: int | None = None,
                 tmpfs_mb: dict[str, int] | None = None):
        if engine is None:
            raise ExecutorUnavailable("the docker executor needs a Docker engine (DockerEngine.acquire())")
        if not cgroup_parent:
            # Docker's default (/docker) would put the container beside this session's cgroup
            raise ValueError("DockerExecutor needs cgroup_parent: cgroups.container.cgroup_parent(tree, workload)")
        self.nsenter = require("nsenter", needed_by="the docker executor")
        require_stepguard("docker")
        self.engine, self.image, self.cgroup_parent = engine, image, cgroup_parent
        self.step_timeout_s, self.pids_limit = step_timeout_s, pids_limit
        self.tmpfs_mb = TMPFS_MB | (tmpfs_mb or {})      # keys as in TMPFS_MB
        self.container = None
        self.init_pid: int | None = None
        self.home = self.cwd = "/workspace"
        self.seed: Seed | None = None       # set before start: copied in before the first step
        self.edit_python = False            # the image has EDIT_PYTHON (known once started)

    def image_for(self, trace: Trace) -> str:
        iid = instance_id(trace)
        if iid and self.engine.has_image(swerebench_image(iid)):
            return swerebench_image(iid)
        return self.engine.ensure_image(LOCAL_IMAGE)

    def start(self, trace: Trace) -> None:
        image = self.image or self.image_for(trace)
        local = image == LOCAL_IMAGE      # nothing of the task inside: the workspace is a tmpfs
        if local and self.seed is not None and self.seed.system is not None:
            # the workspace's environment is its system root's python3's: that root is the image
            # (kept in self.image, which the records name)
            image = self.image = self.engine.ensure_image(system_image(self.seed.system), rootfs=self.seed.system)
        self.home = trace_home(trace)
        self.cwd = self.home
        # Docker mounts a tmpfs noexec by default; a step that writes a script (or a venv) and runs
        # it must be able to, as it could where the trace was recorded. Nothing runs from the state dir.
        mb, seeded, room = self.tmpfs_mb, self._seeded(), {}
        sizes = {"/tmp": mb["/tmp"], STATE: mb[STATE]}
        # the seed's places start empty, as under the sandbox (on a task's image too: a directory
        # given for it replaces the image's copy, not merges with it); then, on the local image's
        # read-only root, home and /root where not inside one
        for where, _, key in seeded:
            within = next((t for t in sizes if inside(where, t)), None)
            if within is None:
                sizes[where], within = mb[key], where
            room[where] = f"a {sizes[within]} MiB tmpfs"
        if local:
            sizes |= {p: mb[k] for p, k in ((self.home, "home"), ("/root", "/root"))
                      if not any(inside(p, t) for t in sizes)}
        tmpfs = {path: ("" if path == STATE else "exec,") + f"size={size}m" for path, size in sizes.items()}
        self.container = self.engine.client.containers.run(
            image, INIT, detach=True, network_mode="none", read_only=local,
            tmpfs=tmpfs, working_dir=self.home, cap_drop=["ALL"], cap_add=[INIT_CAP], security_opt=["no-new-privileges"],
            labels={SESSION_LABEL: self.engine.tag, "agentcgroup.trace": trace.trace_id[:200]},
            cgroup_parent=self.cgroup_parent, pids_limit=self.pids_limit, init=False, stop_signal="SIGKILL")
        try:
            self.container.reload()
            self.init_pid = int(self.container.attrs["State"]["Pid"])
            root = Path(f"/proc/{self.init_pid}/root")
            if not any((root / p).exists() for p in ("usr/bin/setpriv", "bin/setpriv")):
                raise ExecutorUnavailable(f"image {image} has no setpriv (util-linux), which the docker "
                                          "executor uses to drop a step's capabilities")
            (root / STATE.lstrip("/")).mkdir(exist_ok=True)
            self.edit_python = (root / EDIT_PYTHON.lstrip("/")).exists()
            for where, src, _ in seeded:
                self._unpack(src, where, room[where])
        except BaseException:
            self.stop()
            raise

    def _in_container(self, program: list[str]) -> list[str]:
        """argv running `program` in the container as a step runs: its namespaces, the steps' capability
        bounding set, no new privileges, under the steps' seccomp guard."""
        return guarded([self.nsenter, "-t", str(self.init_pid), "-m", "-u", "-i", "-n", "-p", "-w", "--",
                        "setpriv", "--no-new-privs", f"--bounding-set={STEP_CAPS}", "--inh-caps=-all", *program])

    def _seeded(self) -> list[tuple[str, Path, str]]:
        """(where the steps see it, the directory copied there, its TMPFS_MB key) of the seed;
        SeedFailed for a place the executor itself needs (base.check_seed_places)."""
        seed = self.seed
        if seed is None:
            return []
        check_seed_places(seed, "docker", (STATE, "/tmp"))
        return [(where, src, size) for where, src, size in ((seed.path, seed.source, "workspace"),
                                                             (seed.env_path, seed.env_source, "env"))
                if where and src is not None]

    def _unpack(self, src: Path, where: str, room: str) -> None:
        """Copy the directory `src` to `where` in the container, before any step: a tar of it (regular
        files, directories, symlinks as links, hard links; owned by root, the steps' uid) on the stdin
        of a `tar -x` run in the container as a step is, but outside the trace (nothing of it has run)."""
        argv = self._in_container(["/bin/sh", "-c", UNPACK, "sh", where])

        def plain(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
            if not (ti.isreg() or ti.isdir() or ti.issym() or ti.islnk()):
                return None
            ti.uid = ti.gid = 0
            ti.uname = ti.gname = "root"
            return ti

        why, rc = None, None
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=err,
                                    env={"PATH": CONTAINER_PATH}, cwd="/")
            # the deadline holds while we write too: a tar that stops reading is killed, the write fails
            fired = threading.Event()
            timer = threading.Timer(SEED_TIMEOUT_S, lambda: (fired.set(), proc.kill()))
            timer.start()
            try:
                try:
                    with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                        for entry in sorted(src.iterdir()):
                            tar.add(entry, arcname=entry.name, filter=plain)
                except (OSError, tarfile.TarError) as exc:     # EPIPE: tar in the container gave up (ENOSPC ...)
                    why = str(exc)
                finally:
                    try:
                        proc.stdin.close()
                    except OSError:
                        pass
                rc = proc.wait()
            finally:
                timer.cancel()
                if proc.poll() is None:          # an error of ours (or ^C) on the way: nothing left running
                    proc.kill()
                    proc.wait()
            if fired.is_set():
                why = f"killed after {SEED_TIMEOUT_S} s"
            err.seek(0)
            said = err.read().decode(errors="replace").strip()
        if rc != 0 or why:
            lines = said.splitlines()
            detail = "; ".join(lines[:3]) + (f" (and {len(lines) - 3} more lines)" if len(lines) > 3 else "")
            raise SeedFailed(f"the docker executor cannot copy {src} to {where} in its container ({room}; "
                             f"exit {rc}{', ' + why if why else ''}): {detail or 'no message'}")

    def stop(self) -> None:
        container, self.container, self.init_pid = self.container, None, None
        if container is not None:
            try:
                container.remove(force=True)
            except Exception:          # already gone; the engine's session cleanup is the backstop
                pass

    def _sync_cwd(self) -> None:
        if self.init_pid:
            self.cwd = read_cwd(f"{STATE}/cwd", root=f"/proc/{self.init_pid}/root") or self.cwd

    def launch(self, step: Step) -> Launch | None:
        self._sync_cwd()
        if step.tool == "edit":
            program = edit_argv(step, EDIT_PYTHON, f"{STATE}/undo")
            if program is None:
                return None
            if not self.edit_python:
                raise StepRefused(f"step {step.step_id}: the image has no {EDIT_PYTHON} to apply the recorded edit "
                                  f"of {step.args.get('path')!r} with; not applied")
        elif step.tool not in EXECUTING_TOOLS:
            return None
        else:
            check_command(step)
            if step.args.get("cwd"):
                self.cwd = step_cwd(step)
            program = ["/bin/sh", "-c", step_script(step.tool, f"{STATE}/cwd"), "sh", self.cwd, step.command]
        if self.init_pid is None:
            raise RuntimeError("DockerExecutor.launch() before start()")
        argv = self._in_container(program)
        timeout = step_timeout(step, self.step_timeout_s)
        env_bin = [f"{self.seed.env_path}/bin"] if self.seed is not None and self.seed.env_path else []
        return Launch(argv=argv, cwd="/", timeout_s=timeout, env={"PATH": ":".join([*env_bin, CONTAINER_PATH]),
                                                                  "HOME": self.home})
