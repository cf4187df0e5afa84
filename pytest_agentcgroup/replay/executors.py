"""How a step becomes a process: `emulate` reproduces its resource profile, `sandbox` runs its real
command under bubblewrap, as an unprivileged user. Both return an argv (or None for a step that
executes nothing) and keep the per-trace state an agent's runtime keeps between tool calls; a step
that cannot run as recorded (over-long command, unclean cwd) raises StepRefused, which the replayer
records as the step's error.
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..traces.ir import Step, Trace
from .spawn import start_ticks

EMULATOR = str(Path(__file__).with_name("emulator.py"))
EXECUTING_TOOLS = ("bash", "python")
DEFAULT_TIMEOUT_S = 120.0


class ExecutorUnavailable(RuntimeError):
    """The executor cannot run on this host; the message names what is missing."""


class StepRefused(ValueError):
    """This step cannot be run as recorded (e.g. a command longer than the kernel passes to a
    program, a working directory that is not a clean absolute path); the replayer records the
    message as the step's error, with the step not executed."""


@dataclass
class Launch:
    argv: list[str]
    cwd: str
    timeout_s: float
    env: dict = field(default_factory=dict)


class EmulateExecutor:
    """Every step with replay data runs the resource emulator; durations are scaled by time_scale.

    Memory peaks are not scaled: a limit means the same thing at any speed. A step without any
    replay data still runs (an empty emulation: the spawn and cgroup cost only), so every step of
    every arm is measured the same way.
    """
    name = "emulate"

    def __init__(self, *, time_scale: float = 1.0, step_timeout_s: float = DEFAULT_TIMEOUT_S):
        if not time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {time_scale}")
        self.time_scale = time_scale
        self.step_timeout_s = step_timeout_s
        self.workdir: str | None = None

    def start(self, trace: Trace) -> None:
        self.workdir = tempfile.mkdtemp(prefix="agentcgroup-emulate-")

    def stop(self) -> None:
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def launch(self, step: Step) -> Launch | None:
        p = step.profile
        val = lambda m: m.value if m is not None else 0.0      # noqa: E731
        s = self.time_scale
        duration = val(step.duration_ms) * s
        argv = [sys.executable, "-I", "-S", EMULATOR, str(int(val(p.peak_mb) * 1024 * 1024)),
                f"{val(p.ramp_ms) * s:.3f}", f"{val(p.cpu_ms) * s:.3f}", str(int(val(p.io_bytes))),
                f"{duration:.3f}", self.workdir or tempfile.gettempdir()]
        # The emulated step must never outlive its own (scaled) length by much: the timeout is the
        # trace's own timeout scaled, but at least the emulation plus a generous start-up margin.
        timeout = self.step_timeout_s
        if step.args.get("timeout_ms"):
            timeout = min(timeout, max(step.args["timeout_ms"] / 1000.0 * s, duration / 1000.0 + 10.0))
        return Launch(argv=argv, cwd=self.workdir or "/", timeout_s=timeout)


SANDBOX_TMPFS = "agentcgroup-ws"           # the source name of the sandbox's per-trace tmpfs
# its mount point: a temp directory named for the process that mounted it (pid + start ticks)
_SANDBOX_BASE = re.compile(r"^agentcgroup-sbx-(\d+)-(\d+)-")


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def sweep_stale_workspaces(mountinfo: str | Path = "/proc/self/mountinfo") -> list[str]:
    """Unmount (and remove) the sandbox tmpfs mounts whose owner is gone: a pytest SIGKILLed
    mid-trace never reaches SandboxExecutor.stop(), and its tmpfs (and whatever the steps left in
    it, in memory) would stay mounted. Ours: tmpfs of source SANDBOX_TMPFS at a directory named
    agentcgroup-sbx-<pid>-<start ticks>-*; gone: no process with that pid and start time. Mounts of
    live sessions are left alone. Returns the mount points removed."""
    removed = []
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return removed
    for line in lines:
        fields = line.split()
        try:
            sep = fields.index("-")
            point, fstype, source = _unescape_mountinfo(fields[4]), fields[sep + 1], fields[sep + 2]
        except (ValueError, IndexError):
            continue
        owner = _SANDBOX_BASE.match(os.path.basename(point))
        if fstype != "tmpfs" or source != SANDBOX_TMPFS or owner is None:
            continue
        if start_ticks(int(owner[1])) == int(owner[2]):
            continue                                   # its session still runs
        if subprocess.run(["umount", "--lazy", point], capture_output=True).returncode == 0:
            try:
                os.rmdir(point)
            except OSError:
                pass
            removed.append(point)
    return removed


