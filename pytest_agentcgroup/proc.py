"""Start one step's process inside its cgroups and wait for it.

The child writes "0" into each cgroup.procs file *before* it execs, so the program starts and
allocates inside its cgroups from its first instruction: there is no window where it runs in the
parent's cgroup (as there is when a process is moved after fork). Both layouts accept "0" as "the
writing process".

A `Parked` shell does the same ahead of time: started, joined to its cgroups and in its own session
before the step is known, it waits for `run(argv, join=parked)` to send it the step, and then only
has to exec. The fork from a large Python process (most of a spawn's cost: the join must run
between fork and exec, which rules out vfork) and the joins are then off the step's critical path
(cgroups/pool.py prepares them between steps).

A low-level module: it imports nothing from the package, and cgroups/ (tree, pool), replay/,
tenants/ and engines/ all use it, so that no cgroup code has to import replay/ to start a process.
"""
from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class ProcessResult:
    exit_code: int | None      # exit status when it exited normally
    signal: int | None         # the signal that ended it, when one did
    wall_ms: float             # from just before fork to just after reaping
    timed_out: bool
    user_ms: float             # rusage of the process and the children it waited for
    sys_ms: float
    output: bytes | None = None    # the head of its stdout and stderr (run's output_head), where kept


def start_ticks(pid: int) -> int | None:
    """Process start time in clock ticks since boot (field 22 of /proc/PID/stat): with the pid it
    names a process unambiguously (pid reuse guard). None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


class SpawnError(RuntimeError):
    """The step's program could not be started (not found, not executable, cgroup join refused)."""


def _joiner(files: Sequence[str]) -> Callable[[], None]:
    encoded = [os.fsencode(f) for f in files]

    def join() -> None:          # runs in the child between fork and exec: syscalls only
        for f in encoded:
            fd = os.open(f, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        os.setsid()              # own session: a timeout can signal the whole group
    return join


def start(argv: Sequence[str], *, join: Sequence[str] = (), cwd: str | None = None, env: dict | None = None,
          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) -> subprocess.Popen:
    """Start argv inside the cgroups `join` names (joined before exec), in its own session; the
    caller waits for it. For long-lived processes that talk to their parent (the browser tenant)."""
    try:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=stdout, stderr=stderr,
                                preexec_fn=_joiner(join), close_fds=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SpawnError(f"cannot start {argv[0]!r}: {exc}") from None


class Parked:
    """A small shell started ahead of its step, already in the step's cgroups and its own session,
    blocked reading its stdin until `run(argv, join=parked)` sends it the step as a shell script
    (environment, directory, `exec argv`), so that on the critical path there is only a pipe write
    and an exec from a tiny process. The step's stdin is /dev/null; its stdout and stderr are one
    pipe, which `run` reads (keeping the head, discarding the rest). `discard()` ends it unused."""

    # out of the caller's directory, join (as the step would: before the step's program starts),
    # say so on stdout, then read and run the step with its stderr on the same pipe as its stdout
    SCRIPT = 'cd / || exit 126; for f do echo 0 > "$f" || exit 125; done; echo; exec 2>&1; . /dev/stdin'
    READY_S = 10.0              # a shell that has not joined by then is broken, not slow

    def __init__(self, join: Sequence[str] = ()):
        # it starts with this process's environment: the common case (a step inheriting it) then
        # costs no script lines; a step with its own environment unsets and exports the difference
        self.env = {k: v for k, v in os.environ.items() if _SHELL_NAME.fullmatch(k)}
        self.proc = _Shell(["sh", "-c", self.SCRIPT, "sh", *join], self.env)
        self.pid = self.proc.pid
        # Wait until it has joined and is about to block on its stdin: a step handed over earlier
        # would pay the rest of the shell's start-up on its own critical path. A shell that never
        # gets there is discarded; its step then fails to start with the reason (start()).
        self.broken: str | None = None
        try:
            ready, _, _ = select.select([self.proc.stdout], [], [], self.READY_S)
            said = os.read(self.proc.stdout.fileno(), 1) if ready else b""
        except BaseException:
            self.proc.stdout.close()
            raise
        if said != b"\n":
            self.discard()
            self.broken = (f"did not start within {self.READY_S:g} s" if not ready else
                           f"could not join its cgroups ({', '.join(join)})" if self.proc.returncode == 125 else
                           f"exited with status {self.proc.returncode}")

    def start(self, argv: Sequence[str], cwd: str | None, env: dict | None, *, output: bool = True) -> None:
        """Hand it the step; `output`: the step's stdout and stderr on the pipe, else /dev/null."""
        if self.broken:
            raise SpawnError(f"cannot start {argv[0]!r}: the parked shell {self.broken}")
        path = (os.environ if env is None else env).get("PATH", os.defpath)
        prog = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=path)
        if not prog or os.path.isabs(prog) and (not os.access(prog, os.X_OK) or os.path.isdir(prog)):
            self.discard()
            raise SpawnError(f"cannot start {argv[0]!r}: no such executable")
        lines = []
        if env is not None:
            gone = [k for k in self.env if k not in env]
            lines = [f"unset {' '.join(gone)}"] if gone else []
            lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()
                      if self.env.get(k) != v and _SHELL_NAME.fullmatch(k)]
        if cwd:
            lines.append(f"cd -- {shlex.quote(cwd)} || exit 127")
        lines.append(f"exec {shlex.join([prog, *argv[1:]])} </dev/null" + ("\n" if output else " >/dev/null 2>&1\n"))
        try:
            os.write(self.proc.stdin.fileno(), "\n".join(lines).encode())
        except OSError as exc:                # it died while parked (killed with its cgroup)
            self.discard()
            raise SpawnError(f"cannot start {argv[0]!r}: the parked shell is gone ({exc.strerror})") from None
        self.proc.stdin.close()

    def discard(self) -> None:
        if not self.proc.stdin.closed:
            self.proc.stdin.close()           # EOF: an empty script, it exits by itself
        if not self.proc.stdout.closed:
            self.proc.stdout.close()
        if self.proc.returncode is None:
            self.proc.kill()
            self.proc.wait()


