"""A locked workspace built once into the cache, outside the sandbox, with network.

    <cache>/workspaces/<project>-<version>-<key>/
        src/       the sdist, unpacked (its top directory stripped), or the git checkout with its
                   .git (git.py): copied to the task's path
        env/       a virtual environment of the lock's interpreter with the pinned wheels: copied to
                   env_path, where the agent's interpreter was
        complete   the build's key (entry_key): written last, so a half-built workspace is built again

The environment is made where the cache is and then made to work at env_path: its scripts' `#!`
lines and its own files name env_path, and its modules are compiled with env_path in their
tracebacks. The project is made importable as an editable install would (a .pth line naming the
task's path, and a .dist-info with the sdist's PKG-INFO), without running its build backend.
Everything is checked against the lock's sha256 pins (pip --require-hashes, download_sdist).
The cache directory is the emulator's (replay/emulator_build.py: this user's, nobody else may
write it): its environments' interpreters are run as this user, root included.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..errors import ExecutorUnavailable
from ..replay.emulator_build import safe_cache_dir
from ..replay.executors.base import Seed
from .lock import Locked, WorkspaceError
from .git import checkout
from .pypi import SIMPLE_INDEX, download_sdist, pip, unpack_sdist
from .roots import ensure_root, run_in

MARKER = "complete"


def entry_key(entry: Locked) -> str:
    """The hash of what the build is made of: tasks locked to the same files at the same paths share
    one build, whatever their lock entries say of why (chosen_by, notes)."""
    made_of = {k: v for k, v in entry.to_json().items() if k not in ("chosen_by", "notes", "commit_from")}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:16]


def cache_root() -> Path:
    """<the emulator's cache directory>/workspaces; WorkspaceError when there is none to use."""
    try:
        root = safe_cache_dir() / "workspaces"
    except ExecutorUnavailable as exc:
        raise WorkspaceError(str(exc)) from None
    root.mkdir(mode=0o700, exist_ok=True)
    return root


def sdist_cache() -> Path | None:
    """Where downloaded sdists are kept under their sha256 (a lock compares many, a build reads one
    again); None when there is no cache directory to use (they are then downloaded each time)."""
    try:
        return cache_root() / "sdists"
    except WorkspaceError:
        return None


def seed_of(entry: Locked, built: Path, system: Path | None = None) -> Seed:
    """`system`: the entry's system root, where the caller has it (else found, or made, in the cache)."""
    if entry.system and system is None:
        system = ensure_root(entry.system, built.parent)
    return Seed(path=entry.path, source=built / "src", env_path=entry.env_path, env_source=built / "env",
                system=system)


