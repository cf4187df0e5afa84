"""Which workspace a replay of real commands gets for its trace, and the message when it has none.

In this order: `--agentcgroup-workspace empty` (an empty directory, asked for), a user's own
directory (`--agentcgroup-workspace DIR`, copied to the task's path), the task's image (the docker
executor, where the engine has it), the corpus's lock (a PyPI workspace or a git checkout, built on
first use). A trace that names no task (traces/task.py task_of) needs none. A trace that names one and gets
none is a WorkspaceError naming the task, the workspace it lacks and the ways to give it one:
replaying its commands in an empty directory would measure commands that fail at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..engines.docker import LOCAL_IMAGE
from ..replay.executors.base import Seed, trace_home
from ..traces.corpus import LOCK_FILE
from ..traces.ir import Trace
from ..traces.task import task_of
from .build import build
from .lock import LockFile, RegistryUnreachable, WorkspaceError, clean_abs, task_key

EMPTY = "empty"


@dataclass(frozen=True)
class Provided:
    """A trace's workspace: what the executor copies in (None: the image holds it, or an empty
    directory was asked for) and what the records say of it: `name` (provider and version) and,
    for a locked one, how its version was chosen."""
    seed: Seed | None
    name: str
    chosen_by: str | None = None


def provide(trace: Trace, *, executor: str, directory: str | None, corpus: Path | None,
            image: str | None = None, option: str = "--agentcgroup-workspace") -> Provided | None:
    """The workspace of `trace` under `executor` (module docstring): None for a trace that names no
    task and gets no directory; WorkspaceError when its task's workspace is missing or cannot be built.
    `image`: the docker executor's image for the trace (the project's local image holds no task).
    `option`: the command-line option that gives `directory`, as the messages name it."""
    task = task_of(trace)
    if directory == EMPTY:
        return Provided(None, f"empty (asked for: {option} empty)")
    if directory is not None:
        src = Path(directory)
        if not src.is_dir():
            raise WorkspaceError(f"{option} {directory}: not a directory")
        path = task.path if task is not None and clean_abs(task.path) else trace_home(trace)
        return Provided(Seed(path=path, source=src), f"directory {directory} at {path}", option)
    if task is None:
        return None
    if executor == "docker" and image and image != LOCAL_IMAGE:
        return Provided(None, f"image {image}", "the task's image, present in the Docker engine")
    key = task_key(task)
    lock_path = (corpus / LOCK_FILE) if corpus is not None else None
    entry = LockFile.read(lock_path).entries.get(key) if lock_path is not None and key else None
    if entry is not None:
        try:
            seed = build(entry)
        except WorkspaceError as exc:
            why = f"trace {trace.trace_id}: the workspace of task {key} locked in {lock_path} cannot be built: {exc}"
            raise (RegistryUnreachable(why, exc.registry) if isinstance(exc, RegistryUnreachable)
                   else WorkspaceError(why)) from None
        return Provided(seed, entry.describe(), f"{entry.chosen_by} (locked in {lock_path})")
    ways = [f"{option} DIR (your own working copy of it)",
            f"a workspace lock entry for {key or 'it'} in {lock_path or LOCK_FILE} "
            f"(agentcgroup traces lock TRACE -o {lock_path or LOCK_FILE}: built from PyPI on first use)",
            f"{option} empty (replay in an empty directory anyway)"]
    if executor == "docker":
        ways.insert(0, "the task's image in the Docker engine (docker load of a saved image works offline)")
    return _missing(trace, task.describe(), ways)


def _missing(trace: Trace, task: str, ways: list[str]):
    raise WorkspaceError(f"trace {trace.trace_id} ran on task {task}, and its workspace is missing here: its "
                         f"commands would run in an empty directory. Provide it with " + "; or ".join(ways))
