"""A live session's trace in the IR (traces/ir.py, agentcgroup-trace/1), written as the session runs.

Each call is a `bash` step: its command and cwd (redacted: redact.py), its timeout, its recorded
outcome (ok | failed | timeout | oom | error, with the exit code where the command exited) and the
head of its output (redacted), its duration and its profile — peak_mb and cpu_ms from the call's
cgroup, and the memory curve sampled while it ran — all `recorded`: measured here, for this call.
Environment values are never written. The file is replaced whole after every call (written beside
it, then renamed), so it is a complete, valid trace at any moment the session has made a call.
With `shared` (several processes add calls to one file: `agentcgroup exec` calls at once), each
write happens under a lock on the file and first takes in the steps the others wrote.
With `manifest`, the trace is also listed in a manifest.json beside it (subset SUBSET; sessions
sharing a directory update it under a lock on .manifest.lock there): its
directory is then a corpus the plugin replays (`--agentcgroup-traces DIR --agentcgroup-subset live`).
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import threading
from pathlib import Path

from ..replay.replayer import OUTPUT_HEAD_CHARS
from ..traces.corpus import update_manifest
from ..traces.ir import Curve, Measure, Outcome, Profile, Step, Trace, TraceError, read_traces
from .redact import redact

MB = 1024 * 1024
FORMAT = "agentcgroup-live"
SUBSET = "live"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Recorder:
    def __init__(self, path: str | Path, *, arm: str, executor: str, workspace: str, resume: bool = False,
                 manifest: bool = False, shared: bool = False, trace_id: str | None = None):
        self.path, self.manifest, self.shared = Path(path), manifest, shared
        self.path.parent.mkdir(parents=True, exist_ok=True)     # before the first call, not after it ran
        self._lock = threading.Lock()
        self.steps: list[Step] = []
        started = _now()
        # `trace_id`: the caller's, where one process runs several sessions at once (a corpus needs them apart)
        self.trace_id = trace_id or f"live/{arm}/{started.replace(':', '').replace('+0000', 'Z')}-{os.getpid()}"
        self.source = {"format": FORMAT, "recorded_by": "agentcgroup live session (live/)", "arm": arm,
                       "executor": executor, "workspace": workspace, "started_at": started}
        if resume and self.path.exists():
            trace = self._read()
            self.trace_id, self.source, self.steps = trace.trace_id, dict(trace.source), list(trace.steps)

    def _read(self) -> Trace:
        try:
            return next(read_traces(self.path))
        except (TraceError, StopIteration) as exc:
            raise TraceError(f"cannot continue the session's trace: {exc}", file=str(self.path)) from None

    @contextlib.contextmanager
    def _file_locked(self):
        """An exclusive flock on a lock file beside the trace (shared traces only)."""
        if not self.shared:
            yield
            return
        fd = os.open(self.path.with_name(f".{self.path.name}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self.path.exists():          # what the other processes wrote meanwhile
                mine = {s.step_id for s in self.steps}
                self.steps += [s for s in self._read().steps if s.step_id not in mine]
            yield
        finally:
            os.close(fd)

    @property
    def next_step_id(self) -> int:
        return max((s.step_id for s in self.steps), default=-1) + 1

    def add(self, result, curve: list[tuple[float, int]], *, secrets: list[str]) -> None:
        """The call `result` (session.py CallResult) as a step, and the trace written again."""
        step = call_step(result, curve, secrets)
        with self._lock, self._file_locked():
            self.steps = [s for s in self.steps if s.step_id != step.step_id] + [step]
            self.write()

    def finish(self) -> None:
        """The session has ended: said in the trace's source (when it made any call)."""
        with self._lock, self._file_locked():
            self.source["ended_at"] = _now()
            self.write()

    def write(self) -> None:
        if not self.steps:
            return                          # a trace needs at least one step
        steps = tuple(sorted(self.steps, key=lambda s: s.step_id))
        trace = Trace(self.trace_id, self.source, steps)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(trace.dumps() + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
        if self.manifest:
            entry = {"trace_id": self.trace_id, "file": self.path.name, "steps": len(steps), "format": FORMAT}
            # one manifest for the directory's sessions (Inspect's samples at once): read, merged, replaced
            # by one writer at a time, threads of this process included (flock holds per open file)
            fd = os.open(self.path.parent / ".manifest.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                update_manifest(self.path.parent, (), [entry], {SUBSET: [self.trace_id]}, merge=True)
            finally:
                os.close(fd)


def call_step(result, curve: list[tuple[float, int]], secrets: list[str]) -> Step:
    """One call as an IR step: every figure `recorded`, every text redacted."""
    if result.error is not None:
        outcome = Outcome("error", None)
    elif result.timed_out:
        outcome = Outcome("timeout", None)
    elif result.kill_cause in ("memory", "policy"):
        outcome = Outcome("oom", result.exit_code)
    else:
        outcome = Outcome("ok" if result.exit_code == 0 else "failed", result.exit_code)
    profile = {}
    if result.peak_mb is not None:
        profile["peak_mb"] = Measure(round(result.peak_mb, 3), "recorded")
    if result.cpu_ms is not None:
        profile["cpu_ms"] = Measure(round(result.cpu_ms, 3), "recorded")
    if len(curve) >= 2:
        profile["curve"] = Curve(tuple(round(t, 2) for t, _ in curve), tuple(round(v / MB, 3) for _, v in curve),
                                 "recorded")
    command = redact(result.command, secrets)
    args = {"command": command, "cwd": redact(result.cwd, secrets), "timeout_ms": result.timeout_s * 1000.0}
    # the command's own output, without the note (the note is ours; the outcome says the kill)
    own = result.own_output
    return Step(step_id=result.call_id, tool="bash", native_tool="live", args=args,
                duration_ms=Measure(round(result.duration_ms, 3), "recorded") if result.error is None else None,
                profile=Profile(**profile), recorded_outcome=outcome,
                recorded_output=redact(own.rstrip("\n")[:OUTPUT_HEAD_CHARS], secrets))
