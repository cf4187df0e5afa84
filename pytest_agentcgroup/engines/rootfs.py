"""A bare Debian root file system made by `debootstrap --variant=minbase` from the Debian mirror
this host's apt uses (apt_sources.py): the docker executor's local image is one, and the bare-Debian
set-up test (tests/bare_debian/) runs the README's set-up in another.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from ..programs import require
from .apt_sources import NoDebianMirror, debian_mirror


class DebootstrapFailed(RuntimeError):
    """debootstrap is missing, no mirror is known, or it failed; the message says which (and its log's end)."""


def debootstrap(root: Path, *, suite: str = "bookworm", include: Sequence[str] = (), mirror: str | None = None,
                log: Path | None = None) -> str:
    """Make a minbase `suite` root in `root` (which must not exist or be empty) with the `include`d
    packages. Returns the mirror it used; `log` keeps debootstrap's output (else beside `root`)."""
    program = require("debootstrap", error=DebootstrapFailed, needed_by=f"a {suite} root file system")
    if mirror is None:
        try:
            mirror = debian_mirror(suite)
        except NoDebianMirror as exc:
            raise DebootstrapFailed(str(exc)) from None
    log = log or root.with_name(root.name + ".debootstrap.log")
    argv = [program, "--variant=minbase", *([f"--include={','.join(include)}"] if include else []),
            suite, str(root), mirror]
    with open(log, "w") as fh:
        rc = subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
        raise DebootstrapFailed(f"debootstrap of {suite} from {mirror} failed (exit {rc}; log {log}):\n{tail}")
    return mirror


#: what a root made for an image does without: apt's package lists and caches (steps have no
#: network to use them), documentation, manual pages and translations: most of a minbase root's
#: bytes, none of which a step reads.
IMAGE_PRUNE = ("var/lib/apt/lists", "var/cache/apt", "usr/share/doc", "usr/share/man", "usr/share/info",
               "usr/share/locale")


def prune_for_image(root: Path) -> None:
    """Empty the IMAGE_PRUNE directories of `root` (the directories stay, as packages expect them).
    Symlinks are removed, never followed, and a directory reached through one is left alone:
    nothing outside `root` is touched."""
    inside = root.resolve()
    for rel in IMAGE_PRUNE:
        top = root / rel
        if top.is_symlink() or not top.is_dir() or not top.resolve().is_relative_to(inside):
            continue                            # a link on the way there (usr/share -> elsewhere) too
        for entry in top.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