def built_dir(entry: Locked, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{entry.project}-{entry.version}-{entry_key(entry)}"


def is_built(entry: Locked, root: Path | None = None) -> bool:
    d = built_dir(entry, root)
    try:
        return (d / MARKER).read_text() == entry_key(entry)
    except OSError:
        return False


def build(entry: Locked, root: Path | None = None, *, index: str = SIMPLE_INDEX) -> Seed:
    """The Seed of `entry`'s workspace, built now when the cache does not hold it complete. One
    process builds it at a time (xdist workers replaying one corpus): the others wait, then use it."""
    out = built_dir(entry, root)
    if is_built(entry, root):
        return seed_of(entry, out)
    with open(out.parent / f".{out.name}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)           # released when closed, also by a process that dies
        if is_built(entry, root):                  # built by the holder we waited for
            return seed_of(entry, out)
        return _build(entry, out, index)


def _build(entry: Locked, out: Path, index: str) -> Seed:
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if entry.provider == "git":
            checkout(entry.local_path or entry.repository, entry.commit, tmp / "src")
        else:
            data = download_sdist(entry.project, entry.sdist["file"], entry.sdist["sha256"], index=index,
                                  cache=out.parent / "sdists")
            unpack_sdist(data, entry.sdist["file"], tmp / "src")
        if entry.eol == "lf":
            _to_lf(tmp / "src")
        root = ensure_root(entry.system, out.parent) if entry.system else None
        _environment(entry, tmp / "env", tmp / "src", root)
        (tmp / MARKER).write_text(entry_key(entry))
        if out.exists():                    # an incomplete earlier build (or another process's)
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return seed_of(entry, out, root)


def _environment(entry: Locked, env: Path, src: Path, root: Path | None) -> None:
    what = f"the environment of {entry.project}=={entry.version}"
    # a system root's interpreter runs inside it (roots.run_in), with the build directory writable
    inside = (lambda argv: run_in(root, argv, writable=(env.parent,))) if root is not None else list
    try:
        done = subprocess.run(inside([entry.interpreter, "-m", "venv", str(env)]), capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkspaceError(f"{what}: {entry.interpreter} -m venv: {exc}") from None
    if done.returncode != 0:
        raise WorkspaceError(f"{what}: {entry.interpreter} -m venv failed: {done.stderr.strip()[-500:]}")
    python = str(env / "bin" / "python")
    if entry.wheels:
        req = env / ".agentcgroup-requirements.txt"
        req.write_text("".join(f"{w['name']}=={w['version']} --hash=sha256:{w['sha256']}\n" for w in entry.wheels))
        pip(python, ["install", "--no-deps", "--require-hashes", "--only-binary=:all:", "--no-compile",
                     "--index-url", SIMPLE_INDEX, "-r", str(req)], what=what, root=root, writable=(env.parent,))
        req.unlink()
    site = _site_packages(env, entry.interpreter_version, what)
    env_site = str(site).replace(str(env), entry.env_path, 1)
    (site / "_agentcgroup_workspace.pth").write_text(entry.path + "\n")
    _dist_info(entry, src, site)
    _relocate(env, entry.env_path)
    # the system interpreter the environment was made from (same bytecode), isolated and without
    # site: compiling reads the files, it runs none of them
    done = subprocess.run(inside([entry.interpreter, "-I", "-S", "-m", "compileall", "-q", "-f", "-j", "0", "-s",
                                  str(site), "-p", env_site, str(site)]), capture_output=True, text=True, timeout=1800)
    if done.returncode not in (0, 1):       # 1: a file that does not compile (a test fixture): kept as it is
        raise WorkspaceError(f"{what}: compileall failed: {done.stderr.strip()[-500:]}")


def _to_lf(src: Path) -> None:
    """CRLF -> LF in the UTF-8 text files under `src` (binary files, with a NUL or not UTF-8, kept)."""
    for path in src.rglob("*"):
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\r\n" not in data or b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        path.write_bytes(data.replace(b"\r\n", b"\n"))


def _site_packages(env: Path, version: str, what: str) -> Path:
    # Read from the layout `python -m venv` makes, not by starting the environment's python: its
    # wheels come from the trace's task, and a .pth file of theirs would run on the host (site)
    site = env / "lib" / f"python{'.'.join(version.split('.')[:2])}" / "site-packages"
    if not site.is_dir():
        raise WorkspaceError(f"{what}: the environment has no {site}")
    return site


def _dist_info(entry: Locked, src: Path, site: Path) -> None:
    """<project>-<version>.dist-info with the sdist's PKG-INFO as METADATA, as an editable install
    leaves one (importlib.metadata.version(project) answers, pip list shows the project)."""
    meta = src / "PKG-INFO"
    name = entry.project.replace("-", "_")
    info = site / f"{name}-{entry.version}.dist-info"
    info.mkdir()
    # an sdist's own PKG-INFO; a checkout's could be a link to a host file (a git tree keeps links)
    ours = entry.provider == "git" or meta.is_symlink() or not meta.is_file()
    text = f"Metadata-Version: 2.1\nName: {entry.project}\nVersion: {entry.version}\n" if ours else \
        meta.read_text(encoding="utf-8", errors="replace")
    (info / "METADATA").write_text(text, encoding="utf-8")
    (info / "INSTALLER").write_text("agentcgroup-workspace\n")
    (info / "RECORD").write_text("")


def _relocate(env: Path, env_path: str) -> None:
    """Make the environment built at `env` name `env_path` instead: its scripts' `#!` lines, the
    activation scripts and pyvenv.cfg (text files of bin/ and the environment's top)."""
    old, new = str(env).encode(), env_path.encode()
    for path in [*sorted((env / "bin").iterdir()), env / "pyvenv.cfg"]:
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old in data and b"\0" not in data[:4096]:
            mode = path.stat().st_mode
            path.write_bytes(data.replace(old, new))
            os.chmod(path, mode)
