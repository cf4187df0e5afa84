"""ATIF trajectories <-> trace IR: Harbor's Agent Trajectory Interchange Format (RFC 0001).

Spec: Harbor's `docs/rfcs/0001-trajectory-format.md` (text of v1.4) and its pydantic models
(`harbor.models.trajectories`, harbor 0.26.0: `schema_version` "ATIF-v1.0" to "ATIF-v1.8"). Any
"ATIF-v1.x" file is read; what we write is "ATIF-v1.4" and uses no field added after it, so every
ATIF reader from v1.4 on accepts it.

A file is one trajectory: `schema_version`, `session_id` (optional from v1.7), `agent` {name,
version, model_name}, `steps` [{step_id, source: system|user|agent, message, tool_calls
[{tool_call_id, function_name, arguments}], observation {results}, metrics, extra}], `final_metrics`,
`extra`; v1.7 may embed `subagent_trajectories`, each a whole trajectory.

Reading: one trace per trajectory, id `atif/<session_id>` (else `trajectory_id`, else the file stem),
and one per embedded subagent, id `<parent id>/<its trajectory_id>` (errors name it as the record).
Each tool call of an `agent` step is one IR step, in order; an agent step without tool calls is one
`noop` step (native_tool "(message)"); `system` and `user` steps are none. The tool, by
`function_name` (any case): a shell tool (TOOL_KINDS) -> bash with `arguments.command` (a string,
or an argv list joined with shell quoting; `cmd` too), its `cwd`/`workdir` and `timeout_ms` (a bare
`timeout` is ms for some agents, seconds for others: left out); Terminus-2's
`keystrokes` run a command only when they end in a newline (else a `noop` keeping them);
`execute_ipython_cell`/`python` -> python with `code`; read, edit, search and browser tools keep the
path, pattern or url; `str_replace_editor` is read for `view`, edit otherwise; SWE-agent's
`swe_agent_action` is its `raw_action` read as the swe-agent converters do; any other name is `noop`.
ATIF has no tool durations (its timestamps are the model's turns), so steps have none.

Writing (`to_atif`): one agent step per IR step, one tool call each (`function_name` the native tool,
`arguments` the IR args). What ATIF has no field for goes under `extra.agentcgroup`: per step the IR
tool, step_id, native_tool and every number with its provenance (duration_ms, profile, outcome,
original); at the root the trace_id, source (licence, origin, its own measures) and task. Reading our own
files back restores the trace exactly from there.
"""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, Iterator

from ..ir import SCHEMA, Step, Trace, TraceError, parse_step
from ..task import Task, parse_task
from ._common import (check_number, check_str, check_type, fail, finish, guard, head, id_part, load_json_file,
                      make_source, make_trace_id, need, strict)
from ._swe_agent import swe_agent_step

FORMAT = "atif"
WRITTEN_VERSION = "ATIF-v1.4"
#: The key of our data in ATIF `extra` objects (root and step).
EXTRA = "agentcgroup"
MAX_SUBAGENT_DEPTH = 8

_VERSION = re.compile(r"ATIF-v1\.\d+")
_SNIFF = re.compile(r'"schema_version"\s*:\s*"ATIF-v')
SOURCES = ("system", "user", "agent")

#: What a tool does, by its lower-cased function name (the names Harbor's agents write: Claude Code,
#: OpenHands, Codex, Gemini CLI, mini-swe-agent, Terminus-2, ...). Names not here are `noop`.
TOOL_KINDS = {
    **dict.fromkeys(("bash", "bash_command", "execute_bash", "shell", "exec_command", "run_shell_command",
                     "run_terminal_cmd", "terminal_run_command", "execute_command", "run_command",
                     "local_shell"), "bash"),
    **dict.fromkeys(("execute_ipython_cell", "python", "ipython", "run_python", "execute_python"), "python"),
    **dict.fromkeys(("read", "read_file", "view", "view_file", "open_file", "read_many_files"), "read"),
    **dict.fromkeys(("edit", "write", "multiedit", "notebookedit", "write_file", "edit_file", "create_file",
                     "replace", "str_replace", "apply_patch", "insert"), "edit"),
    **dict.fromkeys(("grep", "glob", "search", "find", "search_file_content", "list_directory", "ls",
                     "find_file", "search_dir", "search_file", "file_search", "codebase_search", "grep_search"),
                    "search"),
    **dict.fromkeys(("browser", "browse", "web_read", "browser_action"), "browser"),
}
#: Argument keys kept per kind, the first present one under the IR name.
_KEEP = {"path": ("file_path", "path", "absolute_path", "notebook_path", "filename", "dir_path"),
         "pattern": ("pattern", "query", "regex"), "url": ("url",)}
