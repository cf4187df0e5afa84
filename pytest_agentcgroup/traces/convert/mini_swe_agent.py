"""mini-swe-agent trajectories (`<instance>.traj.json`) -> trace IR (one trace per file, id
`mini-swe-agent/<instance_id, else the file name without .traj.json>`).

A file is one JSON object: `messages` (the chat: system prompt, task, then each assistant turn
and the reply the agent gave the model; `content` is a string, or a list of text parts when
cache control was on), `info` (`exit_status`, `submission`, `model_stats`, `mini_version`,
`config`: the agent's templates and regex, `environment` with `image`, `cwd`, `timeout`),
`trajectory_format` ("mini-swe-agent-1") and, from the SWE-bench runner, `instance_id`. mini-swe-agent
2.x writes "mini-swe-agent-1.1": the same file, info and trace, steps read off each message's `extra`
(tool calls, observations with their `returncode`, an `exit` message) by mini_swe_agent_2.py.

**Steps.** mini-swe-agent runs a turn's command only when the turn holds exactly one action (one
```bash fenced block; `<bash_code>...</bash_code>` with the XML config's `action_regex`), else it
replies with its format-error template and runs nothing. Each assistant turn is one IR step, so
step i is the agent's (i+1)-th model call (`model_stats.api_calls` steps in all):

* one action: a `bash` step {command, cwd, timeout_ms}. Every command runs in a fresh subshell in
  `environment.cwd` (a `cd` does not carry over), killed after `environment.timeout` seconds;
* zero or several actions (a format error): a `noop` step, native_tool `format_error`, args
  {"actions": N}; a command the user refused to run (interactive mode, reply "Command not
  executed..."): a `noop` step, native_tool `not_executed`, args {"action": the command}.

**Recorded result** (the reply after the turn), kept in `recorded_outcome` and `recorded_output`
(its first RECORDED_OUTPUT_CHARS characters):

* `<returncode>N</returncode>` then `<output>` (or, for outputs over 10,000 characters,
  `<output_head>`/`<output_tail>`): status ok (N = 0) or failed, exit code N;
* "The last command <command>...</command> timed out and has been killed": status timeout;
* the reply to the last turn of a `Submitted` run: the submission (the submit command's output
  after its marker line); no exit code (mini-swe-agent renders none);
* no reply, or one of another shape ("Interrupted by user"): nothing recorded.

A turn with one action whose reply is the format-error text, or with zero or several whose reply is
a command's result, contradicts the agent's own rule and is refused (the regex we read it with is
not the one it ran with). **Durations:** where messages carry `timestamp` (seconds; newer
versions), a step's `derived` duration_ms is the time from its turn to its reply.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from ..ir import Measure, Outcome, Step, Trace, TraceError
from ..numbers import number_problem
from ._common import (check_number, check_str, check_type, fail, finish, head, id_part, iter_file_result,
                      make_trace_id, need, output_head, strict, tail)
from . import mini_swe_agent_2

FORMAT = "mini-swe-agent"
TRAJECTORY_FORMAT = "mini-swe-agent-1"
TRAJECTORY_FORMATS = (TRAJECTORY_FORMAT, "mini-swe-agent-1.1")     # 1.x's, 2.x's
#: The action regexes of mini-swe-agent's own configs (the default, and the XML variant's), each with
#: the mark that ends a match. Another is refused rather than run: a pattern read from a file can
#: take exponential time.
ACTION_REGEXES = {r"```bash\s*\n(.*?)\n```": "\n```", r"<bash_code>(.*?)</bash_code>": "</bash_code>"}
_MARKER = re.compile(rb'"mini_version"\s*:\s*"|"trajectory_format"\s*:\s*"mini-swe-agent')
#: What the reply to a turn is, by how it begins (the default and the XML templates alike).
REPLIES = {kind: re.compile(r"\s*" + start, re.DOTALL) for kind, start in (
    ("result", r"<returncode>\s*(-?\d{1,12})\s*</returncode>"),
    ("timeout", r"The last command <command>.*?</command> timed out and has been killed"),
    ("format_error", r"Please always provide EXACTLY ONE action"),
    ("not_executed", r"Command not executed\."))}


def sniff(path: Path) -> bool:
    path = Path(path)
    if path.suffix != ".json":
        return False
    start = head(path)
    # `mini_version` sits early in `info`; `trajectory_format` is written last, after the messages
    return start.lstrip().startswith(b"{") and (_MARKER.search(start) is not None
                                                or _MARKER.search(tail(path)) is not None)


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    stem = Path(path).name.removesuffix(".json").removesuffix(".traj")
    return iter_file_result(path, FORMAT, lambda data, where, source: convert_traj(data, where, source, stem))


def _text(msg: Any, where: dict, i: int) -> tuple[str, str]:
    """(role, text) of messages[i]; a list of parts gives its parts' `text` joined."""
    f = f"messages[{i}]"
    role = need(msg, "role", str, where, prefix=f"{f}.")
    content = need(msg, "content", (str, list), where, prefix=f"{f}.")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            check_type(part, dict, where, field=f"{f}.content[{j}]")
            if part.get("text") is not None:
                texts.append(check_type(part["text"], str, where, field=f"{f}.content[{j}].text"))
        content = "\n".join(texts)
    return role, content


