"""OpenHands rows of HF `nebius/SWE-rebench-openhands-trajectories` -> trace IR.

Input: a JSON array of rows, JSONL (a row per line), or parquet (needs pyarrow, the `convert` extra;
read a batch of rows at a time). A row has `instance_id` and `trajectory`, a list of OpenAI-style
chat messages (system/user/assistant/tool); an assistant message's `tool_calls[].function.arguments`
is a JSON *string*. Each tool call is one step, in message order:

* `execute_bash` -> `bash`: args `command`, `timeout_ms` (from `timeout`, seconds), `is_input` (when
  the call has it: true means the text goes to the running process's stdin, not a new command).
* `str_replace_editor` -> `read` for `view`, `edit` for create/str_replace/insert/undo_edit. It is the
  OpenHands file editor, not a shell command: args `op`, `path` and the edit's own fields
  (`file_text`, `old_str`, `new_str`, `insert_line`, `view_range`), never `command`. A sub-command
  OpenHands would reject is kept as a `noop` step with `rejected: true` (the agent spent the turn).
* `think`, `finish`, `task_tracker` -> `noop` steps, **kept** (with `native_tool` set) so step
  numbering matches the source; they execute nothing.
* other OpenHands tools: `execute_ipython_cell` -> `python`, `browser`/`web_read`/`fetch` -> `browser`,
  `edit_file` -> `edit`, `request_condensation` -> `noop`. Any other name is a TraceError.

The working directory is the last `[Current working directory: ...]` footer of a tool result seen
before the call (OpenHands prints the shell's cwd after each command), carried to following steps;
the first command's cwd is unknown and left out. Rows have no timestamps, so steps have no duration.

What each step recorded is its `recorded_outcome` and `recorded_output` (read from its tool
result, matched by `tool_call_id`): a command's exit code from OpenHands' `[The command completed with exit code N.]`
/ `[Command finished with exit code N]` footer (-1, a command still running when OpenHands stopped
waiting, is status `timeout` without an exit code) and the head of its output without those
footers; an edit's or a view's status (`failed` when the editor answered `ERROR...`) and the head of
its answer (a view's shows the file's lines as they were: workspaces/choose.py compares them).
A command sent as input to a running process (`is_input`) gets none: it has no exit of its own.
The row's `task`: its instance id and repository, the repository directory the user message names
(`<uploaded_files>`) and the version in its name (`/workspace/<org>__<repo>__<version>`), and the
interpreter OpenHands reported (`[Python interpreter: ...]`).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Iterator

from ..ir import Outcome, Step, Trace, TraceError
from ..task import WORKSPACE_PATH, Task
from ._common import (check_bool, check_number, check_str, check_type, fail, finish, head, id_part,
                      iter_row_results, loads, make_trace_id, need, output_head, parquet_columns,
                      parquet_schema_text, row_trajectory, strict)

FORMAT = "openhands-rows"
COLUMNS = ("trajectory_id", "instance_id", "repo", "trajectory")

EDITOR_READ = frozenset({"view"})
EDITOR_EDIT = frozenset({"create", "str_replace", "insert", "undo_edit"})
NOOP_TOOLS = frozenset({"think", "finish", "task_tracker", "request_condensation"})
KNOWN_TOOLS = ("execute_bash", "str_replace_editor", "think", "finish", "task_tracker", "execute_ipython_cell",
               "browser", "web_read", "fetch", "edit_file", "request_condensation")
_CWD_MARK = "[Current working directory: "
_CWD = re.compile(r"\[Current working directory: ([^\]\n]*)\]")
_ROLE = re.compile(r'"role"\s*:\s*"(?:assistant|tool)"')
_EXIT = re.compile(r"\[(?:The command completed with exit code|Command finished with exit code) (-?\d+)\.?\]")
# the lines OpenHands appends to a command's output (its exit code, cwd and interpreter)
_FOOTER = re.compile(r"\n?\[(?:The command completed with exit code -?\d+\.|Command finished with exit code -?\d+"
                     r"|Current working directory: [^\]\n]*|Python interpreter: [^\]\n]*)\]")
_PYTHON = re.compile(r"\[Python interpreter: ([^\]\n]+)\]")
_UPLOADED = re.compile(r"<uploaded_files>\s*(/[^\s<]+)\s*</uploaded_files>")
_OBSERVATION_KEY = re.compile(r'"observation"\s*:')


def sniff(path: Path) -> bool:
    path = Path(path)
    if path.suffix == ".parquet":
        cols = parquet_columns(path)
        return bool(cols) and "trajectory" in cols and "tool_calls" in parquet_schema_text(path)
    if path.suffix not in (".json", ".jsonl"):
        return False
    text = head(path).decode("utf-8", "replace")
    return ('"trajectory"' in text and '"tool_call_id"' in text and _ROLE.search(text) is not None
            and _OBSERVATION_KEY.search(text) is None)


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    """A Trace or a TraceError per row; a file that cannot be read at all raises."""
    return iter_row_results(path, FORMAT, COLUMNS, convert_row)


def _text(content: Any) -> str:
    """A tool result's text (str, or a list of {type, text} parts); anything else has none."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _last_cwd(text: str) -> str | None:
    """The path in the last `[Current working directory: ...]` footer (rfind: outputs can be long)."""
    at = text.rfind(_CWD_MARK)
    if at < 0:
        return None
    m = _CWD.match(text, at)
    return (m.group(1).strip() or None) if m else None