_KEPT_BY_KIND = {"read": ("path",), "edit": ("path",), "search": ("pattern", "path"), "browser": ("url",)}


def sniff(path: Path) -> bool:
    path = Path(path)
    if path.suffix != ".json":
        return False
    text = head(path).decode("utf-8", "replace")
    return text.lstrip().startswith("{") and _SNIFF.search(text) is not None


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    path = Path(path)
    data = load_json_file(path)
    yield from _documents(data, {"file": str(path)}, make_source(FORMAT, path), None, path.stem, "", 0)


def _documents(doc: Any, where: dict, source: dict, parent: str | None, fallback: str, prefix: str,
               depth: int) -> Iterator[Trace | TraceError]:
    """The trace of `doc` and of each subagent trajectory it embeds (depth first)."""
    trace_id = _trace_id(doc, parent, fallback)
    yield guard(where, lambda: convert_trajectory(doc, where, source, trace_id))
    subs = doc.get("subagent_trajectories") if isinstance(doc, dict) else None
    if not isinstance(subs, list):
        return
    for i, sub in enumerate(subs):
        record = f"{prefix}subagent_trajectories[{i}]"
        sub_where = {"file": where["file"], "record": record}
        if depth >= MAX_SUBAGENT_DEPTH:
            yield fail(f"subagent trajectories nested deeper than {MAX_SUBAGENT_DEPTH}", sub_where)
            return
        yield from _documents(sub, sub_where, source, trace_id, f"sub{i}", f"{record}.", depth + 1)


def _trace_id(doc: Any, parent: str | None, fallback: str) -> str:
    ours = _ours(doc)
    if isinstance(ours.get("trace_id"), str) and ours["trace_id"].strip():
        return ours["trace_id"]
    name = fallback
    if isinstance(doc, dict):
        keys = ("trajectory_id", "session_id") if parent else ("session_id", "trajectory_id")
        name = next((doc[k] for k in keys if isinstance(doc.get(k), str) and doc[k].strip()), fallback)
    part = id_part(name, fallback)
    return f"{parent}/{part}" if parent else make_trace_id(FORMAT, part)


def _ours(obj: Any) -> dict:
    """obj.extra.agentcgroup, or {} when it has none."""
    extra = obj.get("extra") if isinstance(obj, dict) else None
    mine = extra.get(EXTRA) if isinstance(extra, dict) else None
    return mine if isinstance(mine, dict) else {}


def convert_trajectory(doc: Any, where: dict, source: dict, trace_id: str) -> Trace:
    if not isinstance(doc, dict):
        raise fail(f"expected an ATIF trajectory object, got {type(doc).__name__}", where)
    version = need(doc, "schema_version", str, where)
    if not _VERSION.fullmatch(version):
        raise fail(f"unsupported schema_version {version[:40]!r}; this reads ATIF-v1.x", where,
                   field="schema_version")
    agent = need(doc, "agent", dict, where)
    steps_raw = need(doc, "steps", list, where)
    source = {**source, **_agent_info(agent, where)}
    ours = _ours(doc)
    if ours:
        if ours.get("schema", SCHEMA) != SCHEMA:
            raise fail(f"unsupported schema {ours['schema']!r:.60}; this reads {SCHEMA!r}", where,
                       field=f"extra.{EXTRA}.schema")
        source = check_type(ours.get("source"), dict, where, field=f"extra.{EXTRA}.source")
    task = _task(ours.get("task"), where)
    steps: list[Step] = []
    for i, raw in enumerate(steps_raw):
        steps.extend(_steps(raw, f"steps[{i}]", len(steps), where))
    if not steps:
        raise fail("no agent steps: nothing to replay", where, field="steps")
    return finish(trace_id, source, steps, where, what="steps", task=task)


