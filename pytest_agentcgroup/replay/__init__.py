"""Replay: turn trace steps into processes (emulated or sandboxed) and run them in order."""
from .browser import BrowserTenant
from .executors import EmulateExecutor, ExecutorUnavailable, SandboxExecutor, make_executor
from .replayer import Placement, StepResult, replay

__all__ = ["EmulateExecutor", "SandboxExecutor", "BrowserTenant", "ExecutorUnavailable", "make_executor",
           "Placement", "StepResult", "replay"]
