"""The steps of a mini-swe-agent 2.x trajectory (`trajectory_format` "mini-swe-agent-1.1"); the file, its
`info` and the trace around the steps are read as 1.x's are (mini_swe_agent.py, which calls `steps`).

2.x keeps what the agent ran in each message's `extra`, so no step is parsed out of the chat text:

* a **turn** (an `assistant` message; a `user` one for a command the user typed in human mode) holds
  `extra.actions`, a list of {command, tool_call_id (tool-call models only)}, which the agent runs in
  order; without `extra.actions`, its `tool_calls` (bash calls, `function.arguments` the JSON
  {"command": ...}). Where both are present, an action's command must be its call's. Every action is
  a `bash` step {command, cwd, timeout_ms}.
* an **observation** (a `tool` message, or a `user` one whose `extra` holds `returncode`: text-based
  models) answers the oldest unanswered action of the last turn (a `tool` message names it by
  `tool_call_id`). The Responses-API models write role-less items instead: a `response` object is
  a turn, a `function_call_output` (naming its call by `call_id`) an observation. Recorded: `extra.returncode` (ok for 0, else failed, with the code), timeout when
  `extra.exception_type` is TimeoutExpired, error when another exception stopped the command
  (`exception_info`), the output from `extra.raw_output`. The agent's padding for an action it never ran
  (exception_info "action was not executed") makes that action a `noop` step, native_tool
  `not_executed`, args {"action": the command}.
* a **format error** (a `user` message, `extra.interrupt_type` "FormatError"; 2.x keeps the model's
  reply only inside it) is a `noop` step, native_tool `format_error`, args {"actions": N} where the
  text-based parser counted N actions (`extra.n_actions`), else {}.
* the **exit** message ends the run. In a `Submitted` run the environment stops on the submit command
  before any result is written, so the final turn's first action with no result of its own is the
  submit: its recorded output is the submission, with no exit code (as 1.x); actions after it never
  ran (not_executed). A final turn of several actions none of which has a result (the default agent
  drops them all) gets bash steps with nothing recorded: which one submitted is not written down.
* everything else (system prompt, task, interruptions, a new task) is no step.

**Durations:** a turn of one action whose turn and observation carry `extra.timestamp` (seconds) gets
a `derived` duration_ms from the one to the other (observations of a turn are all stamped after its
last command, so a turn of several actions gets none).
"""
from __future__ import annotations

import json
from typing import Any, Iterator

from ..ir import Measure, Outcome, Step
from ..numbers import number_problem
from ._common import check_number, check_str, check_type, fail, need, output_head

NOT_EXECUTED = "action was not executed"


class _Action:
    """One action of a turn: messages[k].extra.actions[j] (or .tool_calls[j]), and its observation."""

    def __init__(self, command: str, call_id: str | None, k: int):
        self.command, self.call_id, self.k = command, call_id, k
        self.reply: dict | None = None          # the observation's `extra`
        self.reply_k: int | None = None


def _get(obj: dict, key: str, default: Any) -> Any:
    """obj[key], `default` where absent or null."""
    value = obj.get(key)
    return default if value is None else value


def _call_commands(msg: dict, where: dict, k: int) -> dict[str, tuple[str, str]]:
    """{call id: (command, its field)} of messages[k].tool_calls."""
    f = f"messages[{k}].tool_calls"
    calls = check_type(_get(msg, "tool_calls", []), list, where, field=f)
    out = {}
    for j, call in enumerate(calls):
        fn = need(call, "function", dict, where, prefix=f"{f}[{j}].")
        name = need(fn, "name", str, where, prefix=f"{f}[{j}].function.")
        if name != "bash":
            raise fail(f"tool {name[:40]!r}: mini-swe-agent's one tool is bash", where, field=f"{f}[{j}].function.name")
        raw = need(fn, "arguments", (str, dict), where, prefix=f"{f}[{j}].function.")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError as exc:
            raise fail(f"invalid JSON: {exc}", where, field=f"{f}[{j}].function.arguments") from None
        command = need(args, "command", str, where, prefix=f"{f}[{j}].function.arguments.")
        call_id = need(call, "id", str, where, prefix=f"{f}[{j}].")
        out[call_id] = (command, f"{f}[{j}].function.arguments.command")
    return out


def _actions(msg: dict, extra: dict, where: dict, k: int) -> list[_Action]:
    """The actions of the turn messages[k], in the order the agent ran them."""
    calls = _call_commands(msg, where, k)
    if "actions" not in extra:
        return [_Action(check_str(cmd, where, field=f), cid, k) for cid, (cmd, f) in calls.items()]
    out = []
    for j, action in enumerate(check_type(extra["actions"], list, where, field=f"messages[{k}].extra.actions")):
        f = f"messages[{k}].extra.actions[{j}]"
        command = check_str(need(action, "command", str, where, prefix=f"{f}."), where, field=f"{f}.command")
        call_id = action.get("tool_call_id")
        if call_id is not None or calls:
            call_id = need(action, "tool_call_id", str, where, prefix=f"{f}.")
        if calls and (call_id not in calls or calls[call_id][0] != command):
            raise fail(f"names tool call {call_id[:40]!r}, which is not in messages[{k}].tool_calls with "
                       "this command", where, field=f"{f}.tool_call_id")
        out.append(_Action(command, call_id, k))
    return out


def _role(msg: Any, where: dict, k: int) -> str:
    """messages[k]'s role; a Responses-API item without one counts as the chat message it stands for."""
    if isinstance(msg, dict) and "role" not in msg:
        if msg.get("object") == "response":
            return "assistant"
        if msg.get("type") == "function_call_output":
            return "tool"
    return need(msg, "role", str, where, prefix=f"messages[{k}].")