def _task(raw: Any, where: dict) -> Task | None:
    """The task we wrote under extra.agentcgroup.task (None where there is none)."""
    try:
        return parse_task(raw, {"file": where.get("file"), "record": where.get("record")})
    except TraceError as exc:
        raise fail(exc.reason, where, field=f"extra.{EXTRA}.{exc.field}") from None


def _agent_info(agent: dict, where: dict) -> dict:
    out = {}
    for key, ir_key in (("name", "agent"), ("version", "agent_version"), ("model_name", "model")):
        if agent.get(key) is not None:
            out[ir_key] = check_str(check_type(agent[key], str, where, field=f"agent.{key}"), where,
                                    field=f"agent.{key}")
    return out


def _steps(raw: Any, sf: str, index: int, where: dict) -> list[Step]:
    """The IR steps of one ATIF step; `index` is the first one's step_id."""
    if not isinstance(raw, dict):
        raise fail(f"expected a step object, got {type(raw).__name__}", where, step=index, field=sf)
    origin = need(raw, "source", str, where, step=index, prefix=f"{sf}.")
    if origin not in SOURCES:
        raise fail(f"expected one of {', '.join(SOURCES)}, got {origin[:40]!r}", where, step=index,
                   field=f"{sf}.source")
    if origin != "agent":
        return []
    calls = check_type(raw.get("tool_calls", []), (list, type(None)), where, step=index,
                       field=f"{sf}.tool_calls") or []
    ours = _ours(raw)
    if ours and len(calls) != 1:
        raise fail(f"a step with extra.{EXTRA} has exactly one tool call, got {len(calls)}", where, step=index,
                   field=f"{sf}.tool_calls")
    if not calls:
        return [Step(step_id=index, tool="noop", native_tool="(message)", args={})]
    out = []
    for k, call in enumerate(calls):
        cf = f"{sf}.tool_calls[{k}]"
        if not isinstance(call, dict):
            raise fail(f"expected a tool call object, got {type(call).__name__}", where, step=index + k, field=cf)
        name = need(call, "function_name", str, where, step=index + k, prefix=f"{cf}.")
        args = need(call, "arguments", dict, where, step=index + k, prefix=f"{cf}.")
        if ours:
            out.append(_our_step(name, args, ours, where, index, cf, f"{sf}.extra.{EXTRA}"))
        else:
            out.append(tool_step(name, args, index + k, where, cf))
    return out


def _our_step(name: str, args: dict, ours: dict, where: dict, index: int, cf: str, ef: str) -> Step:
    """A step we wrote: the tool call's name and arguments with the IR fields kept in extra."""
    raw = {k: v for k, v in ours.items() if k != "args"}
    raw["args"] = args
    try:
        step = parse_step(raw, index, where)
    except TraceError as exc:
        field = exc.field or ""
        field = f"{cf}.arguments{field[4:]}" if field.startswith("args") else f"{ef}.{field}".rstrip(".")
        raise fail(exc.reason, where, step=index, field=field) from None
    if "native_tool" in ours and ours["native_tool"] != name:
        raise fail(f"native_tool {ours['native_tool']!r:.60} is not the tool call's function_name {name!r:.60}",
                   where, step=index, field=f"{ef}.native_tool")
    return step


