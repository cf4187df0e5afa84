"""The resource emulator's binary: replay/emulator.c compiled with `cc -O2` on first use, as the
eBPF programs are compiled when they are loaded, and kept in a cache keyed by the source's hash (a
changed source is a new binary; nothing goes stale).

The cache is the first usable of $XDG_CACHE_HOME/agentcgroup, $HOME/.cache/agentcgroup,
/var/cache/agentcgroup (root only) and <tmpdir>/agentcgroup-<uid>: a directory this user owns that
nobody else may write, reached through directories nobody else may change (a binary we execute must
be one we wrote: as root under another user's $HOME, that user could rename the cache away and plant
a binary of the predictable name). So every directory from / down is owned by root or this user and
not writable by group or others unless sticky (/tmp); symlinks are resolved first and the resolved
path is used. As root the compiler is the absolute path of `cc`, likewise root-owned all the way.
Root and users alike have one; the kernel VM's guest, whose root is the host's read-only, has a
writable $HOME in its /tmp (root-owned down to it). Two processes building at once (xdist workers)
each compile into a file of their own and rename it into place: the rename is atomic, the last one
wins, and both binaries are the same program.
"""
from __future__ import annotations

import hashlib
import os
import platform
import stat
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from ..errors import ExecutorUnavailable
from ..programs import program, which

SOURCE = Path(__file__).with_name("emulator.c")
COMPILE = ["-O2", "-o"]             # cc, then OUT SOURCE -lm
NO_COMPILER = f"the emulate executor needs a C compiler, cc ({program('cc').how_to_install()}), which is not installed"
ROOT_CACHE = Path("/var/cache/agentcgroup")


def cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("XDG_CACHE_HOME", "").startswith("/"):
        dirs.append(Path(os.environ["XDG_CACHE_HOME"]) / "agentcgroup")
    if os.environ.get("HOME", "").startswith("/"):
        dirs.append(Path(os.environ["HOME"]) / ".cache" / "agentcgroup")
    if os.geteuid() == 0:
        dirs.append(ROOT_CACHE)
    dirs.append(Path(tempfile.gettempdir()) / f"agentcgroup-{os.geteuid()}")
    return dirs


def _untouchable(path: Path) -> str | None:
    """Why someone other than root and this user could replace what `path` (resolved, absolute)
    names, or None: each existing component from / down must be owned by root or us, and a directory
    above it must not be group/other-writable unless sticky (then others cannot rename our entries;
    an entry of theirs fails the owner check)."""
    trusted = (0, os.geteuid())
    for p in [*reversed(path.parents), path]:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return None             # not made yet: made by us below what was checked
        except OSError as exc:
            return f"{p}: {exc.strerror}"
        if st.st_uid not in trusted:
            return f"{p} is owned by uid {st.st_uid}, neither root nor uid {os.geteuid()}"
        if p != path and st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"{p} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _ours(path: Path, *, directory: bool) -> bool:
    """path exists, is a directory (or a non-empty regular file) this user owns, and no one else may write it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    return kind(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022 \
        and (directory or st.st_size > 0)


def compiler() -> str:
    """The absolute path of `cc` (as root: root-owned down from /, else ExecutorUnavailable saying why)."""
    found = which("cc")
    if found is None:
        raise ExecutorUnavailable(NO_COMPILER)
    cc = Path(os.path.realpath(found))
    if os.geteuid() == 0 and (why := _untouchable(cc)):
        raise ExecutorUnavailable(f"not running {found} as root: {why}")
    return str(cc)


def _compile(out: Path) -> None:
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        proc = subprocess.run([compiler(), *COMPILE, str(tmp), str(SOURCE), "-lm"], capture_output=True, text=True)
    except FileNotFoundError:
        raise ExecutorUnavailable(NO_COMPILER) from None
    try:
        if proc.returncode != 0:
            hint = " (the C library's headers are missing: apt-get install libc6-dev)" \
                if ".h: No such file" in proc.stderr else ""
            tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
            raise ExecutorUnavailable(f"cc could not compile {SOURCE}{hint}:\n{tail}")
        os.chmod(tmp, 0o755)
        fd = os.open(tmp, os.O_RDONLY)      # on disk before it is renamed in: a crash leaves no empty binary
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _runs(path: Path) -> bool:
    """The cached binary is the emulator (a truncated or foreign file is rebuilt): without
    arguments it prints its usage and exits 2."""
    try:
        r = subprocess.run([str(path)], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 2 and "usage:" in r.stderr


def _verified(path: str) -> str:
    """path, checked again just before it is handed out for an exec: still our non-empty regular file,
    opened without following a symlink."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW)
    except OSError as exc:
        raise ExecutorUnavailable(f"the emulator {path} is gone: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022 and st.st_size):
        raise ExecutorUnavailable(f"the emulator {path} was replaced (no longer a file only uid {os.geteuid()} may write)")
    return path


def emulator_binary() -> str:
    """The path of the compiled emulator, built now if this source has not been built here yet.
    Raises ExecutorUnavailable naming what is missing (the compiler, the C headers, a safe cache)."""
    return _verified(_built())


def _usable(d: Path, tried: list[str]) -> bool:
    """`d` (resolved) is, or is now made, a cache directory of ours that only we may change; else
    why not is appended to `tried`."""
    if why := _untouchable(d):
        tried.append(why)
        return False
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        tried.append(f"{d}: {exc.strerror}")
        return False
    if why := _untouchable(d):          # again: the parents just made (a umask of 0 makes them 0777)
        tried.append(why)
        return False
    if not _ours(d, directory=True):
        tried.append(f"{d}: not a directory owned by uid {os.geteuid()} and writable by it alone")
        return False
    if not os.access(d, os.W_OK) or os.statvfs(d).f_flag & os.ST_RDONLY:
        tried.append(f"{d}: read-only")
        return False
    return True


def safe_cache_dir() -> Path:
    """The first usable cache directory (the module docstring's rules), for whatever else the
    project builds once and keeps (workspaces/build.py); ExecutorUnavailable naming why none is."""
    tried: list[str] = []
    for d in cache_dirs():
        d = Path(os.path.realpath(d))
        if _usable(d, tried):
            return d
    raise ExecutorUnavailable("no cache directory to build in: " + "; ".join(tried))


@lru_cache(maxsize=None)
def _built() -> str:
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(["cc", *COMPILE]).encode() + platform.machine().encode())
    name = f"emulator-{key.hexdigest()[:16]}"
    tried = []
    for d in cache_dirs():
        d = Path(os.path.realpath(d))
        if not _usable(d, tried):
            continue
        out = d / name
        if _ours(out, directory=False) and os.access(out, os.X_OK) and _runs(out):
            return str(out)
        try:
            _compile(out)
        except OSError as exc:
            tried.append(f"{d}: {exc.strerror}")
            continue
        return str(out)
    raise ExecutorUnavailable("no cache directory to build the emulator in: " + "; ".join(tried))


emulator_binary.cache_clear = _built.cache_clear      # tests forget the build as before


def remove_built() -> list[Path]:
    """Remove the emulator binaries this user built in its cache directories (`make clean-emulator`),
    so that the next run compiles from the source as a fresh machine would. Only our own files."""
    removed = []
    for d in cache_dirs():
        d = Path(os.path.realpath(d))
        if _untouchable(d) or not _ours(d, directory=True):
            continue
        for f in d.glob("emulator-*"):
            if _ours(f, directory=False):
                f.unlink()
                removed.append(f)
    _built.cache_clear()
    return removed
