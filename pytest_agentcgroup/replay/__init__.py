"""Replay: turn trace steps into processes and run them in order, each in the cgroups its
`Placement` names. The core is replayer.py (the loop) and emulator.c (the resource emulator, a C
program compiled on first use by emulator_build.py); executors/ turns a step into a process (emulate, sandbox, docker) behind one registry.

May import: traces/, proc, errors, engines/. Never cgroups/, bpf/ or anything above: replay does
not know about cgroups and is handed a Placement.
"""
from .executors import (DockerExecutor, EmulateExecutor, ExecutorUnavailable, SandboxExecutor, StepRefused,
                        make_executor)
from .replayer import Placement, StepResult, replay

__all__ = ["EmulateExecutor", "SandboxExecutor", "DockerExecutor",
           "ExecutorUnavailable", "StepRefused", "make_executor",
           "Placement", "StepResult", "replay"]
