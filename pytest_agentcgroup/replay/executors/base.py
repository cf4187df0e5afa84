"""What every executor shares: the `Launch` it returns for a step, `StepRefused` for a step that
cannot run as recorded (the replayer records the message as the step's error), the rules for
running a recorded command (a clean cwd, a command the kernel can pass, the cwd carried from step
to step) that the sandbox and docker executors both follow, the `Seed` a trace's workspace starts
from, and how a recorded edit is applied (edit_argv: replay/editor.py, run inside the step's place).

An executor turns a step into a process: it returns an argv (or None for a step that executes
nothing) and keeps the per-trace state an agent's runtime keeps between tool calls.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import platform
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import ExecutorUnavailable
from ...traces.ir import Step, Trace
from .. import editor, stepguard

EXECUTING_TOOLS = ("bash", "python")
DEFAULT_TIMEOUT_S = 120.0


# the steps' wrapper (stepguard.py, run as a script): a new session keyring, then a seccomp filter
STEPGUARD = str(Path(stepguard.__file__).resolve())


def guarded(argv: list[str], *, allow_userns: bool = False) -> list[str]:
    """argv run under the steps' seccomp guard (stepguard.py)."""
    return [sys.executable, "-I", "-S", STEPGUARD, *(["--allow-userns"] if allow_userns else []), *argv]


def require_stepguard(executor: str) -> None:
    """ExecutorUnavailable where the guard cannot guard a step here (no system-call numbers for this
    machine, or a keyring join or filter the kernel refuses): it would refuse every step with 126."""
    if platform.machine() not in stepguard.MACHINES:
        raise ExecutorUnavailable(f"the {executor} executor guards steps with a seccomp filter that knows no "
                                  f"system-call numbers for {platform.machine()!r} "
                                  f"(known: {', '.join(sorted(stepguard.MACHINES))})")
    problem = _stepguard_problem()
    if problem:
        raise ExecutorUnavailable(f"the {executor} executor guards steps with {STEPGUARD}, which fails here: {problem}")