class SandboxExecutor:
    """The step's real command under bubblewrap, as an unprivileged user.

    Commands come from public datasets, so they are hostile by default:
    - started as root, bwrap runs as `nobody` (setpriv: real and effective uid/gid 65534, no
      supplementary groups, empty capability sets and bounding set, no_new_privs) — the step has no
      capability anywhere, so it cannot remount the read-only /usr and /etc, mount a cgroupfs or
      proc, or write /proc/sys; it sees no /sys at all, and cannot make user namespaces of its own.
      The join into the step's cgroups happens before that, as root (spawn.py), so the step starts
      inside them and cannot leave them (no cgroupfs it could write). Without root, bwrap runs as
      the calling user (no capabilities either), but the workspace is then an unbounded directory;
    - the per-trace workspace (mounted at the trace's working directory) and the state directory
      live in one tmpfs of `workspace_mb` (default 1 GiB) that we mount per trace, so a step that
      fills it gets ENOSPC and nothing reaches the host's disk; its pages are charged to the memory
      cgroup of the step that wrote them. /tmp is a fresh tmpfs of `tmp_mb` (default 256 MiB);
    - no network (own network namespace with loopback only), own PID namespace (`kill -9 -1`
      reaches only the step's own processes), the session's own process group, killed with its
      parent, and a per-step timeout.
    The working directory carries across steps as in an agent's persistent shell: each step starts
    where the previous one ended (`cd` included).
    """
    name = "sandbox"
    STATE = "/.agentcgroup-state"
    # `nobody` needs no set-up on any Debian host or VM (base-passwd), owns no files on a normal
    # host, and the step sees none of the host's files anyway (only read-only /usr and /etc);
    # its own PID namespace keeps it from signalling other processes of that user.
    STEP_USER = "nobody"

    def __init__(self, *, step_timeout_s: float = DEFAULT_TIMEOUT_S, bwrap: str | None = None,
                 workspace_mb: int = 1024, tmp_mb: int = 256):
        self.bwrap = bwrap or shutil.which("bwrap")
        if not self.bwrap:
            raise ExecutorUnavailable("the sandbox executor needs bubblewrap (`bwrap`), which is not installed "
                                      "(Debian package bubblewrap; `make setup` installs it)")
        self.step_timeout_s = step_timeout_s
        self.workspace_mb, self.tmp_mb = workspace_mb, tmp_mb
        # as root: drop to STEP_USER (and bound the workspace); as anyone else: bwrap as that user
        self.as_root = os.geteuid() == 0
        self.setpriv = shutil.which("setpriv") if self.as_root else None
        if self.as_root and not self.setpriv:
            raise ExecutorUnavailable("the sandbox executor, run as root, needs setpriv (Debian package "
                                      "util-linux) to start bwrap as an unprivileged user")
        try:
            entry = pwd.getpwnam(self.STEP_USER)
            self.step_uid, self.step_gid = entry.pw_uid, entry.pw_gid
        except KeyError:
            self.step_uid = self.step_gid = 65534      # the kernel's overflow id, what nobody is on Debian
        self.base = self.workspace = self.state = None
        self.bounded = False            # True: workspace + state dir are our size-limited tmpfs
        self.home = "/workspace"
        self.cwd = self.home

    def start(self, trace: Trace) -> None:
        self.home = trace_home(trace)
        self.cwd = self.home
        if self.as_root:
            sweep_stale_workspaces()         # left by an earlier run that was killed mid-trace
        self.base = tempfile.mkdtemp(prefix=f"agentcgroup-sbx-{os.getpid()}-{start_ticks(os.getpid())}-")
        if self.as_root:
            # bwrap, as STEP_USER, must traverse base to bind ws and state: 0711, nothing listable
            os.chmod(self.base, 0o711)
            opts = f"size={int(self.workspace_mb)}m,mode=0711,nosuid,nodev"
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, SANDBOX_TMPFS, self.base],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                os.rmdir(self.base)
                self.base = None
                raise ExecutorUnavailable(f"the sandbox executor cannot mount its size-limited workspace "
                                          f"(tmpfs, {opts}): {done.stderr.strip() or done.returncode}")
            self.bounded = True
        self.workspace, self.state = os.path.join(self.base, "ws"), os.path.join(self.base, "state")
        for d in (self.workspace, self.state):
            os.mkdir(d, 0o700)
            if self.as_root:
                os.chown(d, self.step_uid, self.step_gid)

    def stop(self) -> None:
        self._sync_cwd()
        base, self.base, self.workspace, self.state = self.base, None, None, None
        if base is None:
            return
        if self.bounded:
            # The step's processes are gone (killed with their cgroup); detach anyway, so that
            # nothing a step left behind can keep the mount (and its memory) from going.
            subprocess.run(["umount", "--lazy", base], capture_output=True)
            self.bounded = False
            try:
                os.rmdir(base)
            except OSError:
                pass
        else:
            shutil.rmtree(base, ignore_errors=True)

    def _sync_cwd(self) -> None:
        # The wrapper writes the shell's final directory here; a killed step leaves the old one.
        if self.state:
            self.cwd = read_cwd("state/cwd", root=self.base) or self.cwd

    def launch(self, step: Step) -> Launch | None:
        self._sync_cwd()
        if step.tool not in EXECUTING_TOOLS:
            return None
        check_command(step)
        if step.args.get("cwd"):
            self.cwd = step_cwd(step)
        script = step_script(step.tool, f"{self.STATE}/cwd")
        drop = ([self.setpriv, f"--reuid={self.step_uid}", f"--regid={self.step_gid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"] if self.as_root else [])
        argv = [*drop, self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                "--die-with-parent", "--new-session",
                "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
                *(a for d in ("bin", "lib", "lib64", "sbin") for a in self._root_link(d)),
                "--proc", "/proc", "--dev", "/dev", "--size", str(int(self.tmp_mb) * 1024 * 1024), "--tmpfs", "/tmp",
                "--bind", self.workspace, self.home, "--bind", self.state, self.STATE,
                "--chdir", self.home, "--setenv", "HOME", self.home, "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
                "--", "/bin/sh", "-c", script, "sh", self.cwd, step.command]
        timeout = step_timeout(step, self.step_timeout_s)
        return Launch(argv=argv, cwd="/", timeout_s=timeout, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})

    @staticmethod
    def _root_link(name: str) -> list[str]:
        path = Path("/") / name
        if path.is_symlink():
            return ["--symlink", os.readlink(path), f"/{name}"]
        return ["--ro-bind", str(path), f"/{name}"] if path.exists() else []


