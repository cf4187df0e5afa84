"""The executors, one module each, behind one registry (`make_executor`): emulate.py (the recorded
resource profile), sandbox.py (the real command under bubblewrap), docker.py (the real command in a
container of engines/docker.py); base.py holds what they share.

May import: traces/, proc, errors, engines/. Never cgroups/ or anything above.
"""
import warnings

from ...errors import ExecutorUnavailable
from .base import EXECUTING_TOOLS, Launch, StepRefused
from .docker import DockerExecutor
from ..emulator_build import emulator_binary
from .emulate import EmulateExecutor
from .sandbox import SandboxExecutor

__all__ = ["EXECUTING_TOOLS", "emulator_binary", "ExecutorUnavailable", "Launch", "StepRefused",
           "EmulateExecutor", "SandboxExecutor", "DockerExecutor", "make_executor"]


_warned_time_scale = False


def make_executor(name: str, *, time_scale: float, step_timeout_s: float, engine=None, cgroup_parent: str | None = None):
    """emulate | sandbox | docker (the docker executor needs an `engine`: engines.docker.DockerEngine).

    `time_scale` applies to `emulate` only: sandbox and docker run real commands, which take as long
    as they take, and their executors say `time_scale = 1` (records, policy timers). A time scale
    other than 1 for them is a warning, once per process, not an error: the shipped config's
    default (0.05) is the emulator's."""
    global _warned_time_scale
    if name in ("sandbox", "docker") and time_scale != 1.0 and not _warned_time_scale:
        _warned_time_scale = True
        warnings.warn(f"time_scale {time_scale} applies to the emulate executor only: the {name} executor "
                      "runs real commands at real speed (recorded durations and policy timers at scale 1)",
                      stacklevel=2)
    if name == "emulate":
        return EmulateExecutor(time_scale=time_scale, step_timeout_s=step_timeout_s)
    if name == "sandbox":
        return SandboxExecutor(step_timeout_s=step_timeout_s)
    if name == "docker":
        return DockerExecutor(engine, cgroup_parent=cgroup_parent, step_timeout_s=step_timeout_s)
    raise ValueError(f"unknown executor {name!r}; expected emulate, sandbox or docker")
