"""How a step becomes a process: `emulate` reproduces its resource profile, `sandbox` runs its real
command under bubblewrap. Both return an argv (or None for a step that executes nothing) and keep
the per-trace state an agent's runtime keeps between tool calls.
"""
from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..traces.ir import Step, Trace

EMULATOR = str(Path(__file__).with_name("emulator.py"))
EXECUTING_TOOLS = ("bash", "python")
DEFAULT_TIMEOUT_S = 120.0


class ExecutorUnavailable(RuntimeError):
    """The executor cannot run on this host; the message names what is missing."""


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


class SandboxExecutor:
    """The step's real command under bubblewrap.

    Commands come from public datasets, so they are hostile by default: read-only system
    directories (/usr, /etc), a fresh /tmp, a per-trace writable workspace mounted at the trace's
    working directory, no network (own network namespace with loopback only), own PID namespace,
    the session's own process group, killed with its parent, and a per-step timeout. The working
    directory carries across steps as in an agent's persistent shell: each step starts where the
    previous one ended (`cd` included).
    """
    name = "sandbox"
    STATE = "/.agentcgroup-state"

    def __init__(self, *, step_timeout_s: float = DEFAULT_TIMEOUT_S, bwrap: str | None = None):
        self.bwrap = bwrap or shutil.which("bwrap")
        if not self.bwrap:
            raise ExecutorUnavailable("the sandbox executor needs bubblewrap (`bwrap`), which is not installed "
                                      "(Debian package bubblewrap; `make setup` installs it)")
        self.step_timeout_s = step_timeout_s
        self.workspace = self.state = None
        self.home = "/workspace"
        self.cwd = self.home

    def start(self, trace: Trace) -> None:
        self.home = trace_home(trace)
        self.cwd = self.home
        self.workspace = tempfile.mkdtemp(prefix="agentcgroup-ws-")
        self.state = tempfile.mkdtemp(prefix="agentcgroup-state-")

    def stop(self) -> None:
        self._sync_cwd()
        for d in (self.workspace, self.state):
            if d:
                shutil.rmtree(d, ignore_errors=True)
        self.workspace = self.state = None

    def _sync_cwd(self) -> None:
        # The wrapper writes the shell's final directory here; a killed step leaves the old one.
        if self.state:
            self.cwd = read_cwd(Path(self.state, "cwd")) or self.cwd

    def launch(self, step: Step) -> Launch | None:
        self._sync_cwd()
        if step.tool not in EXECUTING_TOOLS:
            return None
        if step.args.get("cwd"):
            self.cwd = step.args["cwd"]
        script = step_script(step.tool, f"{self.STATE}/cwd")
        argv = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session",
                "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
                *(a for d in ("bin", "lib", "lib64", "sbin") for a in self._root_link(d)),
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
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


def trace_home(trace: Trace) -> str:
    """Where the trace's work happens: its first absolute working directory, else /workspace."""
    first = next((s.args.get("cwd") for s in trace.steps if s.args.get("cwd")), None)
    return first if first and first.startswith("/") and first != "/" else "/workspace"


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


CWD_MAX_BYTES = 4096        # PATH_MAX: more is not a directory a shell printed


def read_cwd(cwd_file: Path) -> str | None:
    """The directory a step's shell ended in (written by step_script), consumed; None if absent.

    The step can write that file too, and the step is hostile: it could leave a FIFO (a read would
    block forever), a symlink to /dev/zero or to a host file (read through a bind mount or
    /proc/PID/root, it would resolve on the host), or gigabytes. So: no symlink followed, no
    blocking open, a regular file only, a bounded read, and the file is removed whatever it was."""
    try:
        fd = os.open(cwd_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        fd = None
    try:
        if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        cwd = os.read(fd, CWD_MAX_BYTES + 1).decode("utf-8", "replace").strip()
    finally:
        if fd is not None:
            os.close(fd)
        try:
            cwd_file.unlink()
        except OSError:
            pass
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
