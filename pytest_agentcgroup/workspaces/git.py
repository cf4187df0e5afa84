"""A git checkout as a workspace's source: the task's repository at its base commit, with its .git
(the agent's `git diff`, `git status` and `git stash` see that commit), fetched once (network, or a
store the corpus ships) when the lock is made and when the workspace is built, never by a replay.
The checkout holds that one commit (a shallow fetch of it, no tags): its files, nothing of the
repository's other commits.

A corpus may ship the commits its lock names as a store: a bare, shallow repository holding only
those commits and their trees, one tag per task (build_store: `agentcgroup tools source-store`).

Only the protocols a lock may name are spoken (GIT_ALLOW_PROTOCOL: https, http, git, file; never
`ext::`, which runs a command), no credential is asked for, and the commit is checked after the
checkout: the lock pins it as the sdist's sha256 pins an sdist.
"""
from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
from pathlib import Path

from ..programs import require
from .lock import RegistryUnreachable, WorkspaceError
from .roots import PROXY_VARIABLES

PROTOCOLS = "https:http:git:file"
GIT_TIMEOUT_S = 1800
#: the text files read to lock (requirements.py reads some of them; seen.py compares what was viewed)
MAX_FILE_BYTES = 2 * 1024 * 1024
#: what git (curl, ssh) says when the repository's host could not be reached at all
UNREACHABLE = re.compile(r"Could not resolve host|Failed to connect to|Connection (?:refused|timed out)|"
                         r"Network is unreachable|Operation timed out")


def _git(args: list[str], what: str, cwd: Path | None = None) -> str:
    program = require("git", error=WorkspaceError, needed_by="a git workspace")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/"),
           "GIT_ALLOW_PROTOCOL": PROTOCOLS, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C",
           "GIT_LFS_SKIP_SMUDGE": "1",
           **{k: v for k, v in os.environ.items() if k in (*PROXY_VARIABLES, "GIT_SSL_CAINFO", "SSL_CERT_FILE")}}
    try:
        done = subprocess.run([program, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkspaceError(f"{what}: git could not run: {exc}") from None
    if done.returncode != 0:
        verb = next(a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] != "-c"))
        said = (done.stderr or done.stdout).strip()[-400:]
        why = f"{what}: git {verb} failed (exit {done.returncode}): {said}"
        if UNREACHABLE.search(said):
            host = re.search(r"unable to access '([^']+)'|Could not resolve host: (\S+)", said)
            raise RegistryUnreachable(why, next(g for g in host.groups() if g) if host else "the repository's host")
        raise WorkspaceError(why)
    return done.stdout


def is_local(repository: str) -> bool:
    return repository.startswith("/") or repository.startswith("file://")


def checkout(repository: str, commit: str, dest: Path) -> None:
    """`dest`: a working copy of `repository` at `commit`, detached, its .git kept; WorkspaceError
    naming what failed (the fetch, a commit the repository does not have)."""
    what = f"the git checkout of {repository} at {commit}"
    if is_local(repository) and not has_commit(repository.removeprefix("file://"), commit):
        raise WorkspaceError(f"{what}: the repository has no commit {commit}")
    dest.mkdir(parents=True, exist_ok=True)
    _git(["init", "--quiet", str(dest)], what)
    _git(["-c", "credential.helper=", "-c", "protocol.version=2", "fetch", "--quiet", "--no-tags", "--depth=1",
          "--", repository, commit], what, cwd=dest)
    _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit, "--"], what, cwd=dest)
    head = _git(["rev-parse", "HEAD"], what, cwd=dest).strip()
    if head != commit:
        raise WorkspaceError(f"{what}: HEAD is {head}, not the locked commit")


def _git_dir(repository: Path | str) -> str:
    """--git-dir=… of a local repository: its .git, or the directory itself (a bare one)."""
    path = Path(repository)
    return f"--git-dir={path / '.git' if (path / '.git').exists() else path}"


def has_commit(repository: Path | str, commit: str) -> bool:
    """The local repository (a working copy or a bare one) holds `commit` as a commit."""
    try:
        _git([_git_dir(repository), "cat-file", "-e", f"{commit}^{{commit}}"], f"reading {repository}")
    except WorkspaceError:
        return False
    return True


def blob_ids(repository: Path | str, commit: str, paths: list[str]) -> dict[str, str | None]:
    """{path: the blob id of `path` in `commit`'s tree, or None where the tree has no such file}."""
    out = {}
    for path in paths:
        try:
            out[path] = _git([_git_dir(repository), "rev-parse", "--verify", "--quiet", f"{commit}:{path}"],
                             f"reading {path} at {commit}").strip() or None
        except WorkspaceError:
            out[path] = None
    return out


def store_tags(store: Path) -> dict[str, str]:
    """{tag: the commit it names} of a store (build_store)."""
    text = _git([_git_dir(store), "for-each-ref", "--format=%(refname:strip=2) %(objectname)", "refs/tags"],
                f"reading the store {store}")
    return dict(line.split(" ", 1) for line in text.splitlines() if line.strip())


KEEP = ".keep"
#: what git init leaves in a bare repository that a store does without (samples, a description)
_NOT_KEPT = ("hooks", "description", "info", "branches", "logs", "FETCH_HEAD")


def build_store(source: str, tags: dict[str, str], dest: Path) -> int:
    """Make `dest` a bare, shallow repository holding exactly the commits `tags` names ({tag:
    commit}), each fetched from `source` (a URL or a local repository) with its tree and no
    history, in one pack; its size in bytes. `dest` is replaced whole once the new store is
    complete. WorkspaceError naming a commit `source` lacks."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    what = f"the store {dest} from {source}"
    try:
        _git(["init", "--quiet", "--bare", str(tmp)], what)
        for tag, commit in sorted(tags.items()):
            _git(["-c", "credential.helper=", "-c", "protocol.version=2", "fetch", "--quiet", "--no-tags", "--depth=1",
                  "--", source, f"{commit}:refs/tags/{tag}"], f"{what}: {tag} ({commit})", cwd=tmp)
        _git(["repack", "-a", "-d", "-f", "-q", "--no-write-bitmap-index"], what, cwd=tmp)
        _git(["pack-refs", "--all"], what, cwd=tmp)
        _git(["prune", "--expire=now"], what, cwd=tmp)
        for name in _NOT_KEPT:
            target = tmp / name
            shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        # git knows a repository by its refs/ directory, and a checkout of the corpus keeps no empty
        # one: a file keeps it (a name git reads as no ref)
        shutil.rmtree(tmp / "refs")
        (tmp / "refs").mkdir()
        (tmp / "refs" / KEEP).write_text("")
        if store_tags(tmp) != tags:
            raise WorkspaceError(f"{what}: the store's tags are not the ones asked for")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())


def committed(dest: Path) -> str:
    """When HEAD of `dest` was committed, in UTC, as PyPI writes upload times (2022-10-11T10:34:56Z)."""
    epoch = int(_git(["show", "-s", "--format=%ct", "HEAD"], "reading the commit's date", cwd=dest).strip())
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def text_files(dest: Path) -> dict[str, str]:
    """{path relative to `dest`: text} of the checkout's UTF-8 files (not .git's, nor larger ones)."""
    out = {}
    for path in sorted(dest.rglob("*")):
        rel = path.relative_to(dest).as_posix()
        if rel == ".git" or rel.startswith(".git/") or path.is_symlink() or not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            out[rel] = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out