class _Actions:
    """The actions of an assistant turn, by one of ACTION_REGEXES."""

    def __init__(self, regex: str):
        self.pattern, self.closing = re.compile(regex, re.DOTALL), ACTION_REGEXES[regex]

    def __call__(self, text: str) -> list[str]:
        # Every match ends at a closing mark, so the text after the last one holds none; cutting it
        # off spares findall a scan to the end from each unclosed opening (quadratic).
        end = text.rfind(self.closing)
        return self.pattern.findall(text[:end + len(self.closing)]) if end >= 0 else []


def _config(info: dict, where: dict) -> tuple[_Actions, dict]:
    """(action parser, environment config) from info.config; defaults where absent."""
    config = check_type(info.get("config", {}), dict, where, field="info.config")
    agent = check_type(config.get("agent", {}), dict, where, field="info.config.agent")
    env = check_type(config.get("environment", {}), dict, where, field="info.config.environment")
    regex = check_type(agent.get("action_regex", next(iter(ACTION_REGEXES))), str, where,
                       field="info.config.agent.action_regex")
    if regex not in ACTION_REGEXES:
        raise fail(f"unsupported action_regex {regex[:60]!r}; this converter reads mini-swe-agent's own: "
                   f"{' or '.join(map(repr, ACTION_REGEXES))}", where, field="info.config.agent.action_regex")
    return _Actions(regex), env


def _step_args(env: dict, where: dict) -> dict:
    """What every command shares: the environment's cwd and timeout."""
    args: dict[str, Any] = {}
    if env.get("cwd"):
        args["cwd"] = check_str(env["cwd"], where, field="info.config.environment.cwd")
    if env.get("timeout") is not None:
        field = "info.config.environment.timeout"
        ms = check_number(env["timeout"], where, field=field, allow_str=True) * 1000.0
        problem = number_problem(ms, "timeout_ms")
        if problem is not None:
            raise fail(f"{problem} (as milliseconds)", where, field=field)
        if ms > 0:
            args["timeout_ms"] = round(ms)
    return args


def _metadata(data: dict, info: dict, env: dict, where: dict) -> dict:
    """The task and run a trajectory names: instance id, image, model, exit status, agent version."""
    model = info.get("config", {}).get("model")
    keys = (("instance_id", data.get("instance_id"), "instance_id"),
            ("image", env.get("image"), "info.config.environment.image"),
            ("model", model.get("model_name") if isinstance(model, dict) else None, "info.config.model.model_name"),
            ("exit_status", info.get("exit_status"), "info.exit_status"),
            ("mini_version", info.get("mini_version"), "info.mini_version"))
    return {key: check_str(val, where, field=field) for key, val, field in keys if val is not None}


def _output(text: str, *, timed_out: bool) -> str:
    """The head of the output in a reply: from its first `<output>` or `<output_head>` tag to the last
    closing one, less the newlines the template put around it (an action's `<output>` has none after)."""
    found = [(at, tag) for tag in ("<output>", "<output_head>") if (at := text.find(tag)) >= 0]
    if not found:
        return ""
    at, tag = min(found)
    end = text.rfind(tag.replace("<", "</"), at)
    body = text[at + len(tag):end if end >= 0 else len(text)]
    body = body[1:] if body.startswith("\n") else body
    if (timed_out or tag != "<output>") and body.endswith("\n"):
        body = body[:-1]
    return output_head(body)


def _reply_kind(reply: str | None) -> tuple[str | None, re.Match | None]:
    """(kind in REPLIES or "other", its match); (None, None) when there is no reply."""
    if reply is None:
        return None, None
    for kind, pattern in REPLIES.items():
        m = pattern.match(reply)
        if m:
            return kind, m
    return "other", None


