"""OpenHands native event streams -> trace IR.

Input: a JSON array of events (one trace, id `openhands-events/<file stem>`), a JSON object with a
`history` event list, or JSONL / a JSON array of evaluation records whose `history` is an event stream
(one trace per record, id `openhands-events/<instance_id>/<record>`).

An event has `id`, `timestamp`, `source` (agent/user/environment) and either `action` + `args` or
`observation` + `content` + `extras` (+ `cause`, the id of the action it answers). Each action the
agent takes is one step:

* `run` -> `bash` (args `command`, `cwd`, `timeout_ms` from the event's `timeout` in seconds,
  `is_input`); `run_ipython` -> `python` (`command` = the cell's code);
* `edit` / `write` -> `edit` (`op` = the editor sub-command, `path`, the edit's text fields);
  a `write` of some lines (`start`/`end` not 0/-1) is `op` `write_lines` with `lines` [start, end],
  which no replay applies; `read` -> `read` (`path`, `view_range`); `browse` / `browse_interactive` -> `browser`
  (`method`, `url` or `actions`);
* `think`, `finish`, `message`, `reject`, `delegate`, `null`, `condensation`, `task_tracking`,
  `call_tool_mcp`, ... -> `noop` steps, kept with `native_tool` set.

Not steps: bookkeeping actions (`system` prompt, `recall`, `change_agent_state`) and non-executing
actions that the agent did not take (the user's `message`s). An executing action from the user (a
command typed into the GUI terminal) is a step: it ran in the same sandbox.

Working directory: `extras.metadata.working_dir` of each `run` observation is the shell's cwd after
that command; it is carried to the following steps (an action's own non-empty `args.cwd` wins).
Durations: from an action's `timestamp` to that of its observation (matched by `cause`), `recorded`;
an action without an observation (e.g. `finish`) has none, and a negative gap (clock skew) is dropped.
"""
from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from ..ir import Measure, Step, Trace, TraceError
from ._common import (check_bool, check_number, check_str, check_type, fail, finish, guard, head, id_part,
                      iter_json_rows, load_json_file, make_source, make_trace_id, need, record_results, strict)

FORMAT = "openhands-events"

EXEC_ACTIONS = {"run": "bash", "run_ipython": "python", "edit": "edit", "write": "edit", "read": "read",
                "browse": "browser", "browse_interactive": "browser"}
NOOP_ACTIONS = frozenset({"think", "finish", "message", "reject", "delegate", "null", "condensation",
                          "condensation_request", "task_tracking", "loop_recovery", "call_tool_mcp", "push",
                          "send_pr", "pause", "resume", "stop", "start"})
BOOKKEEPING = frozenset({"system", "recall", "change_agent_state"})
_SOURCE = re.compile(r'"source"\s*:\s*"(?:agent|user|environment)"')
_KIND = re.compile(r'"(?:action|observation)"\s*:\s*"')


def sniff(path: Path) -> bool:
    path = Path(path)
    if path.suffix not in (".json", ".jsonl"):
        return False
    text = head(path).decode("utf-8", "replace")
    return _SOURCE.search(text) is not None and _KIND.search(text) is not None


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    path = Path(path)
    source = make_source(FORMAT, path)
    name = str(path)
    if path.suffix != ".jsonl":
        data = load_json_file(path)
        if isinstance(data, list) and not any(isinstance(e, dict) and "history" in e for e in data[:1]):
            where = {"file": name}
            yield guard(where, lambda: convert_events(data, where, source,
                                                      make_trace_id(FORMAT, id_part(path.stem, "trace")), ""))
            return
        if isinstance(data, dict):
            where = {"file": name}
            tid = make_trace_id(FORMAT, id_part(data.get("instance_id"), id_part(path.stem, "trace")))
            yield guard(where, lambda: _record(data, where, source, tid))
            return
        if not isinstance(data, list):
            yield fail(f"expected an event array or evaluation records, got {type(data).__name__}", {"file": name})
            return
        records = enumerate(data)
    else:
        records = iter_json_rows(path)
    yield from record_results(records, name, source, _numbered_record)


