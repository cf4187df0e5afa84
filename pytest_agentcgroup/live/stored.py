"""A live session kept in a directory, for `agentcgroup exec`: each invocation runs one call in it.

    DIR/.session.json   the session: arm, config, executor, workspace, its cgroup (cgroup.py describe())
    DIR/trace.json      its trace so far (recorder.py), continued by every call
    DIR/manifest.json   the trace listed in subset `live`: DIR is a corpus the plugin replays

Invocations may run at once (an agent's calls in parallel): the session is made, and each call's id
handed out (`next_call` in .session.json), under a lock on DIR/.session.lock; the trace is shared
(recorder.py). The first call makes DIR and the session's cgroup; later calls reopen both (the arm is the one the
session started with: another is refused, not silently mixed in). `end_stored` removes the cgroup,
marks the trace ended and removes .session.json, so DIR keeps the finished trace.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from ..cgroups.host import CgroupUnavailable, detect
from ..traces.ir import TraceError
from .cgroup import remove_session_cgroup, remove_what_is_left, reopen_session_cgroup
from .recorder import Recorder
from .session import AgentSession, CallResult, SessionError

LOCK = ".session.lock"
STATE = ".session.json"              # a dot-file: DIR stays a corpus of one trace (manifest.json)
TRACE = "trace.json"
SCHEMA = "agentcgroup-live-session/1"
DEFAULT_ARM = "static-toolcall"


def _read_state(directory: Path) -> dict | None:
    path = directory / STATE
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SessionError(f"{path}: not a session file ({exc})") from None
    if not isinstance(state, dict) or state.get("schema") != SCHEMA:
        raise SessionError(f"{path}: schema: expected {SCHEMA!r}")
    for key in ("arm", "executor", "workspace", "cgroup", "next_call"):
        if key not in state:
            raise SessionError(f"{path}: {key}: missing")
    return state


@contextlib.contextmanager
def _locked(directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_state(directory: Path, state: dict) -> None:
    tmp = directory / f"{STATE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, directory / STATE)


def run_stored(directory: str | Path, command: str, *, arm: str | None, config: str | Path | None,
               executor: str, workspace: str | Path, timeout_s: float) -> CallResult:
    """One call in the session kept at `directory` (made, with its cgroup, when there is none)."""
    directory = Path(directory)
    with _locked(directory):
        state = _read_state(directory)
        if state is None:
            session, state = _start(directory, arm, config, executor, workspace)
        else:
            if arm is not None and arm != state["arm"]:
                raise SessionError(f"{directory / STATE}: the session runs arm {state['arm']!r}, not {arm!r} "
                                   "(end it with --end to start one with another arm)")
            try:
                session = AgentSession(state["arm"], state.get("config"), workspace=state["workspace"],
                                       executor=state["executor"], trace_out=directory / TRACE, manifest=True,
                                       resume=state["cgroup"], keep_cgroup=True, next_call_id=state["next_call"])
            except TraceError as exc:
                raise SessionError(str(exc)) from None
            try:
                session.open()
            except CgroupUnavailable as exc:
                raise SessionError(f"{directory / STATE}: {exc}") from None
        try:
            state["next_call"] += 1
            _write_state(directory, state)
        except BaseException:
            session.close()
            raise
    try:
        return session.run(command, timeout_s=timeout_s)
    finally:
        session.close()


def _start(directory: Path, arm: str | None, config, executor: str, workspace) -> tuple[AgentSession, dict]:
    """A new session kept at `directory`: its cgroup made, its state written."""
    if (directory / TRACE).exists():
        raise SessionError(f"{directory / TRACE}: the trace of an ended session; start the new one in "
                           "another directory (or move that trace away)")
    session = AgentSession(arm or DEFAULT_ARM, config, workspace=workspace, executor=executor, trace_out=directory / TRACE,
                           manifest=True, keep_cgroup=True, next_call_id=0)
    session.open()
    state = {"schema": SCHEMA, "arm": session.arm.name, "config": str(Path(config).resolve()) if config else None,
             "executor": executor, "workspace": str(session.workspace), "cgroup": session.described_cgroup,
             "next_call": 0}
    return session, state


def end_stored(directory: str | Path) -> Path | None:
    """End the session kept at `directory`: its cgroup removed, its trace marked ended. The trace's
    path, or None when the session made no call."""
    directory = Path(directory)
    if not (directory / STATE).exists():
        raise SessionError(f"{directory}: no session to end (no {STATE})")
    with _locked(directory):
        return _end(directory)


def _end(directory: Path) -> Path | None:
    state = _read_state(directory)
    if state is None:
        raise SessionError(f"{directory}: no session to end (no {STATE})")
    try:
        cg, _ = reopen_session_cgroup(detect(), state["cgroup"], str(directory / STATE))
    except CgroupUnavailable:        # gone, or partly: what is left of it is removed
        cg = None
        remove_what_is_left(state["cgroup"])
    if cg is not None:
        remove_session_cgroup(cg)
    trace = directory / TRACE
    if trace.exists():
        recorder = Recorder(trace, arm=state["arm"], executor=state["executor"], workspace=state["workspace"],
                            resume=True, manifest=True, shared=True)
        recorder.finish()
    (directory / STATE).unlink()
    return trace if trace.exists() else None
