"""The task a trace ran on: what a replay of its real commands needs a working copy of.

A trace's optional `task` (schema agentcgroup-trace/1; every key optional, every value a string):

    "task": {"instance_id": "PyPSA__linopy-79",          # SWE-bench / SWE-rebench instance
             "repository": "PyPSA/linopy",               # owner/name
             "version": "0.0",                           # the task's version label (SWE-bench `version`)
             "commit": "9572f87...",                     # the base commit, where the source says it
             "image": "swerebench/sweb.eval.x86_64.pypsa_1776_linopy-79",
             "path": "/workspace/PyPSA__linopy__0.0",    # where the agent's repository was
             "python": "/opt/conda/envs/testbed/bin/python"}   # the interpreter its commands ran

A converter sets what its source says. A trace without `task` may still name one: `task_of` reads
the instance id, image and working directory the older fields carry (a `source.instance_id` or
`source.image`, a trace id ending in `<org>__<repo>-<n>`, a working directory `/testbed` or
`/workspace/<org>__<repo>__<version>`), so that a replay of real commands knows the trace needs a
workspace it may not have.

Imports only error.py from the package: ir.py parses and writes it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from .error import TraceError
TASK_KEYS = ("instance_id", "repository", "version", "commit", "image", "path", "python")
#: a SWE-bench / SWE-rebench instance id: <org>__<repo>-<number>
INSTANCE_ID = re.compile(r"^([A-Za-z0-9_.-]+?)__([A-Za-z0-9_.-]+)-(\d+)$")
#: the repository directory OpenHands' SWE-bench/SWE-rebench runs use: /workspace/<org>__<repo>__<version>
WORKSPACE_PATH = re.compile(r"^(/workspace/([A-Za-z0-9_.-]+?)__([A-Za-z0-9_.-]+?)__([0-9][A-Za-z0-9_.+-]*))(?:/|$)")
#: the repository directory of SWE-bench's and SWE-rebench's own images
TESTBED = "/testbed"


@dataclass(frozen=True)
class Task:
    instance_id: str | None = None
    repository: str | None = None
    version: str | None = None
    commit: str | None = None
    image: str | None = None
    path: str | None = None
    python: str | None = None

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in TASK_KEYS if getattr(self, k) is not None}

    def describe(self) -> str:
        """`PyPSA__linopy-79 (repository PyPSA/linopy, version 0.0, at /workspace/PyPSA__linopy__0.0)`."""
        name = self.instance_id or self.repository or self.image or self.path or "a task"
        parts = [f"repository {self.repository}" if self.repository and self.repository != name else None,
                 f"version {self.version}" if self.version else None,
                 f"image {self.image}" if self.image and self.image != name else None,
                 f"at {self.path}" if self.path and self.path != name else None]
        said = ", ".join(p for p in parts if p)
        return f"{name} ({said})" if said else name


def parse_task(raw: Any, where: dict) -> Task | None:
    """The Task of a trace's `task` value (None for none); a TraceError at `where` naming the field."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise TraceError(f"expected an object, got {type(raw).__name__}", field="task", **where)
    unknown = sorted(set(raw) - set(TASK_KEYS))
    if unknown:
        raise TraceError(f"unknown key(s) {', '.join(unknown)}; expected {', '.join(TASK_KEYS)}", field="task", **where)
    for key, val in raw.items():
        problem = value_problem(val)
        if problem:
            raise TraceError(problem, field=f"task.{key}", **where)
    return Task(**raw)


def value_problem(val: Any) -> str | None:
    if val is not None and (not isinstance(val, str) or not val.strip() or "\0" in val or len(val) > 4096):
        return "expected a non-empty string (no NUL, at most 4096 characters)"
    return None


def check_task(task: Any, where: dict) -> None:
    """parse_task's rule on a Task object (check_trace's): a TraceError at `where` naming the field."""
    if task is not None and not isinstance(task, Task):
        raise TraceError(f"expected a Task, got {type(task).__name__}", field="task", **where)
    for f in fields(Task) if task is not None else ():
        problem = value_problem(getattr(task, f.name))
        if problem:
            raise TraceError(problem, field=f"task.{f.name}", **where)


def task_of(trace) -> Task | None:
    """The task `trace` (an ir.Trace) ran on: its own `task`, else what its source, id and working
    directories name (module docstring); None when nothing names one."""
    if trace.task is not None:
        return trace.task
    src = trace.source if isinstance(trace.source, dict) else {}
    instance = next((src[k] for k in ("instance_id", "task") if isinstance(src.get(k), str)
                     and INSTANCE_ID.match(src[k])), None)
    if instance is None:
        last = trace.trace_id.rstrip("/").split("/")
        instance = next((p for p in reversed(last) if INSTANCE_ID.match(p)), None)
    image = src.get("image") if isinstance(src.get("image"), str) else None
    path = version = repository = None
    for step in trace.steps:
        cwd = step.args.get("cwd") if isinstance(step.args, dict) else None
        if not isinstance(cwd, str):
            continue
        m = WORKSPACE_PATH.match(cwd)
        if m:
            path, repository, version = m.group(1), f"{m.group(2)}/{m.group(3)}", m.group(4)
            break
        if cwd == TESTBED or cwd.startswith(TESTBED + "/"):
            path = TESTBED
            break
    if repository is None and instance is not None:
        m = INSTANCE_ID.match(instance)
        repository = f"{m.group(1)}/{m.group(2)}"
    if not (instance or image or path):
        return None
    return Task(instance_id=instance, repository=repository, version=version, image=image, path=path)