PATH_MAX = 4096
# The kernel copies at most MAX_ARG_STRLEN bytes (32 pages, NUL included) of any one argv string
# into a new program; the command is one (the shell's `-c` argument), so longer cannot start.
MAX_ARG_STRLEN = 32 * 4096


def clean_path(path) -> str | None:
    """`path` if it is a clean absolute path (no `.`/`..`/`//` parts, no NUL or newline, at most
    PATH_MAX bytes), else None. A trace's cwd reaches bwrap and Docker's API as a mount point and a
    working directory: anything else there is refused rather than interpreted."""
    if (not isinstance(path, str) or not path.startswith("/") or "\0" in path or "\n" in path
            or len(path.encode("utf-8", "surrogateescape")) > PATH_MAX or os.path.normpath(path) != path
            or path.startswith("//")):
        return None
    return path


def trace_home(trace: Trace) -> str:
    """Where the trace's work happens: its first clean absolute working directory (not `/`), else
    /workspace. A step whose own cwd is not clean is refused when it is launched (step_cwd)."""
    first = next((c for c in (s.args.get("cwd") for s in trace.steps) if clean_path(c) not in (None, "/")), None)
    return first or "/workspace"


def step_cwd(step: Step) -> str:
    """The step's recorded working directory, or StepRefused naming why it cannot be used."""
    cwd = step.args["cwd"]
    if clean_path(cwd) is None:
        shown = repr(cwd) if len(repr(cwd)) <= 80 else repr(cwd)[:77] + "..."
        raise StepRefused(f"step {step.step_id}: args.cwd {shown} is not a clean absolute path "
                          "(absolute, no '.'/'..'/'//' parts, no NUL or newline, at most 4096 bytes)")
    return cwd


