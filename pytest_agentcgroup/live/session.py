"""A live agent session: the tool calls of an agent someone runs, one at a time or several at once,
each in a cgroup of its own under the session's, with an arm's limits, as a replay places its steps.

    with AgentSession(arm="static-toolcall", workspace="/src/proj", trace_out="run.json") as s:
        r = s.run("python -m pytest -x", timeout_s=600)
        r.exit_code, r.killed, r.note, r.peak_mb      # r.output ends with the note when there is one

Each call: a CallStep (traces/ir.py Step, tool bash) handed to an ArmPlacement (cgroups/placement.py:
the cgroup `s<n>` under the session's, the arm's limits on it or, for a trace-scope arm, on the
session's cgroup; a policy arm's controller acting on it), its command run with join-before-exec
(proc.py) by the host's /bin/sh in `cwd` or by the sandbox executor (replay/executors/sandbox.py:
as nobody, no network, a bounded workspace copied from `workspace`), its output's head kept.

When the command has ended, whatever it left running in its cgroup (background processes, daemons)
is killed with the cgroup, as a replay's stragglers are; the result counts them (`background_killed`)
and the note says so. The timeout is wall-clock: time a call spends held at a memory limit (a soft
limit that throttles, a policy's hold or freeze) counts against it, and `stall_ms` (the call's PSI
memory stall, where the kernel keeps it) says how much of the call that was.

The trace (recorder.py) is rewritten after every call, so what a session did is on disk as it runs.

May import (as live/): cgroups/, replay/, bpf/, traces/, profile/, config, notes, proc, errors, arms.
"""
from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..arms import Arm, Rules
from ..bpf.controller import missing_features, policy_for
from ..bpf.loader import BPFUnavailable
from ..cgroups.host import detect
from ..cgroups.node import MB
from ..cgroups.placement import ArmPlacement, apply_limits
from ..cgroups.usage import UsageSampler
from ..config import ConfigError, load
from ..notes import background_note, stopped_note
from ..proc import SpawnError, run
from ..profile.meter import SAMPLE_PERIOD_S
from ..replay.executors import SandboxExecutor
from ..replay.executors.base import DEFAULT_TIMEOUT_S, Seed, SeedFailed, StepRefused
from ..traces.classify import step_kind
from ..traces.ir import Step, Trace
from .cgroup import describe, make_session_cgroup, remove_session_cgroup, reopen_session_cgroup
from .recorder import Recorder

EXECUTORS = ("host", "sandbox")
OUTPUT_MAX_BYTES = 64 * 1024           # what a result keeps of a call's output (its head)
#: the checkout's shipped arms, used when no config is given
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "agentcgroup.toml"
#: inherited variables whose values are redacted from the trace wherever they appear
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


class SessionError(ValueError):
    """A session that cannot start or a call that cannot be made as asked; the message says why."""


@dataclass
class CallResult:
    """One tool call's outcome. Every number is recorded on this host for this call."""
    call_id: int
    command: str
    cwd: str
    exit_code: int | None       # the command's exit status; 128 + signal when a signal ended it; None: not started
    output: str                 # the head of stdout+stderr (OUTPUT_MAX_BYTES), then the note when there is one
    output_truncated: bool      # the command printed more than the head kept
    duration_ms: float          # wall time, spawn to reap
    timeout_s: float            # the call's timeout (wall-clock: a stall at a memory limit counts)
    cpu_ms: float | None        # user + system CPU of the call's cgroup (cpu.stat); None where not read
    peak_mb: float | None       # the call's cgroup's memory peak (v2 memory.peak, v1 max_usage_in_bytes)
    oom_kills: int              # OOM kills in the call's cgroup (and the session's, for a trace-scope limit)
    throttles: int              # times held at a soft limit: memory.high events / crossings, the policy's throttles
    stall_ms: float | None      # PSI memory stall of the call's cgroup (some total); None where not kept
    limit_mb: float | None      # the hard memory limit that applied (the call's, or the session's shared one)
    limit_why: str              # which rule of the arm set it
    killed: bool                # stopped by its limit, the arm's policy or its timeout
    kill_cause: str | None      # memory | policy | timeout (notes.py CAUSES)
    timed_out: bool
    background_killed: int      # processes it left running, killed with its cgroup at its end
    note: str | None            # what the agent is told (notes.py), also appended to `output`
    error: str | None = None    # why it could not start

    # the command's own output (`output` without the note), for a caller that shows the note apart
    own_output: str = field(default="", repr=False)

    def to_json(self) -> dict:
        out = asdict(self)
        del out["own_output"]
        return out


