"""The resource emulator's binary: replay/emulator.c compiled with `cc -O2` on first use, as the
eBPF programs are compiled when they are loaded, and kept in a cache keyed by the source's hash (a
changed source is a new binary; nothing goes stale).

The cache is the first usable of $XDG_CACHE_HOME/agentcgroup, $HOME/.cache/agentcgroup and
<tmpdir>/agentcgroup-<uid>: a directory this user owns that nobody else may write (a binary we
execute must be one we wrote). Root and users alike have one; the kernel VM's guest, whose root is
the host's read-only, has a writable $HOME in its /tmp. Two processes building at once (xdist
workers) each compile into a file of their own and rename it into place: the rename is atomic, the
last one wins, and both binaries are the same program.
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

SOURCE = Path(__file__).with_name("emulator.c")
COMPILE = ["cc", "-O2", "-o"]       # then OUT SOURCE -lm
NO_COMPILER = "the emulate executor needs a C compiler (cc): apt-get install gcc, or run make setup"


def cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("XDG_CACHE_HOME", "").startswith("/"):
        dirs.append(Path(os.environ["XDG_CACHE_HOME"]) / "agentcgroup")
    if os.environ.get("HOME", "").startswith("/"):
        dirs.append(Path(os.environ["HOME"]) / ".cache" / "agentcgroup")
    dirs.append(Path(tempfile.gettempdir()) / f"agentcgroup-{os.geteuid()}")
    return dirs


def _ours(path: Path, *, directory: bool) -> bool:
    """path exists, is a directory (or a regular file) this user owns, and no one else may write it."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    return kind(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _compile(out: Path) -> None:
    tmp = out.with_name(f".{out.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        proc = subprocess.run([*COMPILE, str(tmp), str(SOURCE), "-lm"], capture_output=True, text=True)
    except FileNotFoundError:
        raise ExecutorUnavailable(NO_COMPILER) from None
    try:
        if proc.returncode != 0:
            hint = " (the C library's headers are missing: apt-get install libc6-dev)" \
                if ".h: No such file" in proc.stderr else ""
            tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
            raise ExecutorUnavailable(f"cc could not compile {SOURCE}{hint}:\n{tail}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


@lru_cache(maxsize=None)
def emulator_binary() -> str:
    """The path of the compiled emulator, built now if this source has not been built here yet.
    Raises ExecutorUnavailable naming what is missing (the compiler, the C headers, a writable cache)."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join(COMPILE).encode() + platform.machine().encode())
    name = f"emulator-{key.hexdigest()[:16]}"
    tried = []
    for d in cache_dirs():
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            tried.append(f"{d}: {exc.strerror}")
            continue
        if not _ours(d, directory=True):
            tried.append(f"{d}: not a directory owned by uid {os.geteuid()} and writable by it alone")
            continue
        out = d / name
        if _ours(out, directory=False) and os.access(out, os.X_OK):
            return str(out)
        try:
            _compile(out)
        except OSError as exc:
            tried.append(f"{d}: {exc.strerror}")
            continue
        return str(out)
    raise ExecutorUnavailable("no cache directory to build the emulator in: " + "; ".join(tried))
