"""Inspect's sandbox environment `agentcgroup` on the live runtime: each sample gets an AgentSession
(session.py) of its own, and each command a tool runs in it (`sandbox().exec`, e.g. the bash tool's) is
one tool call in a cgroup of its own under the chosen arm; a call its arm stopped returns the note
(notes.py) on stderr, which Inspect's bash and python tools put before the output (docs/live.md).

Registered through Inspect's entry point (pyproject.toml, group `inspect_ai`), so a task names it:

    Task(..., sandbox="agentcgroup")                                  # the default arm, no trace
    Task(..., sandbox=("agentcgroup", "static-toolcall"))             # an arm's name, or a TOML file of
                                                                      # AgentCgroupSandboxConfig's fields
    Task(..., sandbox=SandboxEnvironmentSpec("agentcgroup", AgentCgroupSandboxConfig(arm=..., trace_dir=...)))

Each sample runs in a directory of its own: a copy of `workspace`, or an empty one, removed at the
sample's end. Calls run on the host executor, as this user (the sample's files are written and read
there directly, which the sandbox executor's private copy would not allow). stdout carries the
command's stdout and stderr together (the session keeps them as one stream, in order), stderr the
note. A call that ran past its timeout raises TimeoutError with the note as its message, as
Inspect's contract for exec asks.

This module imports Inspect at its top: only Inspect's entry point loads it.
May import (as live/): the live runtime's own modules.
"""
from __future__ import annotations

import os
import pwd
import re
import secrets
import shlex
import shutil
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Literal, Union, overload

import anyio
from inspect_ai.util import (ExecResult, OutputLimitExceededError, SandboxEnvironment, SandboxEnvironmentConfigType,
                             SandboxEnvironmentLimits, SandboxUserUnsupportedError, sandboxenv)
from pydantic import BaseModel, ConfigDict, ValidationError

from .session import AgentSession, SessionError

NAME = "agentcgroup"
DEFAULT_ARM = "static-toolcall"


