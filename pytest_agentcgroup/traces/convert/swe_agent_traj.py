"""SWE-agent `.traj` files -> trace IR (one trace per file, id `swe-agent-traj/<file stem>`).

A `.traj` file is a JSON object with `trajectory`, a list of steps {`action`, `observation`,
`response`, `thought`, `state`}, plus `history` (the chat sent to the model) and `info`.

* v0.x: `state` is a JSON-encoded *string* `{"open_file": ..., "working_dir": ...}`; no timing.
* v1.x: `state` is an object; each step has `execution_time` (seconds), kept as a `recorded`
  `duration_ms`.

Each trajectory step is one IR step; its `action` is mapped like a SWE-agent HF row's command (see
`swe_agent_rows` and `_swe_agent.aci_step_fields`: ACI read/edit/search commands, `submit` -> `noop`,
the rest `bash`; an edit in the replay editor's terms, its step's `observation` saying whether the
tool applied it). An empty action (a format error SWE-agent answered without running anything) is a
`noop` step with `native_tool` "(empty)".

Working directory and open file: v1 records `state` *after* the action ran, so step i runs in step
i-1's `state` (carried on); v0 records it before (its agent asks for the state, then runs the
action: `sweagent/agent/agents.py` of 0.7), so a v0 step runs in its own. Before any state, the
first step's cwd is the `(Current directory: ...)` footer of the last history message before the
first model action (the task prompt); unknown when absent.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from ..ir import Measure, Step, Trace, TraceError
from ._common import (check_number, check_str, check_type, fail, finish, guard, head, id_part, load_json_file,
                      loads, make_source, make_trace_id, need, need_items, recorded_ms, strict)
from ._swe_agent import swe_agent_step, swe_footer

FORMAT = "swe-agent-traj"
_TRAJ = re.compile(r'"trajectory"\s*:\s*\[')
_OBS = re.compile(r'"observation"\s*:')
_ACTION = re.compile(r'"action"\s*:\s*"')
_SOURCE = re.compile(r'"source"\s*:\s*"(?:agent|user|environment)"')


def sniff(path: Path) -> bool:
    """A `.traj` file by its name; a `.json` one by its head."""
    suffix = Path(path).suffix
    if suffix != ".json":
        return suffix == ".traj"
    text = head(Path(path)).decode("utf-8", "replace")
    return (text.lstrip().startswith("{") and _TRAJ.search(text) is not None and _OBS.search(text) is not None
            and _ACTION.search(text) is not None and _SOURCE.search(text) is None)


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    path = Path(path)
    data = load_json_file(path)
    where = {"file": str(path)}
    yield guard(where, lambda: convert_traj(data, where, make_source(FORMAT, path),
                                             make_trace_id(FORMAT, id_part(path.stem, "traj"))))


def _state(raw: Any, where: dict, idx: int, field: str) -> dict:
    """A step's state: an object (v1) or a JSON-encoded object (v0); {} when absent."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            raw = loads(raw, where)
        except TraceError as exc:
            raise fail(exc.reason, where, step=idx, field=field) from None
    return check_type(raw, dict, where, step=idx, field=field)


def _initial_cwd(history: Any) -> str | None:
    """The cwd footer of the last history message before the first model action."""
    if not isinstance(history, list):
        return None
    cwd = None
    for msg in history:
        if not isinstance(msg, dict):
            continue
        if msg.get("role") == "assistant":
            break
        content = msg.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
        if isinstance(content, str) and msg.get("role") in ("user", "tool"):
            found, _ = swe_footer(content)
            cwd = found or cwd
    return cwd


def _carry(item: dict, where: dict, i: int, f: str, cwd: str | None,
           open_file: str | None) -> tuple[str | None, str | None]:
    """(cwd, open file) after reading step `item`'s state over the ones before it."""
    state = _state(item.get("state"), where, i, f"{f}.state")
    wd = state.get("working_dir")
    if wd is not None and wd != "":
        cwd = check_str(check_type(wd, str, where, step=i, field=f"{f}.state.working_dir"), where, step=i,
                        field=f"{f}.state.working_dir")
    if "open_file" in state:
        of = state["open_file"]
        if of is None or of in ("n/a", ""):
            open_file = None
        else:
            open_file = check_str(check_type(of, str, where, step=i, field=f"{f}.state.open_file"), where,
                                  step=i, field=f"{f}.state.open_file")
    return cwd, open_file


def convert_traj(data: Any, where: dict, source: dict, trace_id: str) -> Trace:
    traj = need_items(data, "trajectory", where, what="a .traj object", empty="empty trajectory: no steps")
    cwd = _initial_cwd(data.get("history"))
    if cwd is not None:
        cwd = check_str(cwd, where, field="history")
    open_file: str | None = None
    steps: list[Step] = []
    for i, item in enumerate(traj):
        f = f"trajectory[{i}]"
        if not isinstance(item, dict):
            raise fail(f"expected a step object, got {type(item).__name__}", where, step=i, field=f)
        action = need(item, "action", str, where, step=i, prefix=f"{f}.")
        duration: Measure | None = None
        if item.get("execution_time") is not None:
            duration = recorded_ms(check_number(item["execution_time"], where, step=i, field=f"{f}.execution_time"))
        before = isinstance(item.get("state"), str)      # v0: the state the action ran in
        if before:
            cwd, open_file = _carry(item, where, i, f, cwd, open_file)
        if not action.strip():
            check_str(action, where, step=i, field=f"{f}.action")
            steps.append(Step(step_id=i, tool="noop", native_tool="(empty)", args={}, duration_ms=duration))
        else:
            observation = item.get("observation")
            steps.append(swe_agent_step(action, i, where, f"{f}.action", cwd=cwd, open_file=open_file,
                                        duration=duration, v0=before,
                                        observation=observation if isinstance(observation, str) else None))
        if not before:
            cwd, open_file = _carry(item, where, i, f, cwd, open_file)
    return finish(trace_id, source, steps, where)
