"""OpenHands issue-resolver output (and older OpenHands/OpenDevin evaluation output) -> trace IR.

Input: `output.jsonl` of the resolver (or a JSON array of such records), one record per issue:
`issue` ({owner, repo, number, title, body}) or `instance_id`, `instruction`, `base_commit`,
`git_patch`, `history`, `metrics`, `success`, `success_explanation`/`result_explanation`, `error`.
One trace per record, id `openhands-resolver/<owner>__<repo>-<number> or <instance_id>/<record>`.

`history` is in the older, flatter event schema (the newer event stream, with `id`/`timestamp`/
`source` on every event, is the `openhands-events` format). Two shapes are read:

* **flat**: a list of dicts, an action (`action` plus its arguments at the top level: `command`,
  `code`, `path`, `url`, `thought`, ...) followed by its observation (`observation`, `content`, the
  arguments echoed, `exit_code`); no ids, no timestamps, no `source`;
* **pairs**: a list of `[action, observation]` pairs, the action's arguments under `args` (or flat),
  the events possibly carrying `source`/`timestamp` (older OpenDevin evaluation output).

Steps follow the openhands-events converter: every executed action is one step (`run` -> bash,
`run_ipython` -> python, `edit`/`write` -> edit, `read` -> read, `browse`/`browse_interactive` ->
browser, with the same args); the agent's non-executing actions (`message`, `think`, `finish`,
`reject`, `delegate`, old `add_task`/`modify_task`/`summarize`, ...) are `noop` steps kept so the
numbering matches a reading of the history, and are not tool calls. The user's messages are not
steps: with `source` present that decides; without it (the flat shape) a `message` is the user's
when it is the first event, its content is the record's `instruction`, or it is the runtime's
scripted reply ("Please continue working on the task ..."), and the agent's otherwise.

Working directory: the shell prompt at the end of a `run` observation (`root@host:/workspace # `),
or `[Jupyter current working directory: /x]` of a `run_ipython` one, is carried to the following
steps; before the first such observation the cwd is unknown and left out. Durations: only when both
the action and its observation carry a `timestamp` (pairs shape), `recorded`; the flat shape has
none. There is no resource profile.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from ..ir import Step, Trace, TraceError
from ._common import (check_str, check_type, fail, finish, head, id_part, iter_json_rows, load_json_file,
                      make_source, make_trace_id, need, need_items, record_results, recorded_ms, strict)
from . import openhands_events as events

FORMAT = "openhands-resolver"

#: Non-executing actions of the older agents, on top of the event-stream converter's.
OLD_NOOP_ACTIONS = frozenset({"add_task", "modify_task", "summarize", "talk", "agent_finish"})

#: How the runtime's scripted "user" reply to an agent message begins (OpenHands' fake user response
#: in resolver and evaluation runs): without `source`, this is what tells it from the agent's own.
FAKE_USER_PREFIX = "Please continue working on the task"

_HISTORY = re.compile(r'"history"\s*:\s*\[')
_PAIRS = re.compile(r'"history"\s*:\s*\[\s*\[')
_RECORD = re.compile(r'"(?:git_patch|instruction|issue)"\s*:')
_SOURCE = re.compile(r'"source"\s*:\s*"(?:agent|user|environment)"')
_ACTION = re.compile(r'"action"\s*:\s*"')
_PROMPT = re.compile(r"\S+@[^\s:]+:(/[^\n#$]*?)\s*[#$]\s*$")
_JUPYTER = re.compile(r"\[Jupyter current working directory: ([^\]\n]+)\]")


def sniff(path: Path) -> bool:
    """Resolver/evaluation records whose history is old-style: [action, observation] pairs, or
    flat events without `source` (the newer event stream always has it)."""
    path = Path(path)
    if path.suffix not in (".json", ".jsonl"):
        return False
    text = head(path).decode("utf-8", "replace")
    if not (_HISTORY.search(text) and _RECORD.search(text)):
        return False
    return bool(_PAIRS.search(text)) or (_ACTION.search(text) is not None and _SOURCE.search(text) is None)


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    path = Path(path)
    if path.suffix == ".jsonl":
        rows = iter_json_rows(path)
    else:
        data = load_json_file(path)
        if isinstance(data, dict):
            data = [data]
        if not isinstance(data, list):
            yield fail(f"expected resolver records (an object or an array), got {type(data).__name__}",
                       {"file": str(path)})
            return
        rows = enumerate(data)
    yield from record_results(rows, str(path), make_source(FORMAT, path), convert_record)


def _record_name(row: dict, where: dict, rec: int) -> tuple[str, dict]:
    """(id part, extra source keys) from the record's instance_id or issue."""
    inst = row.get("instance_id")
    if inst is not None:
        check_type(inst, str, where, field="instance_id")
        return id_part(inst, f"record{rec}"), {"instance_id": inst}
    issue = row.get("issue")
    if isinstance(issue, dict):
        owner, repo, number = issue.get("owner"), issue.get("repo"), issue.get("number")
        if isinstance(owner, str) and isinstance(repo, str) and isinstance(number, int) and not isinstance(number, bool):
            ref = f"{owner}/{repo}#{number}"
            return id_part(f"{owner}__{repo}-{number}", f"record{rec}"), {"issue": check_str(ref, where, field="issue")}
    return f"record{rec}", {}


