"""The system a locked workspace's steps see when the host's python3 is not the trajectory's: a
Debian root whose python3 is that version (SYSTEMS), made once into the cache with debootstrap
and used read-only, and a program run inside it to make the environment (bwrap, with network).

    <cache>/workspaces/roots/debian-bullseye/
        root/      a minbase bullseye root with python3, python3-venv and git (pruned as an image is)
        complete   the system's name and its packages: written last, so a half-made root, or one
                   made with other packages, is made again

A replay binds the root's /usr and /etc (and its /bin, /lib links) where the sandbox binds the
host's (base.Seed.system); the docker executor imports the same directory as its image. Debian's
signed Release files check what debootstrap fetches; the lock names the system, not its files.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

from ..engines.rootfs import DebootstrapFailed, debootstrap, prune_for_image
from ..programs import require
from ..replay.executors.sandbox import system_binds
from .lock import SYSTEMS, WorkspaceError

#: git: a workspace may be a git checkout, and the agent's `git diff`, `git status` run in the root
PACKAGES = ("python3", "python3-venv", "git")
MARKER = "complete"
#: where the host's CA bundle (pip's --cert) is seen inside the root: its own /etc is read-only
CERT_INSIDE = "/tmp/.agentcgroup-ca.pem"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


def system_for(python: str) -> str:
    """The system whose python3 is `python` (major.minor); WorkspaceError listing those there are."""
    for name, (_, version) in SYSTEMS.items():
        if version == python:
            return name
    have = ", ".join(f"{v} ({n})" for n, (_, v) in SYSTEMS.items())
    raise WorkspaceError(f"no system here has Python {python}: the host's python3, or {have}")


def ensure_root(system: str, cache: Path) -> Path:
    """`system`'s root under `cache`, made now (debootstrap, network, root) when the cache lacks it."""
    if system not in SYSTEMS:
        raise WorkspaceError(f"unknown system {system!r} (known: {', '.join(SYSTEMS)})")
    top = cache / "roots" / system
    if _complete(top, system):
        return top / "root"
    top.mkdir(parents=True, exist_ok=True)
    with open(top.parent / f".{system}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)        # one process makes it; the others wait and use it
        if not _complete(top, system):
            _make(system, top)
    return top / "root"


def _complete(top: Path, system: str) -> bool:
    try:
        return (top / MARKER).read_text() == _marker(system)
    except OSError:
        return False


def _marker(system: str) -> str:
    return f"{system} {' '.join(PACKAGES)}"


def _make(system: str, top: Path) -> None:
    suite = SYSTEMS[system][0]
    if os.geteuid() != 0:
        raise WorkspaceError(f"the {system} root ({suite}'s python3) is not in this user's cache ({top}), and "
                             f"making it (debootstrap) needs root: a workspace locked on it replays as root only")
    for stale in top.glob(".root.*"):           # left by a build that was killed (we hold the lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=".root.", dir=top))
    try:
        try:
            debootstrap(tmp / "root", suite=suite, include=PACKAGES, log=top / "debootstrap.log")
        except DebootstrapFailed as exc:
            raise WorkspaceError(f"the {system} root cannot be made: {exc}") from None
        prune_for_image(tmp / "root")
        (tmp / "root" / "etc" / "resolv.conf").unlink(missing_ok=True)     # the host's, copied in
        (tmp / "root" / "etc" / "resolv.conf").write_text("")              # a place to bind it (run_in)
        (tmp / MARKER).write_text(_marker(system))
        for name in ("root", MARKER):
            if (top / name).is_dir():
                shutil.rmtree(top / name)
            os.replace(tmp / name, top / name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def host_cert() -> str | None:
    """The CA bundle pip is told to use here (PIP_CERT, REQUESTS_CA_BUNDLE), where it is a file."""
    cert = os.environ.get("PIP_CERT") or os.environ.get("REQUESTS_CA_BUNDLE")
    return cert if cert and os.path.isfile(cert) else None


def run_in(root: Path, argv: Sequence[str], *, writable: Sequence[Path] = ()) -> list[str]:
    """argv running `argv` with `root`'s system, the host's network and DNS, its CA bundle at
    CERT_INSIDE (where PIP_CERT or REQUESTS_CA_BUNDLE names one), and `writable` read-write at
    their own paths: how a system root's interpreter makes and fills an environment."""
    bwrap = require("bwrap", error=WorkspaceError, needed_by="a workspace of another system's python3")
    cert = host_cert()
    # the host's environment names the host's files (REQUESTS_CA_BUNDLE would override pip's --cert):
    # only a proxy's settings go in
    proxy = [a for k in PROXY_VARIABLES if k in os.environ for a in ("--setenv", k, os.environ[k])]
    return [bwrap, "--unshare-all", "--share-net", "--die-with-parent", "--clearenv", *proxy, *system_binds(root),
            "--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf",
            "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            *(["--ro-bind", cert, CERT_INSIDE] if cert else []),
            *(a for p in writable for a in ("--bind", str(p), str(p))),
            "--setenv", "HOME", "/tmp", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin",
            "--setenv", "LANG", "C.UTF-8", "--", *argv]