def _is_observation(role: str, extra: dict) -> bool:
    return role == "tool" or (role == "user" and "returncode" in extra and "actions" not in extra)


def _answer(pending: Iterator[_Action], msg: dict, extra: dict, where: dict, k: int) -> None:
    """Gives messages[k], an observation, to the oldest unanswered action of the last turn (`pending`)."""
    action = next(pending, None)
    if action is None:
        raise fail("an observation with no action waiting for it", where, field=f"messages[{k}]")
    if msg.get("role", "tool") == "tool":
        key = "call_id" if msg.get("type") == "function_call_output" else "tool_call_id"
        call_id = need(msg, key, str, where, prefix=f"messages[{k}].")
        if call_id != action.call_id:
            raise fail(f"answers tool call {call_id[:40]!r}, but the next unanswered one is {action.call_id!r}",
                       where, field=f"messages[{k}].{key}")
    code = need(extra, "returncode", int, where, prefix=f"messages[{k}].extra.")
    for key in ("raw_output", "exception_info", "exception_type"):
        if extra.get(key) is not None:
            check_type(extra[key], str, where, field=f"messages[{k}].extra.{key}")
    # with an exception the code is the agent's placeholder (-1), not a process's
    problem = None if extra.get("exception_info") else number_problem(code, "exit_code")
    if problem is not None:
        raise fail(f"returncode {problem}", where, field=f"messages[{k}].extra.returncode")
    action.reply, action.reply_k = extra, k


def _recorded(extra: dict) -> Outcome:
    code = extra["returncode"]
    if extra.get("exception_type") == "TimeoutExpired":
        return Outcome("timeout", None)
    if extra.get("exception_info"):
        return Outcome("error", None)
    return Outcome("ok" if code == 0 else "failed", code)


def _duration(turn: dict, action: _Action, where: dict, i: int) -> Measure | None:
    start, end = turn.get("timestamp"), action.reply.get("timestamp") if action.reply else None
    if start is None or end is None:
        return None
    start = check_number(start, where, step=i, field=f"messages[{action.k}].extra.timestamp")
    end = check_number(end, where, step=i, field=f"messages[{action.reply_k}].extra.timestamp")
    if end < start:
        raise fail(f"the observation is stamped {start - end:.3f} s before its turn", where, step=i,
                   field=f"messages[{action.reply_k}].extra.timestamp")
    return Measure(round((end - start) * 1000.0, 3), "derived")


def _turn_steps(turn: list[_Action], turn_extra: dict, shared: dict, submission: str | None,
                first: int, where: dict) -> list[Step]:
    """Steps first, first+1, ... of one turn's actions; `submission` when this turn is a Submitted run's last."""
    answered = [a.reply is not None and a.reply.get("exception_info") != NOT_EXECUTED for a in turn]
    submit = None
    if submission is not None and not all(answered) and (any(answered) or len(turn) == 1):
        submit = answered.index(False)
    steps = []
    for j, action in enumerate(turn):
        i = first + j
        if (submit is not None and j > submit) or (submit is None and action.reply is not None and not answered[j]):
            steps.append(Step(step_id=i, tool="noop", native_tool="not_executed", args={"action": action.command}))
            continue
        outcome = output = None
        if j == submit:
            output = output_head(submission)
        elif answered[j]:
            outcome, output = _recorded(action.reply), output_head(action.reply.get("raw_output") or "")
        duration = _duration(turn_extra, action, where, i) if len(turn) == 1 else None
        steps.append(Step(step_id=i, tool="bash", native_tool="bash", args={"command": action.command, **shared},
                          duration_ms=duration, recorded_outcome=outcome, recorded_output=output))
    return steps


def steps(messages: list, shared: dict, where: dict) -> list[Step]:
    """The steps of a 2.x trajectory's messages; `shared`: the args every command has (cwd, timeout_ms)."""
    items: list[Any] = []              # in order: a turn (its _Actions, its extra), or a format error (a Step)
    pending: Iterator[_Action] = iter(())        # the last turn's actions not yet answered
    exit_extra: dict | None = None
    for k, msg in enumerate(messages):
        role = _role(msg, where, k)
        extra = check_type(_get(msg, "extra", {}), dict, where, field=f"messages[{k}].extra")
        if exit_extra is not None:
            raise fail("a message after the exit message", where, field=f"messages[{k}]")
        if role == "exit":
            exit_extra = extra
        elif _is_observation(role, extra):
            _answer(pending, msg, extra, where, k)
        elif role == "assistant" or (role == "user" and "actions" in extra):
            turn = _actions(msg, extra, where, k)
            pending = iter(turn)
            items.append((turn, extra))
        elif role == "user" and extra.get("interrupt_type") == "FormatError":
            n = extra.get("n_actions")
            args = {"actions": n} if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else {}
            items.append(Step(step_id=0, tool="noop", native_tool="format_error", args=args))
    submission = None
    if exit_extra is not None and exit_extra.get("exit_status") == "Submitted":
        submission = check_type(exit_extra.get("submission", ""), str, where,
                                field=f"messages[{len(messages) - 1}].extra.submission")
    last_turn = max((n for n, item in enumerate(items) if isinstance(item, tuple)), default=None)
    out: list[Step] = []
    for n, item in enumerate(items):
        if isinstance(item, Step):
            out.append(Step(step_id=len(out), tool=item.tool, native_tool=item.native_tool, args=item.args))
        else:
            out += _turn_steps(item[0], item[1], shared, submission if n == last_turn else None, len(out), where)
    return out
