"""Start one step's process inside its cgroups and wait for it.

The child writes "0" into each cgroup.procs file *before* it execs, so the program starts and
allocates inside its cgroups from its first instruction: there is no window where it runs in the
parent's cgroup (as there is when a process is moved after fork). Both layouts accept "0" as "the
writing process".
"""
from __future__ import annotations

import os
import select
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


def run(argv: Sequence[str], *, join: Sequence[str] = (), cwd: str | None = None,
        env: dict | None = None, timeout_s: float | None = None,
        kill: Callable[[], None] | None = None, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) -> ProcessResult:
    """Run argv to completion. On timeout call `kill` (e.g. the step cgroup's cgroup.kill, which
    also reaches children that left the process group) or else SIGKILL the process group."""
    t0 = time.perf_counter()
    proc = start(argv, join=join, cwd=cwd, env=env, stdout=stdout, stderr=stderr)
    timed_out = False
    try:
        pidfd = os.pidfd_open(proc.pid)
        try:
            ready, _, _ = select.select([pidfd], [], [], timeout_s)
        finally:
            os.close(pidfd)
        if not ready:
            timed_out = True
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
    wall_ms = (time.perf_counter() - t0) * 1000.0
    proc.returncode = os.waitstatus_to_exitcode(status)   # tell Popen we reaped it
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    return ProcessResult(code, sig, wall_ms, timed_out, ru.ru_utime * 1000.0, ru.ru_stime * 1000.0)