def check_command(step: Step) -> None:
    """StepRefused for a command no program could be started with (too long for one argv string, or
    containing a NUL byte), instead of a start that fails somewhere inside (exit 126, E2BIG)."""
    cmd = step.command
    if not isinstance(cmd, str):
        raise StepRefused(f"step {step.step_id}: {step.tool} step without a command string")
    size = len(cmd.encode("utf-8", "surrogateescape")) + 1
    if size > MAX_ARG_STRLEN:
        raise StepRefused(f"step {step.step_id}: command of {size - 1} bytes is longer than the kernel passes "
                          f"to a program in one argument (MAX_ARG_STRLEN {MAX_ARG_STRLEN} bytes with its NUL); "
                          "not executed")
    if "\0" in cmd:
        raise StepRefused(f"step {step.step_id}: command contains a NUL byte, which no argv can carry; not executed")


def step_timeout(step: Step, default_s: float) -> float:
    """The executor's step timeout, shortened to the step's own where the trace recorded one."""
    return min(default_s, step.args["timeout_ms"] / 1000.0) if step.args.get("timeout_ms") else default_s


def step_script(tool: str, cwd_file: str) -> str:
    """The `sh -c` script of one executing step, run as `sh -c SCRIPT sh CWD COMMAND`: start in the
    directory the previous step ended in, run the command, write where it ended to `cwd_file`."""
    if tool == "bash":
        body = 'cd "$1" 2>/dev/null; eval "$2"'
    else:   # an interpreter step: the code runs in a fresh python3 (an IPython kernel's state is not kept)
        body = 'cd "$1" 2>/dev/null; python3 -c "$2"'
    return body + f'; rc=$?; pwd > {cwd_file}; exit $rc'


CWD_MAX_BYTES = PATH_MAX    # more is not a directory a shell printed


def _open_beneath(root: Path, parts: tuple[str, ...]) -> int:
    """A directory fd of ROOT/parts..., each component opened without following a symlink (and
    without '..'): a hostile step that made any of them a symlink (to a host path: resolved from
    /proc/PID/root, an absolute link target is the host's) gets OSError, not the host's file."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            if part in ("", ".", ".."):
                raise OSError(f"refusing path component {part!r}")
            nfd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_cwd(cwd_file: str | Path, *, root: str | Path | None = None) -> str | None:
    """The directory a step's shell ended in (written by step_script), consumed; None if absent.

    `root`: the tree the step can write (a container's /proc/PID/root, the sandbox's base), with
    `cwd_file` a path inside it; without it, cwd_file's directory is trusted and only the file is not.
    The step can write that file and every directory of the tree, and the step is hostile: it could
    leave a FIFO (a read would block forever), a symlink to /dev/zero or to a host file — as the
    file or in place of a directory on the way to it (read through a bind mount or /proc/PID/root,
    an absolute link resolves on the host) — or gigabytes. So: no symlink followed in any component,
    no blocking open, a regular file only, a bounded read, and the file is removed (in the directory
    reached that way) whatever it was."""
    path = Path(cwd_file)
    if root is None:
        top, parts = path.parent, ()
    else:
        top, parts = Path(root), path.parent.relative_to(path.anchor).parts if path.is_absolute() else path.parent.parts
    try:
        dfd = _open_beneath(top, parts)
    except OSError:
        return None
    fd = None
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        cwd = os.read(fd, CWD_MAX_BYTES + 1).decode("utf-8", "replace").strip()
    finally:
        if fd is not None:
            os.close(fd)
        try:
            os.unlink(path.name, dir_fd=dfd)
        except OSError:
            pass
        os.close(dfd)
    return cwd if cwd.startswith("/") and len(cwd) <= CWD_MAX_BYTES and "\n" not in cwd else None


def make_executor(name: str, *, time_scale: float, step_timeout_s: float, engine=None, cgroup_parent: str | None = None):
    """emulate | sandbox | docker (the docker executor needs an `engine`: replay.docker_engine.DockerEngine)."""
    if name == "emulate":
        return EmulateExecutor(time_scale=time_scale, step_timeout_s=step_timeout_s)
    if name == "sandbox":
        return SandboxExecutor(step_timeout_s=step_timeout_s)
    if name == "docker":
        from .docker_executor import DockerExecutor
        return DockerExecutor(engine, cgroup_parent=cgroup_parent, step_timeout_s=step_timeout_s)
    raise ValueError(f"unknown executor {name!r}; expected emulate, sandbox or docker")