def convert_row(row: Any, where: dict, source: dict, rec: int) -> Trace:
    traj, instance = row_trajectory(row, where, empty="no messages")
    steps: list[Step] = []
    cwd: str | None = None
    waiting: dict[str, int] = {}        # tool_call_id -> index of its step, until its result is seen
    repo_path = python = None
    for mi, msg in enumerate(traj):
        mf = f"trajectory[{mi}]"
        if not isinstance(msg, dict):
            raise fail(f"expected a message object, got {type(msg).__name__}", where, field=mf)
        role = need(msg, "role", str, where, prefix=f"{mf}.")
        if role == "user" and repo_path is None:
            found = _UPLOADED.search(_text(msg.get("content")))
            repo_path = found.group(1) if found else None
        if role == "tool":
            text = _text(msg.get("content"))
            found = _last_cwd(text)
            if found:
                cwd = check_str(found, where, step=len(steps), field=f"{mf}.content")
            python = python or (m.group(1).strip() if (m := _PYTHON.search(text)) else None)
            at = waiting.pop(msg.get("tool_call_id"), None) if isinstance(msg.get("tool_call_id"), str) else None
            if at is not None:
                steps[at] = _with_outcome(steps[at], text)
            continue
        if role != "assistant":
            continue
        calls = msg.get("tool_calls")
        if calls is None:
            continue
        check_type(calls, list, where, step=len(steps), field=f"{mf}.tool_calls")
        for ci, call in enumerate(calls):
            steps.append(_step(call, len(steps), cwd, where, f"{mf}.tool_calls[{ci}]"))
            if isinstance(call, dict) and isinstance(call.get("id"), str):
                waiting[call["id"]] = len(steps) - 1
    if not steps:
        raise fail("empty trajectory: no tool calls", where, field="trajectory")
    return finish(make_trace_id(FORMAT, id_part(instance, f"row{rec}"), rec), source, steps, where,
                  task=_task(row, instance, repo_path, python))


def _with_outcome(step: Step, text: str) -> Step:
    """`step` with what its tool result recorded (module docstring); unchanged for a step that
    executes nothing or a command sent as input to a running process."""
    if step.tool in ("bash", "python") and not step.args.get("is_input"):
        codes = _EXIT.findall(text)
        if not codes:
            return step
        code = int(codes[-1])
        status = "timeout" if code < 0 else "ok" if code == 0 else "failed"
        outcome, output = Outcome(status, code if 0 <= code <= 255 else None), _FOOTER.sub("", text).rstrip()
    elif step.tool in ("edit", "read"):
        outcome, output = Outcome("failed" if text.lstrip().startswith("ERROR") else "ok"), text
    else:
        return step
    return dataclasses.replace(step, recorded_outcome=outcome, recorded_output=output_head(output))