def _recorded(reply: str, kind: str, m: re.Match | None, submission: bool, where: dict, i: int,
              f: str) -> tuple[Outcome | None, str | None]:
    """(recorded outcome, output head) of a turn whose one action ran, from its reply."""
    if kind == "result":
        code = int(m.group(1))
        problem = number_problem(code, "exit_code")
        if problem is not None:
            raise fail(f"returncode {problem}", where, step=i, field=f)
        return Outcome("ok" if code == 0 else "failed", code), _output(reply[m.end():], timed_out=False)
    if kind == "timeout":
        return Outcome("timeout", None), _output(reply[m.end():], timed_out=True)
    return None, (output_head(reply) if submission else None)


def _duration(turn: dict, reply: dict | None, where: dict, i: int, k: int) -> Measure | None:
    if reply is None or turn.get("timestamp") is None or reply.get("timestamp") is None:
        return None
    start = check_number(turn["timestamp"], where, step=i, field=f"messages[{k}].timestamp")
    end = check_number(reply["timestamp"], where, step=i, field=f"messages[{k + 1}].timestamp")
    if end < start:
        raise fail(f"the reply is stamped {start - end:.3f} s before its turn", where, step=i,
                   field=f"messages[{k + 1}].timestamp")
    return Measure(round((end - start) * 1000.0, 3), "derived")


def _turn_step(i: int, k: int, messages: list, texts: list[tuple[str, str]], actions_of: _Actions, shared: dict,
               submitted: bool, where: dict) -> Step:
    """Step i, of the assistant turn messages[k] and the reply after it."""
    f = f"messages[{k}].content"
    has_reply = k + 1 < len(messages) and texts[k + 1][0] != "assistant"
    reply = texts[k + 1][1] if has_reply else None
    kind, m = _reply_kind(reply)
    actions = actions_of(texts[k][1])
    duration = _duration(messages[k], messages[k + 1] if has_reply else None, where, i, k)
    if len(actions) != 1:
        if kind in ("result", "timeout"):
            raise fail(f"{len(actions)} actions, yet the reply (messages[{k + 1}]) is a command's result: "
                       "not how mini-swe-agent answers", where, step=i, field=f)
        return Step(step_id=i, tool="noop", native_tool="format_error", args={"actions": len(actions)},
                    duration_ms=duration)
    command = check_str(actions[0].strip(), where, step=i, field=f)
    if kind == "format_error":
        raise fail(f"one action, yet the reply (messages[{k + 1}]) is the format error: not how "
                   "mini-swe-agent answers", where, step=i, field=f)
    if kind == "not_executed":
        return Step(step_id=i, tool="noop", native_tool="not_executed", args={"action": command},
                    duration_ms=duration)
    outcome, output = (None, None) if reply is None else _recorded(
        reply, kind, m, submitted and k + 2 == len(messages), where, i, f"messages[{k + 1}].content")
    return Step(step_id=i, tool="bash", native_tool="bash", args={"command": command, **shared},
                duration_ms=duration, recorded_outcome=outcome, recorded_output=output)


def convert_traj(data: Any, where: dict, source: dict, stem: str) -> Trace:
    if not isinstance(data, dict):
        raise fail(f"expected a trajectory object, got {type(data).__name__}", where)
    fmt = data.get("trajectory_format", TRAJECTORY_FORMAT)
    if fmt not in TRAJECTORY_FORMATS:
        raise fail(f"unsupported trajectory_format {str(fmt)[:60]!r}; this converter reads "
                   f"{' or '.join(map(repr, TRAJECTORY_FORMATS))}", where, field="trajectory_format")
    messages = need(data, "messages", list, where)
    info = check_type(data.get("info", {}), dict, where, field="info")
    actions_of, env = _config(info, where)
    shared = _step_args(env, where)
    source = {**source, **_metadata(data, info, env, where)}
    if fmt == TRAJECTORY_FORMAT:
        submitted = info.get("exit_status") == "Submitted"
        texts = [_text(m, where, k) for k, m in enumerate(messages)]
        turns = [k for k, (role, _) in enumerate(texts) if role == "assistant"]
        steps = [_turn_step(i, k, messages, texts, actions_of, shared, submitted, where) for i, k in enumerate(turns)]
    else:
        steps = mini_swe_agent_2.steps(messages, shared, where)
    trace_id = make_trace_id(FORMAT, id_part(source.get("instance_id"), id_part(stem, "trajectory")))
    return finish(trace_id, source, steps, where, what="messages")