def tool_step(name: str, args: dict, index: int, where: dict, cf: str) -> Step:
    """One IR step from the tool call at `cf` of another producer's ATIF file."""
    check_str(name, where, step=index, field=f"{cf}.function_name")
    af = f"{cf}.arguments"
    lower = name.lower()
    if lower == "swe_agent_action":
        action = need(args, "raw_action", str, where, step=index, prefix=f"{af}.")
        return swe_agent_step(action, index, where, f"{af}.raw_action", cwd=None, open_file=None)
    kind = TOOL_KINDS.get(lower, "noop")
    kept: dict[str, Any] = {"op": name} if kind == "edit" else {}
    if lower == "str_replace_editor":
        kept["op"] = _text(need(args, "command", str, where, step=index, prefix=f"{af}."), where, index,
                           f"{af}.command")
        kind = "read" if kept["op"] == "view" else "edit"
    if kind == "bash":
        return _shell_step(name, args, index, where, af)
    if kind == "python":
        key = "code" if "code" in args else "command"
        code = check_str(need(args, key, str, where, step=index, prefix=f"{af}."), where, step=index,
                         field=f"{af}.{key}")
        return Step(step_id=index, tool="python", native_tool=name, args={"command": code})
    for ir_key in _KEPT_BY_KIND.get(kind, ()):
        key = next((k for k in _KEEP[ir_key] if args.get(k) is not None), None)
        if key is not None:
            kept[ir_key] = _text(args[key], where, index, f"{af}.{key}")
    return Step(step_id=index, tool=kind, native_tool=name, args=kept)


def _text(val: Any, where: dict, index: int, field: str) -> str:
    return check_str(check_type(val, str, where, step=index, field=field), where, step=index, field=field)


def _shell_step(name: str, args: dict, index: int, where: dict, af: str) -> Step:
    if "keystrokes" in args and "command" not in args:
        keys = _text(args["keystrokes"], where, index, f"{af}.keystrokes")
        if not keys.endswith("\n") or not keys.strip():   # typed but not entered, or Enter alone: no command
            return Step(step_id=index, tool="noop", native_tool=name, args={"keystrokes": keys})
        command = keys.rstrip("\n")
    else:
        key = "command" if "command" in args or "cmd" not in args else "cmd"
        cf = f"{af}.{key}"
        raw = args.get(key)
        if raw is None:
            raise fail("missing (a shell tool call needs a command)", where, step=index, field=cf)
        if isinstance(raw, list):
            for j, part in enumerate(raw):
                _text(part, where, index, f"{cf}[{j}]")
            raw = shlex.join(raw)
        command = _text(raw, where, index, cf)
    out: dict[str, Any] = {"command": command}
    cwd_key = next((k for k in ("cwd", "workdir", "working_dir") if args.get(k) is not None), None)
    if cwd_key is not None:
        out["cwd"] = _text(args[cwd_key], where, index, f"{af}.{cwd_key}")
    if args.get("timeout_ms") is not None:
        out["timeout_ms"] = check_number(args["timeout_ms"], where, step=index, field=f"{af}.timeout_ms")
    return Step(step_id=index, tool="bash", native_tool=name, args=out)


# ---------------------------------------------------------------------------------------------
# Writing

NOTES = (f"Written by pytest-agentcgroup from its trace IR ({SCHEMA}): one agent step per tool call. "
         f"Durations, resource profiles and where each number came from (recorded, derived, synthetic) "
         f"are under steps[].extra.{EXTRA}; the trace's id and source (licence, origin) under extra.{EXTRA}.")


def to_atif(trace: Trace) -> dict:
    """`trace` as an ATIF trajectory (a JSON-ready dict)."""
    steps = []
    for n, st in enumerate(trace.steps, 1):
        kept = {k: v for k, v in st.to_json().items() if k != "args"}
        steps.append({"step_id": n, "source": "agent", "message": "",
                      "tool_calls": [{"tool_call_id": f"call_{n}",
                                      "function_name": st.tool if st.native_tool is None else st.native_tool,
                                      "arguments": st.args}],
                      "extra": {EXTRA: kept}})
    src = trace.source
    agent = {"name": _label(src.get("agent"), src.get("format")), "version": _label(src.get("agent_version"))}
    if isinstance(src.get("model"), str):
        agent["model_name"] = src["model"]
    return {"schema_version": WRITTEN_VERSION, "session_id": trace.trace_id, "agent": agent, "notes": NOTES,
            "steps": steps, "final_metrics": {"total_steps": len(steps)},
            "extra": {EXTRA: {"schema": SCHEMA, "trace_id": trace.trace_id, "source": src,
                              **({"task": trace.task.to_json()} if trace.task else {})}}}


def _label(*values: Any) -> str:
    return next((v for v in values if isinstance(v, str) and v), "unknown")


def write_atif(trace: Trace, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_atif(trace), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
