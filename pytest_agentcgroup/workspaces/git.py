"""A git checkout as a workspace's source: the task's repository at its base commit, with its .git
(the agent's `git diff`, `git status` and `git stash` see the history they saw), cloned once with
network when the lock is made and when the workspace is built, never by a replay.

Only the protocols a lock may name are spoken (GIT_ALLOW_PROTOCOL: https, http, git, file; never
`ext::`, which runs a command), no credential is asked for, and the commit is checked after the
checkout: the lock pins it as the sdist's sha256 pins an sdist.
"""
from __future__ import annotations

import datetime
import os
import re
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


def checkout(repository: str, commit: str, dest: Path) -> None:
    """`dest`: a working copy of `repository` at `commit`, detached, its .git kept; WorkspaceError
    naming what failed (the clone, a commit the repository does not have)."""
    what = f"the git checkout of {repository} at {commit}"
    _git(["-c", "credential.helper=", "clone", "--quiet", "--no-local", "--no-checkout", "--", repository, str(dest)], what)
    _git(["-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit, "--"], what, cwd=dest)
    head = _git(["rev-parse", "HEAD"], what, cwd=dest).strip()
    if head != commit:
        raise WorkspaceError(f"{what}: HEAD is {head}, not the locked commit")


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