def load_arm(arm: str | Arm, config: str | Path | None) -> Arm:
    """The arm named `arm` in `config` (default: the checkout's experiments/agentcgroup.toml)."""
    if isinstance(arm, Arm):
        return arm
    path = Path(config) if config is not None else DEFAULT_CONFIG
    try:
        arms = load(path).arms
    except ConfigError as exc:
        raise SessionError(str(exc)) from None
    if arm not in arms:
        raise SessionError(f"{path}: no arm {arm!r}; arms: {', '.join(sorted(arms))}")
    return arms[arm]


def limit_rule(arm: Arm) -> tuple[float | None, str]:
    """The hard memory limit a call runs under, and the arm's rule that sets it, in words."""
    if arm.policy is not None:
        return arm.memory_max_mb, (f"arm {arm.name}: policy {arm.policy}, soft limit memory_high_mb = "
                                   f"{arm.memory_high_mb} and ceiling memory_max_mb = {arm.memory_max_mb} on each call")
    if arm.memory_max_mb is None:
        return None, f"arm {arm.name}: no hard memory limit" + (
            f" (soft limit memory_high_mb = {arm.memory_high_mb}, scope {arm.scope})" if arm.memory_high_mb else "")
    where = "each call's cgroup" if arm.scope == "step" else "the session's cgroup, shared by its calls"
    return arm.memory_max_mb, f"arm {arm.name}: memory_max_mb = {arm.memory_max_mb} on {where} (scope {arm.scope})"


