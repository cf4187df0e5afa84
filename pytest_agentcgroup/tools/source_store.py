"""The store of the tasks' source a corpus ships: a bare, shallow git repository holding only the
commits its workspace lock checks out (workspaces/git.py build_store), rebuilt from the public
repository and the lock.

    agentcgroup tools source-store LOCK --from REPOSITORY [--store STORE]

Each entry of provider git whose repository is a store inside the corpus (a path relative to the
lock) names a task and its commit; the store gets one tag per task, named by its key, at that
commit, with that commit's tree and nothing of its history. REPOSITORY is the public repository
the commits come from: a URL, or a local clone or mirror of it (network is needed only for a URL).
The same lock and repository give a store with the same commits and trees.
"""
from __future__ import annotations

from pathlib import Path

from ..workspaces.git import build_store
from ..workspaces.lock import LockFile, WorkspaceError


def stores_of(lock: LockFile) -> dict[Path, dict[str, str]]:
    """{store: {task key: commit}} of the lock's git entries whose repository lies in the corpus."""
    out: dict[Path, dict[str, str]] = {}
    for key, entry in lock.entries.items():
        if entry.provider == "git" and entry.local_path:
            out.setdefault(Path(entry.local_path), {})[key] = entry.commit
    return out


def rebuild(lock_path: Path, source: str, store: Path | None = None) -> list[tuple[Path, dict[str, str], int]]:
    """Rebuild every store the lock names (or `store` only) from `source`: [(store, its tags,
    its size in bytes)]. WorkspaceError when the lock names no such store, or `source` lacks a commit."""
    lock = LockFile.read(lock_path)
    if not lock.entries and not Path(lock_path).is_file():
        raise WorkspaceError(f"{lock_path}: no such lock")
    stores = stores_of(lock)
    if store is not None:
        wanted = Path(store).resolve()
        stores = {p: t for p, t in stores.items() if p == wanted}
    if not stores:
        raise WorkspaceError(f"{lock_path} names no git store inside its corpus"
                             + (f" at {store}" if store is not None else ""))
    return [(path, tags, build_store(source, tags, path)) for path, tags in sorted(stores.items())]
