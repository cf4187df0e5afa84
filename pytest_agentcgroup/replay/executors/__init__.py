"""The executors, one module each, behind one registry (`make_executor`): emulate.py (the recorded
resource profile), sandbox.py (the real command under bubblewrap), docker.py (the real command in a
container of engines/docker.py); base.py holds what they share.

May import: traces/, proc, errors, engines/. Never cgroups/ or anything above.
"""
from ...errors import ExecutorUnavailable
from .base import EXECUTING_TOOLS, Launch, StepRefused
from .docker import DockerExecutor
from .emulate import EMULATOR, EmulateExecutor
from .sandbox import SandboxExecutor

__all__ = ["EXECUTING_TOOLS", "EMULATOR", "ExecutorUnavailable", "Launch", "StepRefused",
           "EmulateExecutor", "SandboxExecutor", "DockerExecutor", "make_executor"]


def make_executor(name: str, *, time_scale: float, step_timeout_s: float, engine=None, cgroup_parent: str | None = None):
    """emulate | sandbox | docker (the docker executor needs an `engine`: engines.docker.DockerEngine)."""
    if name == "emulate":
        return EmulateExecutor(time_scale=time_scale, step_timeout_s=step_timeout_s)
    if name == "sandbox":
        return SandboxExecutor(step_timeout_s=step_timeout_s)
    if name == "docker":
        return DockerExecutor(engine, cgroup_parent=cgroup_parent, step_timeout_s=step_timeout_s)
    raise ValueError(f"unknown executor {name!r}; expected emulate, sandbox or docker")
