"""Replay one trace, step after step, each step in the place (cgroup) its arm gives it.

The replayer knows nothing of cgroups: a `Placement` prepares a step's cgroup and hands back the
cgroup.procs files the step's process joins before exec; after the process has ended it reads the
counters and tears the step's cgroup down. This keeps replay below cgroups in the data flow.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

from ..traces.ir import Step, Trace
from .executors import StepRefused
from ..proc import SpawnError, run


OUTPUT_HEAD_CHARS = 2000                       # what a result keeps of a step's output: its head
OUTPUT_HEAD_BYTES = 4 * OUTPUT_HEAD_CHARS      # what is read of it, in UTF-8's widest


class Placement(Protocol):
    def begin_step(self, step: Step) -> list[str]: ...      # cgroup.procs files to join (or a proc.Parked)
    def kill_step(self) -> None: ...                        # end everything in the step's cgroup
    def end_step(self, step: Step) -> dict[str, float]: ... # counters after exit; removes the cgroup


@dataclass
class StepResult:
    trace_id: str
    step_id: int
    tool: str
    cmd: str | None
    executed: bool              # False: the step executes nothing here (edit/read/noop under sandbox)
    latency_ms: float | None    # wall time, spawn to reap
    exit_code: int | None
    signal: int | None
    timed_out: bool
    profile_source: str         # provenance of the replayed profile: recorded|derived|synthetic|none
    counters: dict[str, float] = field(default_factory=dict)
    error: str | None = None    # why the step could not be started (or, for a browser action, failed)
    measures: dict[str, float] = field(default_factory=dict)   # executor-specific, e.g. page_load_ms
    output: str | None = None   # the head of what it printed (stdout and stderr), where read

    def to_json(self) -> dict:
        return asdict(self)


def replay(trace: Trace, executor, placement: Placement, *,
           on_step: Callable[[StepResult], None] | None = None) -> list[StepResult]:
    results = []
    # optional Placement hooks: tidy() between steps (off every step's critical path), close() at the end
    tidy, close = getattr(placement, "tidy", None), getattr(placement, "close", None)
    executor.start(trace)
    try:
        for step in trace.steps:
            result = replay_step(trace, step, executor, placement)
            results.append(result)
            if on_step:
                on_step(result)
            if tidy and (result.executed or result.error):     # a step that could not start used the pool too
                tidy()
    finally:
        try:
            if close:
                close()
        finally:
            executor.stop()
    return results


def replay_step(trace: Trace, step: Step, executor, placement: Placement) -> StepResult:
    cmd = step.command if step.command is not None else (step.args.get("method") or step.native_tool)
    base = dict(trace_id=trace.trace_id, step_id=step.step_id, tool=step.tool, cmd=cmd,
                profile_source=step.profile.provenance() if executor.name == "emulate" else "none")
    try:
        launch = executor.launch(step)
    except StepRefused as exc:          # cannot run as recorded: said in the record, not executed
        return StepResult(**base, executed=False, latency_ms=None, exit_code=None, signal=None,
                          timed_out=False, error=str(exc))
    if launch is None:
        return StepResult(**base, executed=False, latency_ms=None, exit_code=None, signal=None, timed_out=False)
    join = placement.begin_step(step)
    error = None
    try:
        proc = run(launch.argv, join=join, cwd=launch.cwd, env=launch.env or None,
                   timeout_s=launch.timeout_s, kill=placement.kill_step, clock_env=launch.clock_env,
                   # only a step with a recorded outcome or output has an output to compare with: the
                   # others' go to /dev/null as before, unread (gigabytes of it cost nothing there)
                   output_head=OUTPUT_HEAD_BYTES if (step.recorded_outcome or step.outcome
                                                     or step.recorded_output is not None) else 0)
    except SpawnError as exc:
        error, proc = str(exc), None
    finally:
        # Stragglers (daemons the step left behind) die with the step: counters are read only
        # once nothing of the step runs any more.
        placement.kill_step()
        counters = placement.end_step(step)
    if proc is None:
        return StepResult(**base, executed=False, latency_ms=None, exit_code=None, signal=None,
                          timed_out=False, counters=counters, error=error)
    output = proc.output.decode("utf-8", "replace")[:OUTPUT_HEAD_CHARS] if proc.output is not None else None
    return StepResult(**base, executed=True, latency_ms=proc.wall_ms, exit_code=proc.exit_code,
                      signal=proc.signal, timed_out=proc.timed_out, counters=counters, output=output)