def _task(row: dict, instance: str | None, path: str | None, python: str | None) -> Task | None:
    repo = row.get("repo") if isinstance(row.get("repo"), str) and row.get("repo").strip() else None
    m = WORKSPACE_PATH.match(path) if path else None
    if m and repo is None:
        repo = f"{m.group(2)}/{m.group(3)}"
    fields_ = {"instance_id": instance, "repository": repo, "path": m.group(1) if m else path,
               "version": m.group(4) if m else None, "python": python}
    kept = {k: v for k, v in fields_.items() if isinstance(v, str) and v.strip() and "\0" not in v and len(v) <= 4096}
    return Task(**kept) if kept else None


def _step(call: Any, index: int, cwd: str | None, where: dict, cf: str) -> Step:
    if not isinstance(call, dict):
        raise fail(f"expected a tool call object, got {type(call).__name__}", where, step=index, field=cf)
    fn = need(call, "function", dict, where, step=index, prefix=f"{cf}.")
    name = need(fn, "name", str, where, step=index, prefix=f"{cf}.function.")
    af = f"{cf}.function.arguments"
    raw = need(fn, "arguments", (str, dict), where, step=index, field=af)
    if isinstance(raw, str):
        try:
            args = loads(raw, where)
        except TraceError as exc:
            raise fail(exc.reason, where, step=index, field=af) from None
    else:
        args = raw
    if not isinstance(args, dict):
        raise fail(f"expected a JSON object of arguments, got {type(args).__name__}", where, step=index, field=af)

    def s(key: str) -> str:
        return check_str(need(args, key, str, where, step=index, field=f"{af}.{key}"), where, step=index,
                         field=f"{af}.{key}")

    if name == "execute_bash":
        out: dict[str, Any] = {"command": s("command")}
        if cwd is not None:
            out["cwd"] = cwd
        if args.get("timeout") is not None:
            secs = check_number(args["timeout"], where, step=index, field=f"{af}.timeout", allow_str=True)
            out["timeout_ms"] = round(secs * 1000.0, 3)
        if args.get("is_input") is not None:
            out["is_input"] = check_bool(args["is_input"], where, step=index, field=f"{af}.is_input")
        return Step(step_id=index, tool="bash", native_tool=name, args=out)
    if name == "str_replace_editor":
        op = s("command")
        out = {"op": op, "path": s("path")}
        if op not in EDITOR_READ | EDITOR_EDIT:
            return Step(step_id=index, tool="noop", native_tool=name, args={**out, "rejected": True})
        for key in ("file_text", "old_str", "new_str"):
            if args.get(key) is not None:
                out[key] = s(key)
        for key in ("insert_line",):
            if args.get(key) is not None:
                out[key] = int(check_number(args[key], where, step=index, field=f"{af}.{key}", allow_str=True))
        if args.get("view_range") is not None:
            vr = check_type(args["view_range"], list, where, step=index, field=f"{af}.view_range")
            if len(vr) > 2:
                raise fail("expected [start, end]", where, step=index, field=f"{af}.view_range")
            out["view_range"] = [check_type(v, int, where, step=index, field=f"{af}.view_range") for v in vr]
        if cwd is not None:
            out["cwd"] = cwd
        return Step(step_id=index, tool="read" if op in EDITOR_READ else "edit", native_tool=name, args=out)
    if name in NOOP_TOOLS:
        return Step(step_id=index, tool="noop", native_tool=name, args={})
    if name == "execute_ipython_cell":
        return Step(step_id=index, tool="python", native_tool=name, args={"command": s("code")})
    if name in ("browser", "web_read", "fetch"):
        out = {"method": name}
        for key in ("url", "code"):
            if args.get(key) is not None:
                out[key] = s(key)
        return Step(step_id=index, tool="browser", native_tool=name, args=out)
    if name == "edit_file":
        return Step(step_id=index, tool="edit", native_tool=name, args={"op": "edit_file", "path": s("path")})
    raise fail(f"unknown tool {name[:80]!r}; known: {', '.join(KNOWN_TOOLS)}", where, step=index,
               field=f"{cf}.function.name")