def convert_record(row: Any, where: dict, source: dict, rec: int) -> Trace:
    history = need_items(row, "history", where, what="a record object", empty="empty history")
    instruction = row.get("instruction") if isinstance(row.get("instruction"), str) else None
    name, extra = _record_name(row, where, rec)
    pairs = _pairs(history, where)
    steps: list[Step] = []
    cwd: str | None = None
    for k, (af, action, obs, of) in enumerate(pairs):
        idx = len(steps)
        kind = need(action, "action", str, where, step=idx, prefix=f"{af}.")
        args = action.get("args")
        if args is None:
            args = action                      # flat: the arguments sit beside `action`
        check_type(args, dict, where, step=idx, field=f"{af}.args")
        who = action.get("source")
        if who is not None:
            check_type(who, str, where, step=idx, field=f"{af}.source")
        elif kind == "message":
            content = args.get("content")
            who = "user" if (k == 0 or (instruction is not None and content == instruction)
                             or (isinstance(content, str) and content.startswith(FAKE_USER_PREFIX))) else "agent"
        else:
            who = "agent"
        if kind in events.BOOKKEEPING:
            pass
        elif kind in events.EXEC_ACTIONS or kind in events.NOOP_ACTIONS or kind in OLD_NOOP_ACTIONS:
            if kind in events.EXEC_ACTIONS or who == "agent":
                steps.append(_step(kind, args, action, obs, idx, cwd, where, af, of))
        else:
            known = sorted({*events.EXEC_ACTIONS, *events.NOOP_ACTIONS, *OLD_NOOP_ACTIONS, *events.BOOKKEEPING})
            raise fail(f"unknown action {kind[:80]!r}; known: {', '.join(known)}", where, step=idx,
                       field=f"{af}.action")
        cwd = _cwd_after(obs, cwd, where, idx, of)
    out_source = {**source, **extra}
    return finish(make_trace_id(FORMAT, name, rec), out_source, steps, where, what="history")


def _pairs(history: list, where: dict) -> list[tuple[str, dict, dict | None, str | None]]:
    """(field path of the action, action, its observation or None, the observation's field path)
    in order, for either shape."""
    out: list[tuple[str, dict, dict | None, str | None]] = []
    for i, item in enumerate(history):
        f = f"history[{i}]"
        if isinstance(item, list):                       # pairs shape
            if len(item) != 2:
                raise fail(f"expected an [action, observation] pair, got {len(item)} item(s)", where, field=f)
            action, obs = item
            check_type(action, dict, where, field=f"{f}[0]")
            if obs is not None:
                check_type(obs, dict, where, field=f"{f}[1]")
            if "action" not in action:
                raise fail("missing", where, field=f"{f}[0].action")
            out.append((f"{f}[0]", action, obs or None, f"{f}[1]"))
            continue
        check_type(item, dict, where, field=f)
        if "action" in item:
            out.append((f, item, None, None))
        elif "observation" in item:
            # answers the latest unanswered action; one with no action before it is skipped
            if out and out[-1][2] is None:
                out[-1] = (out[-1][0], out[-1][1], item, f)
        else:
            raise fail("event has neither 'action' nor 'observation'", where, field=f"{f}.action")
    return out


def _step(kind: str, args: dict, action: dict, obs: dict | None, idx: int, cwd: str | None, where: dict,
          af: str, of: str | None) -> Step:
    if kind in events.NOOP_ACTIONS or kind in OLD_NOOP_ACTIONS:
        return Step(step_id=idx, tool="noop", native_tool=kind, args={})
    step = events._step(kind, args, action, idx, cwd, where, af, args_field=f"{af}.args" if args is not action else af)
    if obs is not None and action.get("timestamp") is not None and obs.get("timestamp") is not None:
        start = events._when(action["timestamp"], where, idx, f"{af}.timestamp")
        end = events._when(obs["timestamp"], where, idx, f"{of}.timestamp")
        secs = (end - start).total_seconds()
        if secs >= 0:
            step = Step(step_id=step.step_id, tool=step.tool, native_tool=step.native_tool, args=step.args,
                        duration_ms=recorded_ms(secs))
    return step


def _cwd_after(obs: dict | None, cwd: str | None, where: dict, idx: int, of: str | None) -> str | None:
    """The working directory an observation reports (metadata, shell prompt or Jupyter line), else `cwd`."""
    if obs is None:
        return cwd
    extras = obs.get("extras")
    meta = extras.get("metadata") if isinstance(extras, dict) else None
    wd, field = (meta.get("working_dir") if isinstance(meta, dict) else None), f"{of}.extras.metadata.working_dir"
    content = obs.get("content")
    if wd is not None and wd != "":
        return check_str(wd, where, step=idx, field=field)
    if isinstance(content, str):
        tail = content[-4096:]
        m = (_PROMPT.search(tail) if obs.get("observation") == "run"
             else _JUPYTER.search(tail) if obs.get("observation") == "run_ipython" else None)
        wd, field = (m.group(1).strip() if m else None), f"{of}.content"
    if isinstance(wd, str) and wd:
        return check_str(wd, where, step=idx, field=field)
    return cwd
