"""mini-swe-agent's environment on the live runtime: each action the agent takes runs as one tool call
of an AgentSession (session.py), in a cgroup of its own under the chosen arm; a call its arm stopped
comes back to the agent with the note (notes.py) at the end of its output (docs/live.md).

mini-swe-agent resolves `environment_class` as a dotted import path, so its config names this class:

    environment:
      environment_class: pytest_agentcgroup.live.mini_swe_agent.AgentCgroupEnvironment
      arm: static-toolcall          # an arm of `config` (default: the checkout's experiments/agentcgroup.toml)
      trace_out: run/trace.json     # the session's trace, written after every action

or its Python API: `DefaultAgent(model, AgentCgroupEnvironment(arm=...), **agent_config)`.

The session is opened when the environment is made (a missing cgroup or an unknown arm stops the
run before the first model call) and closed by `close()`, or when the environment is collected
or the interpreter exits (mini itself has no end-of-run hook for its environment).

Imports mini-swe-agent only inside the methods that use it: the package works without it.
May import (as live/): the live runtime's own modules.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import weakref
from pathlib import Path
from typing import Any

from ..replay.executors.base import DEFAULT_TIMEOUT_S
from .session import EXECUTORS, AgentSession, SessionError

#: the first output line by which a mini-swe-agent action submits (its LocalEnvironment's rule)
SUBMIT_LINE = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: the fields of CallResult an observation carries in `extra.agentcgroup` (the rest is in `output`)
RESULT_FIELDS = ("call_id", "exit_code", "duration_ms", "cpu_ms", "peak_mb", "oom_kills", "throttles", "stall_ms",
                 "limit_mb", "limit_why", "killed", "kill_cause", "timed_out", "background_killed", "note", "error")


@dataclasses.dataclass
class AgentCgroupEnvironmentConfig:
    """The `environment:` section of a mini-swe-agent config (besides `environment_class`)."""
    arm: str = "static-toolcall"    # an arm of `config`
    config: str | None = None       # the TOML of the arm (default: the checkout's experiments/agentcgroup.toml)
    executor: str = "host"          # host | sandbox (session.py EXECUTORS)
    cwd: str = ""                   # where actions run, and the session's workspace (default: the current directory)
    env: dict[str, str] = dataclasses.field(default_factory=dict)   # set for every action (host executor)
    timeout: float = DEFAULT_TIMEOUT_S          # seconds, each action's wall-clock timeout
    trace_out: str | None = None    # the session's trace (None: not recorded)
    manifest: bool = False          # list the trace in a manifest.json beside it (its directory a corpus)
    curve: bool = True              # sample each call's memory into the trace

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        """The config as plain data (the name mini-swe-agent's own configs give it)."""
        return dataclasses.asdict(self)


class AgentCgroupEnvironment:
    """mini-swe-agent's Environment protocol (execute, get_template_vars, serialize) on an AgentSession."""

    def __init__(self, **kwargs):
        names = {f.name for f in dataclasses.fields(AgentCgroupEnvironmentConfig)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise SessionError(f"environment: unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                               f"expected some of environment_class, {', '.join(sorted(names))}")
        self.config = AgentCgroupEnvironmentConfig(**kwargs)
        c = self.config
        if c.executor not in EXECUTORS:
            raise SessionError(f"environment.executor: expected one of {', '.join(EXECUTORS)}, got {c.executor!r}")
        if c.executor == "sandbox" and c.env:
            raise SessionError("environment.env: the sandbox executor runs actions in its own fixed environment; "
                               "set it to {} (or use executor: host)")
        if not isinstance(c.timeout, (int, float)) or c.timeout <= 0:
            raise SessionError(f"environment.timeout: expected a positive number of seconds, got {c.timeout!r}")
        self.session = AgentSession(c.arm, c.config, workspace=c.cwd or os.getcwd(), executor=c.executor,
                                    trace_out=c.trace_out, curve=c.curve, manifest=c.manifest)
        self.session.open()
        # mini-swe-agent never closes its environment: the session ends at collection or exit
        self._closer = weakref.finalize(self, _end, self.session)

    def close(self) -> None:
        """End the session: its cgroup removed, its trace (written after every action) marked ended."""
        self._closer()

    def execute(self, action: dict, cwd: str = "", *, timeout: float | None = None) -> dict[str, Any]:
        """Run one action (`{"command": ...}`) as a tool call; the output ends with the note when the
        arm stopped it. Raises mini-swe-agent's Submitted for the submit line, as its own environments do."""
        command = action.get("command", "")
        where = cwd or self.config.cwd or None
        result = self.session.run(command, cwd=where if self.config.executor == "host" or cwd else None,
                                  env=self.config.env or None, timeout_s=timeout or self.config.timeout)
        measured = {k: v for k, v in result.to_json().items() if k in RESULT_FIELDS}
        out = {"output": result.output, "returncode": result.exit_code if result.exit_code is not None else -1,
               "exception_info": f"the command could not start: {result.error}" if result.error else "",
               "extra": {"agentcgroup": measured}}
        lines = result.own_output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_LINE and result.exit_code == 0 and not result.killed:
            from minisweagent.exceptions import Submitted
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return out

    def get_template_vars(self, **kwargs) -> dict[str, Any]:
        from minisweagent.utils.serialize import recursive_merge
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), dict(os.environ), kwargs)

    def serialize(self) -> dict:
        config = self.config.model_dump(mode="json")
        if config["trace_out"] is not None:
            config["trace_out"] = str(Path(config["trace_out"]).resolve())
        out = {"info": {"config": {"environment": config,
                                   "environment_type": f"{type(self).__module__}.{type(self).__name__}"}}}
        if self.session.cgroup is not None:        # where its calls ran, and the trace it writes
            recorder = self.session.recorder
            out["info"]["agentcgroup"] = {"session_cgroup": self.session.described_cgroup["paths"]["unified"],
                                          "arm": self.session.arm.name,
                                          "trace_id": recorder.trace_id if recorder else None}
        return out


def _end(session: AgentSession) -> None:
    try:
        session.close()
    finally:
        if session.recorder is not None:
            session.recorder.finish()