@functools.lru_cache(maxsize=1)
def _stepguard_problem() -> str | None:
    """The guard run once around /bin/true: None when it works, else what it said."""
    try:
        done = subprocess.run(guarded(["/bin/true"]), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


class SeedFailed(RuntimeError):
    """A trace's workspace could not be put in place: its test fails (a replay without its workspace
    is not one), where a missing executor skips."""


@dataclass(frozen=True)
class Seed:
    """What a trace's steps find when the trace starts: the directory `source` copied to `path` (the
    task's repository, where the agent had it) and a Python environment `env_source` copied to
    `env_path`, whose bin/ leads the steps' PATH. Built outside the sandbox (workspaces/); each
    replay gets its own copy, writable by the steps (nothing a step does reaches the next replay).
    `system`: a root directory whose /usr and /etc the steps see, read-only, instead of the host's
    (the environment's interpreter is its python3: workspaces/roots.py)."""
    path: str
    source: Path | None = None
    env_path: str | None = None
    env_source: Path | None = None
    system: Path | None = None


#: where no workspace may go: a mount there would hide what runs the steps (sh, setpriv, python3)
SYSTEM_PLACES = ("/bin", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run", "/sbin", "/sys", "/usr")


def inside(path: str, top: str) -> bool:
    """`path` is `top` or lies under it (both clean absolute paths)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def check_seed_places(seed: Seed | None, executor: str, reserved: tuple[str, ...] = ()) -> None:
    """SeedFailed when a place of `seed` (a trace's task path says where) is, holds or lies in a system
    place or one the executor keeps for itself (`reserved`): the replay fails saying so."""
    places = [p for p in (seed.path, seed.env_path) if p] if seed is not None else []
    for where in places:
        if where == "/" or any(inside(where, top) or inside(top, where) for top in (*SYSTEM_PLACES, *reserved)):
            raise SeedFailed(f"the {executor} executor cannot put a workspace at {where}: it would hide its own "
                             f"{where} (system places: {', '.join((*SYSTEM_PLACES, *reserved))})")


def copy_tree(src: Path, dst: Path, *, uid: int | None = None, gid: int | None = None) -> None:
    """Copy `src`'s contents into the directory `dst`: regular files, directories and symlinks (as
    links), nothing else (a FIFO or device is skipped); owned by uid:gid when given."""
    def special(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if not (stat.S_ISREG(m := os.lstat(os.path.join(directory, n)).st_mode)
                                         or stat.S_ISDIR(m) or stat.S_ISLNK(m))]
    mode = stat.S_IMODE(os.stat(dst).st_mode)
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=True, ignore=special)
    os.chmod(dst, mode)             # copytree gave it the source's mode
    if uid is not None:
        for root, dirs, files in os.walk(dst):
            for name in [*dirs, *files]:
                os.lchown(os.path.join(root, name), uid, gid)


EDITOR_SOURCE = Path(editor.__file__).read_text()
EDIT_OPS = {"create": ("file_text",), "write": ("file_text",), "str_replace": ("old_str",),
            "multi_edit": ("edits",), "insert": ("insert_line", "new_str"),
            "replace_lines": ("start_line", "end_line", "new_str"), "append": ("new_str",),
            "undo_edit": ()}        # op -> what the step must have recorded for it to be applied


def edit_argv(step: Step, python: str, history: str) -> list[str] | None:
    """`python -I -S -c EDITOR EDIT...` applying the edit `step` recorded (editor.py; the edit as JSON
    in as many arguments as its size needs: the kernel takes MAX_ARG_STRLEN bytes per argument,
    ARG_MAX in all), or None when the trace did not record the edit in full (a converter that keeps
    only its size): then it is not applied, and the step executes nothing."""
    args = step.args
    need = EDIT_OPS.get(args.get("op"))
    if step.tool != "edit" or need is None or not isinstance(args.get("path"), str) \
            or any(k not in args for k in need) or "not_kept" in args:
        return None
    spec = {k: args[k] for k in ("op", "path", "file_text", "old_str", "new_str", "replace_all", "edits", "insert_line",
                                 "start_line", "end_line", "line_ends", "expand_tabs", "clamp_line") if k in args}
    text = json.dumps({**spec, "history": history}, ensure_ascii=False)
    if "\0" in text:
        raise StepRefused(f"step {step.step_id}: the recorded edit of {args['path']!r} contains a NUL byte, "
                          "which no argument can carry; not applied")
    try:
        pieces = argv_pieces(text)
    except UnicodeEncodeError:          # a lone surrogate (a cut emoji) no program's argument can carry
        raise StepRefused(f"step {step.step_id}: the recorded edit of {args['path']!r} is not encodable as "
                          "UTF-8 (a lone surrogate); not applied") from None
    size = sum(len(p) + 1 for p in pieces)
    if size > EDIT_ARGV_MAX:
        raise StepRefused(f"step {step.step_id}: the recorded edit of {args['path']!r} is {size:,} bytes as JSON, "
                          f"more than a program's arguments can carry here ({EDIT_ARGV_MAX:,} bytes: ARG_MAX "
                          "less room for the environment and the sandbox's own arguments); not applied")
    return [python, "-I", "-S", "-c", EDITOR_SOURCE, *(p.decode("utf-8", "surrogateescape") for p in pieces)]


def argv_pieces(text: str, limit: int | None = None) -> list[bytes]:
    """`text` as UTF-8 in pieces of at most `limit` bytes (default MAX_ARG_STRLEN less the NUL),
    cut between characters, so that each piece decodes on its own and they join back to `text`."""
    limit = limit or MAX_ARG_STRLEN - 1
    data, pieces, at = text.encode("utf-8", "surrogateescape"), [], 0
    while at < len(data):
        cut = min(at + limit, len(data))
        back = cut
        while back > cut - 3 and back < len(data) and data[back] & 0xC0 == 0x80:   # inside a character
            back -= 1
        if at < back < len(data) and data[back] & 0xC0 != 0x80:    # its start (else stray bytes, or a
            cut = back                                           # limit under one character: cut there)
        pieces.append(data[at:cut])
        at = cut
    return pieces or [b""]


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
    # an env variable proc.run sets to its wall clock's origin (CLOCK_MONOTONIC seconds) as it spawns
    clock_env: str | None = None


PATH_MAX = 4096
# The kernel copies at most MAX_ARG_STRLEN bytes (32 pages, NUL included) of any one argv string
# into a new program; the command is one (the shell's `-c` argument), so longer cannot start.
MAX_ARG_STRLEN = 32 * 4096
# What an edit's arguments may take in all: what the kernel lets argv and the environment take (a
# quarter of the stack limit, which the step inherits; at least 128 KiB, at most 6 MiB) less
# 256 KiB for the environment, the editor's source and the wrappers' own arguments; never less
# than one argument's worth
EDIT_ARGV_MAX = max(min(max(os.sysconf("SC_ARG_MAX"), 128 * 1024), 6 << 20) - 256 * 1024, MAX_ARG_STRLEN)


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
