"""Replay: turn trace steps into processes (emulated or sandboxed) and run them in order."""
from .browser import BrowserTenant
from .docker_executor import DockerExecutor
from .executors import EmulateExecutor, ExecutorUnavailable, SandboxExecutor, StepRefused, make_executor
from .replayer import Placement, StepResult, replay

__all__ = ["EmulateExecutor", "SandboxExecutor", "DockerExecutor", "BrowserTenant",
           "ExecutorUnavailable", "StepRefused", "make_executor",
           "Placement", "StepResult", "replay"]