class AgentSession:
    """One agent's session under an arm (module docstring). `executor`: "host" (the command as this
    process's user, in `workspace` or the call's cwd) or "sandbox" (replay/executors/sandbox.py).
    `trace_out`: where the session's trace is written after every call (None: not recorded).
    `curve`: sample each call's memory every SAMPLE_PERIOD_S into the trace's curve; `manifest`:
    list the trace in a manifest.json beside it, making its directory a corpus (recorder.py).
    `resume`: a session cgroup kept by an earlier process (cgroup.py describe(); the CLI's), with
    the trace at `trace_out` continued (shared: other processes may add calls to it at once);
    `keep_cgroup`: leave the session's cgroup at exit; `next_call_id`: the id (and cgroup `s<id>`)
    of the next call, where the processes sharing a session hand them out (stored.py); `trace_id`:
    the trace's id (default: live/<arm>/<start time>-<pid>)."""

    def __init__(self, arm: str | Arm = "static-toolcall", config: str | Path | None = None, *,
                 workspace: str | Path = ".", executor: str = "host", trace_out: str | Path | None = None,
                 curve: bool = True, manifest: bool = False, resume: dict | None = None,
                 keep_cgroup: bool = False, next_call_id: int | None = None, trace_id: str | None = None):
        if executor not in EXECUTORS:
            raise SessionError(f"executor: expected one of {', '.join(EXECUTORS)}, got {executor!r}")
        self.arm = load_arm(arm, config)
        if self.arm.limit_from is not None:
            # step_peak knows the call's own peak in advance; vpa/window/predict read a recorded trace's steps
            raise SessionError(f"arm {self.arm.name}: limit_from = {self.arm.limit_from!r} sets each step's limit from a "
                               "replayed trace, which a live session has not; use an arm with fixed limits or a policy")
        self.workspace = Path(workspace).resolve()
        if not self.workspace.is_dir():
            raise SessionError(f"workspace {self.workspace}: not a directory")
        self.executor_name, self.curve, self.keep_cgroup = executor, curve, keep_cgroup
        self.limit_mb, self.limit_why = limit_rule(self.arm)
        self.recorder = Recorder(trace_out, arm=self.arm.name, executor=executor, workspace=str(self.workspace),
                                 resume=resume is not None, manifest=manifest,
                                 shared=resume is not None or keep_cgroup, trace_id=trace_id) \
            if trace_out is not None else None
        self._lock = threading.Lock()
        self._next_id = next_call_id if next_call_id is not None else \
            self.recorder.next_step_id if self.recorder else 0
        self.cgroup = self.policy = self.sandbox = None
        self.resume = resume

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "AgentSession":
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> None:
        host = detect()
        if self.resume is not None:
            self.cgroup, self.controllers = reopen_session_cgroup(host, self.resume, "resume")
        else:
            self.cgroup, self.controllers = make_session_cgroup(host)
        try:
            if self.arm.scope == "trace":          # the session's limit, before any call shares it
                apply_limits(self.arm, self.cgroup)
            if self.arm.policy is not None:
                missing = missing_features(Rules.from_arm(self.arm))
                if missing:
                    raise SessionError(f"arm {self.arm.name}: its policy cannot run here: {missing}")
                self.policy = policy_for(self.arm)
                self.policy.start()
            if self.executor_name == "sandbox":
                self.sandbox = SandboxExecutor(step_timeout_s=DEFAULT_TIMEOUT_S)
                ws = str(self.workspace)
                self.sandbox.seed = Seed(path=ws, source=self.workspace)
                self.sandbox.start(Trace("live", {}, (Step(0, "noop", args={"cwd": ws}),)))
        except BaseException as exc:
            keep, self.keep_cgroup = self.keep_cgroup, self.keep_cgroup and self.resume is not None
            try:
                self.close()                   # a cgroup made here goes with a session that did not start
            finally:
                self.keep_cgroup = keep
            if isinstance(exc, (SeedFailed, BPFUnavailable)):
                raise SessionError(f"the session cannot start: {exc}") from None
            raise

    @property
    def described_cgroup(self) -> dict:
        """The session's cgroup as a later process reopens it (AgentSession(resume=...))."""
        return describe(self.cgroup, self.controllers)

    def close(self) -> None:
        sandbox, self.sandbox = self.sandbox, None
        policy, self.policy = self.policy, None
        cg, self.cgroup = self.cgroup, None
        try:
            if sandbox is not None:
                sandbox.stop()
        finally:
            try:
                if policy is not None:
                    policy.close()
            finally:
                # kept: it holds no process (each call's cgroup is killed and removed at its end),
                # and other processes sharing the session may be running calls in it
                if cg is not None and not self.keep_cgroup:
                    remove_session_cgroup(cg)

    # -- one call --------------------------------------------------------------------------------
    def run(self, command: str, cwd: str | Path | None = None, env: dict | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S) -> CallResult:
        """Run `command` (a shell command line) as one tool call; thread-safe. `env`: variables set
        for this call on top of the session's environment (host executor only: the sandbox's
        environment is its own). Its values never reach the trace."""
        if self.cgroup is None:
            raise SessionError("the session is not open (use it as a context manager, or call open())")
        if not isinstance(command, str) or "\0" in command:
            raise SessionError("command: expected a shell command line (a str without NUL bytes)")
        if env and self.sandbox is not None:
            raise SessionError("env: the sandbox executor runs calls in its own fixed environment; "
                               "set variables in the command instead")
        if not timeout_s or timeout_s <= 0:
            raise SessionError(f"timeout_s: expected a positive number of seconds, got {timeout_s!r}")
        with self._lock:
            call_id, self._next_id = self._next_id, self._next_id + 1
        try:
            step, argv, run_cwd, run_env = self._launch(call_id, command, cwd, env, timeout_s)
        except StepRefused as exc:
            raise SessionError(str(exc)) from None
        result, curve = self._placed(step, argv, run_cwd, run_env, timeout_s)
        if self.recorder is not None:
            self.recorder.add(result, curve, secrets=self._secrets(env))
        return result

    def _launch(self, call_id: int, command: str, cwd, env: dict | None, timeout_s: float):
        """The call's step (its cwd: where it runs) and how to start it: on the host, /bin/sh in `cwd`
        (default the workspace); in the sandbox, its launch (the shell's last directory unless `cwd`)."""
        args = {"command": command, "timeout_ms": timeout_s * 1000.0}
        if self.sandbox is None:
            where = str(Path(cwd).resolve()) if cwd is not None else str(self.workspace)
            step = Step(call_id, "bash", args={**args, "cwd": where}, native_tool="live")
            return step, ["/bin/sh", "-c", command], where, {**os.environ, **(env or {})}
        with self._lock:                        # the sandbox keeps the shell's directory between calls
            launch = self.sandbox.launch(Step(call_id, "bash", args={**args, **({"cwd": str(cwd)} if cwd else {})}))
            where = self.sandbox.cwd
        return Step(call_id, "bash", args={**args, "cwd": where}, native_tool="live"), launch.argv, launch.cwd, \
            launch.env or None

    def _placed(self, step: Step, argv, cwd, env, timeout_s: float) -> tuple[CallResult, list]:
        with self._lock:       # limits on the shared session cgroup, its counters: one call at a time
            placement = ArmPlacement(self.arm, self.cgroup, self.controllers, policy=self.policy,
                                     kind_of=step_kind if self.policy is not None else None)
            if self.curve:
                placement.sampler = UsageSampler(SAMPLE_PERIOD_S, keep_samples=True)
            join = placement.begin_step(step)
        cg = placement.step_cg
        error = proc = None
        left = 0
        stall = None
        try:
            proc = run(argv, join=join, cwd=cwd, env=env, timeout_s=timeout_s, kill=placement.kill_step,
                       output_head=OUTPUT_MAX_BYTES + 1)
        except SpawnError as exc:
            error = str(exc)
        finally:
            try:
                left = 0 if proc is None or proc.timed_out else _left_running(cg)
                stall = _stall_ms(cg)
                placement.kill_step()
                with self._lock:
                    counters = placement.end_step(step)
            finally:
                curve = list(placement.sampler.curve) if self.curve else []
                placement.close()
        return self._result(step, proc, error, counters, stall, left, timeout_s), curve

    def _result(self, step: Step, proc, error, c: dict, stall, left: int, timeout_s: float) -> CallResult:
        peak = c.get("peak_bytes")
        peak_mb = peak / MB if peak is not None else None
        oom, policy_kills = int(c.get("oom_kills", 0)), int(c.get("policy_kills", 0))
        # held at a soft limit: the policy's throttles and freezes; v2 memory.high throttles too (v1's
        # soft limit holds nothing: its events are crossings)
        held = int(c.get("throttles", 0)) + int(c.get("freezes", 0)) + \
            (int(c.get("high_events", 0)) if self.cgroup.host.mode == "v2" else 0)
        timed_out = bool(proc and proc.timed_out)
        cause = "timeout" if timed_out else "memory" if oom else "policy" if policy_kills else None
        if proc is None:
            exit_code, raw = None, b""
        else:
            exit_code = proc.exit_code if proc.signal is None else 128 + proc.signal
            raw = proc.output or b""
        own = output = raw[:OUTPUT_MAX_BYTES].decode("utf-8", "replace")
        if cause == "memory":
            note = stopped_note("memory", limit_mb=self.limit_mb, used_mb=peak_mb, scope=self.arm.scope, background=left)
        elif cause == "policy":
            note = stopped_note("policy", limit_mb=self.arm.memory_high_mb, used_mb=peak_mb, background=left)
        elif cause == "timeout":
            note = stopped_note("timeout", timeout_s=timeout_s, stall_ms=stall, held=held)
        else:
            note = background_note(left)
        if note:
            output += ("" if not output or output.endswith("\n") else "\n") + note + "\n"
        return CallResult(call_id=step.step_id, command=step.command, cwd=step.args["cwd"], exit_code=exit_code,
                          output=output, output_truncated=len(raw) > OUTPUT_MAX_BYTES,
                          duration_ms=proc.wall_ms if proc is not None else 0.0, timeout_s=timeout_s,
                          cpu_ms=c["cpu_usec"] / 1000.0 if c.get("cpu_usec") is not None else None,
                          peak_mb=peak_mb, oom_kills=oom,
                          throttles=int(c.get("high_events", 0)) + int(c.get("throttles", 0)), stall_ms=stall,
                          limit_mb=self.limit_mb, limit_why=self.limit_why, killed=cause is not None,
                          kill_cause=cause, timed_out=timed_out, background_killed=left, note=note, error=error,
                          own_output=own)

    def _secrets(self, env: dict | None) -> list[str]:
        """Values the trace must not carry: the call's own variables, and inherited ones named like secrets."""
        return [*(str(v) for v in (env or {}).values()),
                *(v for k, v in os.environ.items() if SECRET_NAME.search(k))]


def _left_running(cg, grace_s: float = 0.1) -> int:
    """Processes still in the call's cgroup once its command has ended: what it left running. Those
    on their way out (a sandbox's namespace init as its parent exits) get `grace_s` to go."""
    deadline = time.monotonic() + grace_s
    while cg.populated() and time.monotonic() < deadline:
        time.sleep(0.005)
    return len(cg.pids())


def _stall_ms(cg) -> float | None:
    """The cgroup's PSI memory stall so far ("some" total, µs -> ms); None where PSI is not kept."""
    try:
        text = (cg.unified / "memory.pressure").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            total = dict(kv.split("=", 1) for kv in line.split()[1:]).get("total")
            return int(total) / 1000.0 if total and total.isdigit() else None
    return None