def _numbered_record(row: Any, where: dict, source: dict, rec: int) -> Trace:
    """Record `rec` of a file of records, named by its instance_id where it has one."""
    inst = row.get("instance_id") if isinstance(row, dict) else None
    return _record(row, where, source, make_trace_id(FORMAT, id_part(inst, f"record{rec}"), rec))


def _record(row: Any, where: dict, source: dict, trace_id: str) -> Trace:
    if not isinstance(row, dict):
        raise fail(f"expected a record object, got {type(row).__name__}", where)
    if row.get("instance_id") is not None:
        check_type(row["instance_id"], str, where, field="instance_id")
    history = need(row, "history", list, where)
    return convert_events(history, where, source, trace_id, "history")


def _when(raw: Any, where: dict, step: int | None, field: str) -> datetime:
    check_type(raw, str, where, step=step, field=field)
    try:
        ts = datetime.fromisoformat(raw.strip())
    except ValueError:
        raise fail(f"not an ISO timestamp: {raw[:40]!r}", where, step=step, field=field) from None
    if ts.tzinfo is not None:  # compare everything as naive UTC
        ts = ts.astimezone(timezone.utc).replace(tzinfo=None)
    return ts


def convert_events(events: list, where: dict, source: dict, trace_id: str, prefix: str) -> Trace:
    if not events:
        raise fail("empty event stream", where, field=prefix or None)
    # Index observations by the action they answer (first answer wins).
    answers: dict[int, tuple[int, dict]] = {}
    for ei, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise fail(f"expected an event object, got {type(ev).__name__}", where, field=f"{prefix}[{ei}]")
        cause = ev.get("cause")
        if "observation" in ev and isinstance(cause, int) and not isinstance(cause, bool) and cause not in answers:
            answers[cause] = (ei, ev)

    steps: list[Step] = []
    cwd: str | None = None
    for ei, ev in enumerate(events):
        ef = f"{prefix}[{ei}]"
        idx = len(steps)
        if "action" not in ev:
            if "observation" not in ev:
                raise fail("event has neither 'action' nor 'observation'", where, field=f"{ef}.action")
            check_type(ev["observation"], str, where, field=f"{ef}.observation")
            extras = ev.get("extras")
            meta = extras.get("metadata") if isinstance(extras, dict) else None
            wd = meta.get("working_dir") if isinstance(meta, dict) else None
            if wd is not None and wd != "":
                cwd = check_str(wd, where, step=idx, field=f"{ef}.extras.metadata.working_dir")
            continue
        action = need(ev, "action", str, where, step=idx, prefix=f"{ef}.")
        who = need(ev, "source", str, where, step=idx, prefix=f"{ef}.")
        if action in BOOKKEEPING:
            continue
        if action not in EXEC_ACTIONS and action not in NOOP_ACTIONS:
            raise fail(f"unknown action {action[:80]!r}; known: {', '.join(sorted({*EXEC_ACTIONS, *NOOP_ACTIONS, *BOOKKEEPING}))}",
                       where, step=idx, field=f"{ef}.action")
        if action in NOOP_ACTIONS and who != "agent":
            continue
        args = ev.get("args", {})
        if args is None:
            args = {}
        check_type(args, dict, where, step=idx, field=f"{ef}.args")
        step = _step(action, args, ev, idx, cwd, where, ef)
        duration = _duration(ev, answers, where, idx, ef)
        if duration is not None:
            step = Step(step_id=step.step_id, tool=step.tool, native_tool=step.native_tool, args=step.args,
                        duration_ms=duration)
        steps.append(step)
    return finish(trace_id, source, steps, where, what=prefix or "events")