class AgentCgroupSandboxConfig(BaseModel):
    """The `agentcgroup` sandbox's configuration (a task's SandboxEnvironmentSpec config)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    arm: str = DEFAULT_ARM
    """an arm of `config`"""
    config: str | None = None
    """the TOML the arm is read from (default: the checkout's experiments/agentcgroup.toml)"""
    workspace: str | None = None
    """a directory each sample starts from (copied); None: each sample starts in an empty directory"""
    trace_dir: str | None = None
    """where each sample's trace is written (<task>-<id>.json, listed in manifest.json: a corpus)"""
    timeout_s: float = 600.0
    """a call's wall-clock timeout when the caller gives none (Inspect's own set-up commands give none)"""


def _config(config: SandboxEnvironmentConfigType | None) -> AgentCgroupSandboxConfig:
    if config is None:
        return AgentCgroupSandboxConfig()
    if isinstance(config, str):
        # Inspect hands a config string on as a path, resolved against the task's directory
        path = Path(config)
        if not path.is_file():
            return AgentCgroupSandboxConfig(arm=path.name)
        try:
            fields = tomllib.loads(path.read_text(encoding="utf-8"))
            base = path.parent
            for key in ("config", "workspace", "trace_dir"):      # relative to the file, as Inspect's own are
                if isinstance(fields.get(key), str):
                    fields[key] = str(base / fields[key])
            return AgentCgroupSandboxConfig(**fields)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SessionError(f"{path}: not an agentcgroup sandbox config: {exc}") from None
        except ValidationError as exc:
            why = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise SessionError(f"{path}: not an agentcgroup sandbox config: {why}") from None
    if isinstance(config, AgentCgroupSandboxConfig):
        return config
    raise SessionError(f"sandbox {NAME!r}: config: expected an arm's name or an AgentCgroupSandboxConfig, "
                       f"got {type(config).__name__}")


def _is_current_user(user: str) -> bool:
    try:
        uid = int(user) if user.isdecimal() else pwd.getpwnam(user).pw_uid
    except KeyError:
        return False
    return uid == os.geteuid()


@sandboxenv(name=NAME)
class AgentCgroupSandboxEnvironment(SandboxEnvironment):
    """One sample's session: its directory, its AgentSession, a private directory for stdin files."""

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return AgentCgroupSandboxConfig(**config)

    @classmethod
    async def sample_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                          metadata: dict[str, str]) -> dict[str, SandboxEnvironment]:
        cfg = _config(config)
        private = Path(tempfile.mkdtemp(prefix="agentcgroup-inspect-"))
        directory = private / "workspace"
        if cfg.workspace is not None and not Path(cfg.workspace).is_dir():
            shutil.rmtree(private, ignore_errors=True)
            raise SessionError(f"sandbox {NAME!r}: config workspace: {cfg.workspace} is not a directory")
        try:
            if cfg.workspace is not None:
                await anyio.to_thread.run_sync(lambda: shutil.copytree(cfg.workspace, directory, symlinks=True))
            else:
                directory.mkdir()
            label = f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', task_name)}-{secrets.token_hex(4)}"
            trace_out = Path(cfg.trace_dir) / f"{label}.json" if cfg.trace_dir else None
            session = AgentSession(cfg.arm, cfg.config, workspace=directory, executor="host", trace_out=trace_out,
                                   manifest=trace_out is not None, trace_id=f"live/{cfg.arm}/inspect/{label}")
            await anyio.to_thread.run_sync(session.open)
        except BaseException:
            shutil.rmtree(private, ignore_errors=True)
            raise
        return {"default": cls(session, private, cfg.timeout_s)}

    @classmethod
    async def sample_cleanup(cls, task_name: str, config: SandboxEnvironmentConfigType | None,
                             environments: dict[str, SandboxEnvironment], interrupted: bool) -> None:
        for environment in environments.values():
            await anyio.to_thread.run_sync(environment.as_type(cls).close)

    def __init__(self, session: AgentSession, private: Path, timeout_s: float) -> None:
        super().__init__()
        self.session, self.private, self.timeout_s = session, private, timeout_s
        self.directory = session.workspace

    def close(self) -> None:
        try:
            self.session.close()
            if self.session.recorder is not None:
                self.session.recorder.finish()          # the trace's source says when the sample ended
        finally:
            shutil.rmtree(self.private, ignore_errors=True)

    async def exec(self, cmd: list[str], input: str | bytes | None = None, cwd: str | None = None,
                   env: dict[str, str] | None = None, user: str | None = None, timeout: int | None = None,
                   timeout_retry: bool = True, concurrency: bool = True) -> ExecResult[str]:
        if user is not None and not _is_current_user(user):
            raise SandboxUserUnsupportedError(
                f"sandbox {NAME!r} runs commands as this process's user only, not {user!r}")
        command = shlex.join(cmd)
        stdin = None
        if input is not None:           # the command reads it from a file of the sample's private directory
            stdin = self.private / f"stdin-{secrets.token_hex(6)}"
            stdin.write_bytes(input.encode() if isinstance(input, str) else input)
            command += f" < {shlex.quote(str(stdin))}"
        where = self.directory / cwd if cwd is not None else self.directory
        try:
            result = await anyio.to_thread.run_sync(
                lambda: self.session.run(command, cwd=where, env=env, timeout_s=timeout or self.timeout_s))
        finally:
            if stdin is not None:
                stdin.unlink(missing_ok=True)
        if result.timed_out:
            raise TimeoutError(result.note)
        if result.error is not None:
            return ExecResult(False, 126, "", f"the command could not start: {result.error}")
        ok = result.exit_code == 0 and not result.killed
        return ExecResult(ok, result.exit_code, result.own_output, result.note or "")

    def _resolve(self, file: str) -> Path:
        return Path(file) if Path(file).is_absolute() else self.directory / file

    async def write_file(self, file: str, contents: str | bytes) -> None:
        path = self._resolve(file)
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(contents, str):
            path.write_text(contents, encoding="utf-8")
        else:
            path.write_bytes(contents)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> Union[str | bytes]:
        path = self._resolve(file)
        size = path.stat().st_size
        if size > SandboxEnvironmentLimits.MAX_READ_FILE_SIZE:
            raise OutputLimitExceededError(limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR,
                                           truncated_output=None)
        if text:
            with open(path, encoding="utf-8", newline="") as f:
                return f.read()
        return path.read_bytes()