_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Shell:
    """/bin/sh started with posix_spawn in a session of its own, its stdin and stdout pipes to us,
    its stderr /dev/null, and no other descriptor of ours (those Python makes are close-on-exec;
    inheritable ones are closed for it): what Popen(..., start_new_session=True, close_fds=True)
    gives, for about half of Popen's own work in this process. The Popen attributes that Parked,
    run() and long-lived parked children (exp5's base memory) use: pid, stdin, stdout, returncode,
    wait(), poll(), kill()."""

    def __init__(self, argv: list[str], env: dict):
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        actions = [(os.POSIX_SPAWN_DUP2, r_in, 0), (os.POSIX_SPAWN_DUP2, w_out, 1),
                   (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)]
        for entry in os.scandir("/proc/self/fd"):
            fd = int(entry.name)
            try:
                if fd > 2 and os.get_inheritable(fd):
                    actions.append((os.POSIX_SPAWN_CLOSE, fd))
            except OSError:                  # the scan's own descriptor, gone by now
                pass
        try:
            # SIGPIPE and SIGXFSZ back to their defaults, as Popen's restore_signals does: Python
            # ignores them, and an ignored signal stays ignored across exec, into the step
            self.pid = os.posix_spawn("/bin/sh", argv, env, file_actions=actions, setsid=True,
                                      setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
        except BaseException:
            for fd in (w_in, r_out):
                os.close(fd)
            raise
        finally:
            for fd in (r_in, w_out):
                os.close(fd)
        self.stdin, self.stdout = open(w_in, "wb", buffering=0), open(r_out, "rb", buffering=0)
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


def run(argv: Sequence[str], *, join: "Sequence[str] | Parked" = (), cwd: str | None = None,
        env: dict | None = None, timeout_s: float | None = None,
        kill: Callable[[], None] | None = None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        clock_env: str | None = None, output_head: int = 0) -> ProcessResult:
    """Run argv to completion. On timeout call `kill` (e.g. the step cgroup's cgroup.kill, which
    also reaches children that left the process group) or else SIGKILL the process group.
    `join` is the cgroup.procs files to join before exec, or a Parked child that already has.
    `clock_env`: a variable set in the child's environment to CLOCK_MONOTONIC seconds at the origin
    of wall_ms, so the child can time itself from the same instant (the emulator does).
    `output_head`: keep the first that many bytes of its stdout and stderr (one pipe, read while it
    runs; the rest is read and dropped, so it never blocks on a full pipe) in the result's
    `output`. A Parked child's output is that pipe when output_head asks for it, else /dev/null as
    a fresh child's (only its shell's own complaint, a line, can reach the pipe then: left unread)."""
    t0 = time.perf_counter()
    if clock_env:
        env = {**(os.environ if env is None else env), clock_env: f"{time.monotonic():.6f}"}
    if isinstance(join, Parked):
        if stdout is not subprocess.DEVNULL or stderr is not subprocess.DEVNULL:
            raise ValueError("a Parked child's output is the pipe run() reads")
        join.start(argv, cwd, env, output=bool(output_head))
        proc = join.proc
    elif output_head:
        proc = start(argv, join=join, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    else:
        proc = start(argv, join=join, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
    out = proc.stdout
    head = bytearray()
    timed_out = False
    try:
        watch = out is not None and (output_head or not isinstance(join, Parked))   # else nothing writes it
        timed_out = not _wait(proc.pid, out.fileno() if watch else None, timeout_s, head, output_head)
        if timed_out:
            (kill or (lambda: os.killpg(proc.pid, signal.SIGKILL)))()
        _, status, ru = os.wait4(proc.pid, 0)
    except BaseException:
        # Ctrl-C or an error while waiting: never leave the step running.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if kill:
            kill()
        proc.wait()
        raise
    finally:
        if out is not None:
            out.close()
    wall_ms = (time.perf_counter() - t0) * 1000.0
    proc.returncode = os.waitstatus_to_exitcode(status)   # tell Popen we reaped it
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    return ProcessResult(code, sig, wall_ms, timed_out, ru.ru_utime * 1000.0, ru.ru_stime * 1000.0,
                         bytes(head) if output_head else None)


DRAIN_MAX_BYTES = 1 << 20       # read after the exit: what is already in the pipe, not a daemon's stream


def _wait(pid: int, out: int | None, timeout_s: float | None, head: bytearray, keep: int) -> bool:
    """Wait until `pid` exits (True) or `timeout_s` passes (False), reading the output pipe `out`
    meanwhile: its first `keep` bytes into `head`, the rest dropped. After the exit, what is still
    in the pipe is read without blocking (a process the step left behind may hold it open)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pidfd = os.pidfd_open(pid)
    watch = [pidfd] + ([out] if out is not None else [])
    try:
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select(watch, [], [], left)
            if out in ready and not _take(out, head, keep):
                watch.remove(out)                    # EOF: every writer is gone
            if pidfd in ready:
                break
            if not ready:
                return False
        if out is not None and out in watch:
            os.set_blocking(out, False)
            drained = 0
            while drained < DRAIN_MAX_BYTES:
                try:
                    n = _take(out, head, keep)
                except BlockingIOError:
                    break
                if not n:
                    break
                drained += n
        return True
    finally:
        os.close(pidfd)


def _take(fd: int, head: bytearray, keep: int) -> int:
    """One read of `fd`, its bytes added to `head` up to `keep`; how many were read (0: EOF)."""
    chunk = os.read(fd, 65536)
    if len(head) < keep:
        head += chunk[:keep - len(head)]
    return len(chunk)