def _duration(ev: dict, answers: dict, where: dict, idx: int, ef: str) -> Measure | None:
    eid = ev.get("id")
    if eid is None:
        return None
    check_type(eid, int, where, step=idx, field=f"{ef}.id")
    if eid not in answers or ev.get("timestamp") is None:
        return None
    oi, obs = answers[eid]
    if obs.get("timestamp") is None:
        return None
    start = _when(ev["timestamp"], where, idx, f"{ef}.timestamp")
    end = _when(obs["timestamp"], where, idx, f"{ef.rsplit('[', 1)[0]}[{oi}].timestamp")
    secs = (end - start).total_seconds()
    if secs < 0:
        return None
    return Measure(round(secs * 1000.0, 3), "recorded")


def _step(action: str, args: dict, ev: dict, idx: int, cwd: str | None, where: dict, ef: str,
          args_field: str | None = None) -> Step:
    """One step from an action event; `args_field` is where `args` sits (default `<event>.args`)."""
    af = args_field or f"{ef}.args"

    def s(key: str) -> str:
        return check_str(need(args, key, str, where, step=idx, field=f"{af}.{key}"), where, step=idx,
                         field=f"{af}.{key}")

    def opt(key: str) -> str | None:
        v = args.get(key)
        return None if v is None else check_str(v, where, step=idx, field=f"{af}.{key}")

    if action in NOOP_ACTIONS:
        return Step(step_id=idx, tool="noop", native_tool=action, args={})
    tool = EXEC_ACTIONS[action]
    out: dict[str, Any] = {}
    if action == "run":
        out["command"] = s("command")
        own = opt("cwd")
        if own:
            out["cwd"] = own
        elif cwd is not None:
            out["cwd"] = cwd
        timeout = ev.get("timeout")
        tf = f"{ef}.timeout"
        if timeout is None:
            timeout, tf = args.get("timeout"), f"{af}.timeout"
        if timeout is not None:
            out["timeout_ms"] = round(check_number(timeout, where, step=idx, field=tf, allow_str=True) * 1000.0, 3)
        if args.get("is_input") is not None:
            out["is_input"] = check_bool(args["is_input"], where, step=idx, field=f"{af}.is_input")
    elif action == "run_ipython":
        out["command"] = s("code")
    elif action in ("edit", "write"):
        sub = opt("command") if action == "edit" else None
        out["op"] = sub or action
        out["path"] = s("path")
        if action == "write":
            text = opt("content")
            if text is not None:
                out["file_text"] = text
            # a FileWriteAction replaces lines start..end: only the whole file (0..-1, its default) is
            # a `write` a replay applies; a part keeps its span and is not applied
            start = int(check_number(args.get("start", 0), where, step=idx, field=f"{af}.start", allow_str=True))
            end = args.get("end", -1)
            end = -1 if str(end).strip() == "-1" else int(check_number(end, where, step=idx, field=f"{af}.end",
                                                                         allow_str=True))
            if (start, end) != (0, -1):
                out["op"], out["lines"] = "write_lines", [start, end]
        else:
            for key in ("file_text", "old_str", "new_str"):
                text = opt(key)
                if text is not None:
                    out[key] = text
            content = opt("content")
            if content:
                out["content"] = content
            if args.get("insert_line") is not None:
                out["insert_line"] = int(check_number(args["insert_line"], where, step=idx,
                                                      field=f"{af}.insert_line", allow_str=True))
    elif action == "read":
        out["op"] = "view"
        out["path"] = s("path")
        vr = args.get("view_range")
        if vr is not None:
            check_type(vr, list, where, step=idx, field=f"{af}.view_range")
            if len(vr) > 2:
                raise fail("expected [start, end]", where, step=idx, field=f"{af}.view_range")
            out["view_range"] = [check_type(v, int, where, step=idx, field=f"{af}.view_range") for v in vr]
    elif action == "browse":
        out["method"] = action
        out["url"] = s("url")
    else:  # browse_interactive
        out["method"] = action
        out["actions"] = s("browser_actions")
    if tool in ("edit", "read") and cwd is not None:
        out["cwd"] = cwd
    return Step(step_id=idx, tool=tool, native_tool=action, args=out)
