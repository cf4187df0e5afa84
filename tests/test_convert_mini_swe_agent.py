"""mini-swe-agent converter: the 5 real `.traj.json` samples (tests/data/mini-swe-agent), sniffing
against every other format's samples, hand-built variants, bad input, fuzzing, the command line; and
2.x's format (mini-swe-agent-1.1): a trajectory written by mini-swe-agent 2.4.6's own agent loop
(tests/data/mini-swe-agent-2), variants of it, bad input, fuzzing.

Expected steps were read off each sample by hand: one step per assistant message, a `bash` step
when it holds exactly one ```bash block, the exit code from the `<returncode>` of the user message
after it (see tests/data/mini-swe-agent/README.md for the per-file notes).
"""
from __future__ import annotations

import copy
import json
import time
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from pytest_agentcgroup import cli
from pytest_agentcgroup.traces import convert as registry
from pytest_agentcgroup.traces.convert import mini_swe_agent as conv
from pytest_agentcgroup.traces.ir import parse_trace, read_traces
from converter_checks import (DATASETS, FUZZ, check_converter, expect_trace_error, json_values, maybe_cut, mutated,
                              only_trace)

FOLDER = Path(__file__).parent / "data" / "mini-swe-agent"
SAMPLES = {name: FOLDER / f"{name}.traj.json" for name in (
    "django__django-16255", "django__django-13670", "sympy__sympy-16886", "matplotlib__matplotlib-25287",
    "matplotlib__matplotlib-24637")}
V2 = Path(__file__).parent / "data" / "mini-swe-agent-2" / "local-run.traj.json"
DJANGO, MPL_TIMEOUT, MPL_FORMAT = (SAMPLES["django__django-16255"], SAMPLES["matplotlib__matplotlib-25287"],
                                   SAMPLES["matplotlib__matplotlib-24637"])
_one = partial(only_trace, conv)
_err = partial(expect_trace_error, conv)


def _outcomes(t):
    return [(s.recorded_outcome.status, s.recorded_outcome.exit_code) if s.recorded_outcome else None for s in t.steps]


# ---------------------------------------------------------------------------------------------
# Sniffing: ours are ours, nobody else's are

@pytest.mark.parametrize("path", [*SAMPLES.values(), V2], ids=lambda p: p.name)
def test_sniff(path):
    assert conv.sniff(path) and registry.sniff(path) == "mini-swe-agent"
    for fmt in registry.formats():
        if fmt != "mini-swe-agent":
            assert not registry.converter(fmt).sniff(path), fmt


def _other_samples():
    folders = [DATASETS / d for d in ("swe-agent-traj", "swe-agent-hf-rows", "openhands-events",
                                      "openhands-swe-rebench-row", "playwright-trace")]
    found = [p for d in folders if d.is_dir() for p in sorted(d.iterdir()) if p.name != "README.md"]
    return found + [Path(__file__).parent / "data" / "openhands-resolver" / "output.jsonl"]


@pytest.mark.parametrize("path", _other_samples(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_other_formats_are_not_sniffed_as_mini_swe_agent(path):
    assert not conv.sniff(path)
    assert registry.sniff(path) not in (None, "mini-swe-agent")


def test_other_claude_code_files_are_not_sniffed():
    cc = DATASETS / "agentcgroup-claude-code"
    files = sorted(cc.glob("*/*/*.json"))[:6] if cc.is_dir() else []
    for p in files:
        assert not conv.sniff(p), p


def test_sniff_finds_the_format_at_the_end_of_a_big_file(tmp_path):
    # `info` (with mini_version) is absent here and the messages fill the sniffed head
    p = tmp_path / "big.json"
    p.write_text(json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}],
                             "trajectory_format": "mini-swe-agent-1"}))
    assert conv.sniff(p)
    p.write_text(json.dumps({"messages": [], "trajectory_format": "something-else"}))
    assert not conv.sniff(p)


# ---------------------------------------------------------------------------------------------
# The real samples

def test_django_16255_counted_by_hand():
    t = _one(DJANGO)
    assert t.trace_id == "mini-swe-agent/django__django-16255"
    assert len(t.steps) == 17                      # 17 assistant messages, one ```bash block each
    assert {(s.tool, s.native_tool) for s in t.steps} == {("bash", "bash")}
    assert [s.command for s in t.steps[:2]] == ["ls -R django/contrib/sitemaps",
                                                "nl -ba django/contrib/sitemaps/__init__.py | sed -n '150,180p'"]
    assert t.steps[4].command == ("sed -i '171s/except TypeError:/except (TypeError, ValueError):/' "
                                  "django/contrib/sitemaps/__init__.py")
    assert t.steps[5].args == {"command": "nl -ba django/contrib/sitemaps/__init__.py | sed -n '165,175p'",
                               "cwd": "/testbed", "timeout_ms": 60000}
    # every command returned 0; the submit command's reply is the submission, with no return code
    assert _outcomes(t) == [("ok", 0)] * 16 + [None]
    assert t.steps[16].command == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
    assert t.steps[16].recorded_output.startswith("diff --git a/django/contrib/sitemaps/__init__.py")
    assert t.steps[3].recorded_output == ("Attempting to get latest lastmod...\n"
                                          "Caught expected ValueError: max() arg is an empty sequence\n")
    assert t.steps[2].recorded_output == ""        # `cat <<'EOF' > reproduce_issue.py` prints nothing
    assert all(s.duration_ms is None for s in t.steps)   # 1.15 messages carry no timestamps
    assert t.source == {
        "format": "mini-swe-agent", "path": "mini-swe-agent/django__django-16255.traj.json",
        "dataset": "mini-swe-agent 1.15 + Gemini 3 Pro on SWE-bench Verified (swebench_results)",
        "licence": "MIT", "origin": "gruckion/mini-swe-agent@d12a71affd95403b036b2bdbd827349b77bfffb9",
        "instance_id": "django__django-16255", "model": "google/gemini-3-pro-preview",
        "image": "docker.io/swebench/sweb.eval.x86_64.django_1776_django-16255:latest",
        "exit_status": "Submitted", "mini_version": "1.15.0"}


def test_matplotlib_25287_timeout_and_a_format_error():
    t = _one(MPL_TIMEOUT)
    assert len(t.steps) == 32
    assert Counter(s.tool for s in t.steps) == {"bash": 31, "noop": 1}
    # message 24 holds two ```bash blocks (two seds, then a grep): nothing ran
    assert t.steps[11].to_json() == {"step_id": 11, "tool": "noop", "native_tool": "format_error",
                                     "args": {"actions": 2}}
    # message 46 ran the whole test_axes.py, killed at the 60 s timeout
    assert t.steps[22].command == "pytest lib/matplotlib/tests/test_axes.py"
    assert t.steps[22].recorded_outcome.to_json() == {"status": "timeout", "exit_code": None}
    assert t.steps[22].recorded_output.startswith("============================= test session starts")
    oc = _outcomes(t)
    assert [i for i, o in enumerate(oc) if o == ("failed", 1)] == [5, 23, 25]
    assert oc[5] == ("failed", 1) and t.steps[5].recorded_output == ""       # a grep that found nothing
    assert oc[11] is None and oc[31] is None
    assert oc.count(("ok", 0)) == 26


def test_matplotlib_24637_zero_and_several_blocks():
    t = _one(MPL_FORMAT)
    assert len(t.steps) == 41
    assert [(s.step_id, s.args) for s in t.steps if s.tool == "noop"] == [
        (16, {"actions": 3}), (25, {"actions": 0}), (32, {"actions": 2})]
    assert sum(s.tool == "bash" for s in t.steps) == 38


def test_sympy_16886_long_output_keeps_the_head():
    t = _one(SAMPLES["sympy__sympy-16886"])
    assert len(t.steps) == 23
    # message 3: over 10,000 characters, shown as <output_head>/<output_tail>: the head is kept
    assert t.steps[0].recorded_output.startswith(".\n./AUTHORS\n./README.rst\n./sympy\n")
    assert len(t.steps[0].recorded_output) == 1000
    assert [i for i, o in enumerate(_outcomes(t)) if o == ("failed", 1)] == [5, 7, 11, 19]


def test_django_13670():
    t = _one(SAMPLES["django__django-13670"])
    assert len(t.steps) == 22
    assert t.steps[10].native_tool == "format_error" and t.steps[13].recorded_outcome.exit_code == 1


@pytest.mark.parametrize("path", SAMPLES.values(), ids=lambda p: p.name)
def test_one_step_per_model_call(path):
    t = _one(path)
    doc = json.loads(path.read_text())
    assert len(t.steps) == doc["info"]["model_stats"]["api_calls"]
    assert parse_trace(t.to_json()).to_json() == t.to_json()    # recorded_* survive the round trip


# ---------------------------------------------------------------------------------------------
# Hand-built files

def _doc(*turns, **info):
    """A trajectory: system and task messages, then (assistant, reply) pairs; a reply None is left out."""
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for turn, reply in turns:
        messages.append({"role": "assistant", "content": turn})
        if reply is not None:
            messages.append({"role": "user", "content": reply})
    env = info.pop("environment", {"image": "img", "cwd": "/testbed", "timeout": 60})
    agent = info.pop("agent", {})
    return {"info": {"exit_status": "Submitted", "submission": "", "mini_version": "1.17.3",
                     "config": {"agent": agent, "model": {"model_name": "m"}, "environment": env}, **info},
            "messages": messages, "trajectory_format": "mini-swe-agent-1", "instance_id": "o__r-1"}


def _act(cmd):
    return f"THOUGHT: x\n\n```bash\n{cmd}\n```"


def _rc(code, out=""):
    return f"<returncode>{code}</returncode>\n<output>\n{out}</output>"


def _write(tmp_path, doc, name="o__r-1.traj.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_timestamps_give_derived_durations_and_parts_are_joined(tmp_path):
    doc = _doc((_act("ls"), _rc(0, "a\n")), (_act("false"), _rc(1)))
    for m, ts in zip(doc["messages"], (0, 1, 10.0, 10.25, 11.0, 11.5)):
        m["timestamp"] = ts
    doc["messages"][4]["content"] = [{"type": "text", "text": _act("false"), "cache_control": {"type": "x"}},
                                     {"type": "image_url"}]
    t = _one(_write(tmp_path, doc))
    assert [(s.duration_ms.value, s.duration_ms.provenance) for s in t.steps] == [(250.0, "derived"),
                                                                               (500.0, "derived")]
    assert [s.command for s in t.steps] == ["ls", "false"] and _outcomes(t) == [("ok", 0), ("failed", 1)]
    assert t.steps[0].recorded_output == "a\n"


def test_xml_config_and_interactive_replies(tmp_path):
    doc = _doc(("<bash_code>ls</bash_code>", _rc(0)),
               ("<bash_code>rm -rf /</bash_code>", "Command not executed. The user rejected your command"),
               ("<bash_code>sleep 99</bash_code>", "Interrupted by user: stop"),
               ("```bash\nls\n```", "Please always provide EXACTLY ONE action in the `<bash_code>` block, found 0"),
               ("<bash_code>make</bash_code>", None),
               agent={"action_regex": "<bash_code>(.*?)</bash_code>"}, exit_status="KeyboardInterrupt")
    t = _one(_write(tmp_path, doc))
    assert [(s.tool, s.native_tool) for s in t.steps] == [
        ("bash", "bash"), ("noop", "not_executed"), ("bash", "bash"), ("noop", "format_error"), ("bash", "bash")]
    assert t.steps[1].args == {"action": "rm -rf /"}
    assert _outcomes(t) == [("ok", 0), None, None, None, None]
    assert [s.recorded_output for s in t.steps] == ["", None, None, None, None]


def test_timeout_reply_and_the_file_name_as_id(tmp_path):
    reply = ("The last command <command>sleep 100</command> timed out and has been killed.\n"
             "The output of the command was:\n <output>\npartial\n</output>\nPlease try another command.")
    doc = _doc((_act("sleep 100"), reply), environment={})
    del doc["instance_id"]
    t = _one(_write(tmp_path, doc, name="my run.traj.json"))
    assert t.trace_id == "mini-swe-agent/my_run"
    assert t.steps[0].args == {"command": "sleep 100"}            # no cwd, no timeout recorded
    assert (t.steps[0].recorded_outcome.status, t.steps[0].recorded_output) == ("timeout", "partial")
    assert t.source["licence"] == "unknown" and "instance_id" not in t.source


def _mut(doc, path, value):
    doc = copy.deepcopy(doc)
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return doc


_GOOD = _doc((_act("ls"), _rc(0)), (_act("cat x"), _rc(1)))


@pytest.mark.parametrize("doc, expect", [
    ([], ["expected a trajectory object"]),
    ({"info": {}}, ["field 'messages'", "missing"]),
    (_mut(_GOOD, ["messages"], {}), ["field 'messages'", "expected list"]),
    (_mut(_GOOD, ["messages"], _GOOD["messages"][:2]), ["field 'messages'", "empty trajectory"]),
    (_mut(_GOOD, ["messages", 2], "hi"), ["field 'messages[2]'", "expected an object"]),
    (_mut(_GOOD, ["messages", 2], {"content": "x"}), ["field 'messages[2].role'", "missing"]),
    (_mut(_GOOD, ["messages", 2, "content"], 5), ["field 'messages[2].content'", "expected str or list"]),
    (_mut(_GOOD, ["messages", 2, "content"], ["x"]), ["field 'messages[2].content[0]'", "expected dict"]),
    (_mut(_GOOD, ["messages", 2, "content"], [{"text": 1}]), ["field 'messages[2].content[0].text'", "expected str"]),
    (_mut(_GOOD, ["trajectory_format"], "mini-swe-agent-2"), ["field 'trajectory_format'", "unsupported"]),
    (_mut(_GOOD, ["info"], []), ["field 'info'", "expected dict"]),
    (_mut(_GOOD, ["info", "config", "agent", "action_regex"], "(a+)+$"),
     ["field 'info.config.agent.action_regex'", "unsupported action_regex"]),
    (_mut(_GOOD, ["info", "config", "environment", "timeout"], -1),
     ["field 'info.config.environment.timeout'", ">= 0"]),
    (_mut(_GOOD, ["info", "config", "environment", "timeout"], 1e300),
     ["field 'info.config.environment.timeout'", "at most"]),
    (_mut(_GOOD, ["info", "config", "environment", "cwd"], ["/x"]), ["field 'info.config.environment.cwd'", "expected str"]),
    (_mut(_GOOD, ["instance_id"], 7), ["field 'instance_id'", "expected str"]),
    (_mut(_GOOD, ["messages", 3, "content"], _rc(999)), ["step 0", "field 'messages[3].content'", "returncode"]),
    (_mut(_GOOD, ["messages", 2, "content"], _act("a") + _act("b")),
     ["step 0", "field 'messages[2].content'", "2 actions, yet the reply (messages[3]) is a command's result"]),
    (_mut(_GOOD, ["messages", 3, "content"], "Please always provide EXACTLY ONE action in triple backticks, found 2"),
     ["step 0", "field 'messages[2].content'", "one action, yet the reply (messages[3]) is the format error"]),
    (_mut(_GOOD, ["messages", 2, "content"], _act("ls\u0000")), ["step 0", "field 'messages[2].content'", "NUL"]),
    (_mut(_GOOD, ["messages", 4, "content"], _act("x" * (2 << 20))), ["step 1", "field 'messages[4].content'", "limit"]),
])
def test_bad_files(tmp_path, doc, expect):
    _err(_write(tmp_path, doc), expect)


def test_timestamps_out_of_order(tmp_path):
    doc = _doc((_act("ls"), _rc(0)))
    doc["messages"][2]["timestamp"], doc["messages"][3]["timestamp"] = 5.0, 4.0
    _err(_write(tmp_path, doc), ["step 0", "field 'messages[3].timestamp'", "before its turn"])
    doc["messages"][3]["timestamp"] = "soon"
    _err(_write(tmp_path, doc), ["step 0", "field 'messages[3].timestamp'", "expected int or float"])


def test_unclosed_blocks_take_linear_time(tmp_path):
    # 20,000 openings with no closing mark after them: the regex alone scans to the end from each
    doc = _doc((_act("ls") + "```bash\nx" * 20_000, _rc(0)), ("```bash\nx" * 20_000, None))
    t0 = time.process_time()
    t = _one(_write(tmp_path, doc))
    assert time.process_time() - t0 < 2.0
    assert [(s.tool, s.command, s.args.get("actions")) for s in t.steps] == [("bash", "ls", None), ("noop", None, 0)]


def test_truncated_and_nul(tmp_path):
    p = tmp_path / "t.traj.json"
    p.write_text(DJANGO.read_text()[:5000])
    _err(p, ["invalid JSON"])
    p.write_bytes(b'{"messages": [\x00]}')
    _err(p, ["NUL byte"])


# ---------------------------------------------------------------------------------------------
# The command line

def test_cli_converts_a_sample(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["traces", "convert", str(DJANGO), str(MPL_TIMEOUT), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{DJANGO}: mini-swe-agent, 1 trace(s), 17 step(s)" in text
    assert f"{MPL_TIMEOUT}: mini-swe-agent, 1 trace(s), 32 step(s)" in text
    (t,) = read_traces(out / "mini-swe-agent" / "matplotlib__matplotlib-25287.json")
    assert t.steps[22].recorded_outcome.status == "timeout" and t.steps[11].tool == "noop"
    assert cli.main(["traces", "validate", str(out / "mini-swe-agent" / "django__django-16255.json")]) == 0


def test_cli_names_a_bad_file(tmp_path, capsys):
    p = _write(tmp_path, _mut(_GOOD, ["messages", 3, "content"], _rc(-300)))
    assert cli.main(["traces", "convert", str(p), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert str(p) in err and "field 'messages[3].content'" in err


# ---------------------------------------------------------------------------------------------
# Fuzzing

json_value = json_values(
    [_act("ls"), _rc(0, "x"), _rc(2), "Please always provide EXACTLY ONE action", "mini-swe-agent-1",
     "<output_head>\nx\n</output_head>", "The last command <command>x</command> timed out and has been killed",
     "assistant", "user", "Submitted", "mini-swe-agent-1.1", "tool", "exit"],
    ["messages", "role", "content", "text", "info", "config", "agent", "environment", "cwd", "timeout", "image",
     "action_regex", "timestamp", "trajectory_format", "instance_id", "exit_status", "model", "extra", "actions",
     "command", "returncode", "tool_calls", "tool_call_id"])


@FUZZ
@given(doc=json_value)
def test_fuzz_generated(fuzz_dir, doc):
    p = fuzz_dir / "gen.traj.json"
    p.write_text(json.dumps(doc))
    check_converter(conv, p)


@pytest.fixture(scope="module")
def small_real_traj():
    doc = json.loads(MPL_TIMEOUT.read_text())
    doc["info"]["config"]["agent"] = {}
    doc["info"]["submission"] = doc["info"]["submission"][:50]
    doc["messages"] = doc["messages"][:2] + doc["messages"][22:28] + doc["messages"][44:]
    for m in doc["messages"]:
        m.pop("extra", None)
        if m["role"] != "assistant":
            m["content"] = m["content"][:300]
    assert len(conv.convert_traj(doc, {"file": "x"}, {}, "x").steps) == 14
    return doc


@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_fuzz_mutated_real_traj(fuzz_dir, small_real_traj, data):
    p = fuzz_dir / "mut.traj.json"
    p.write_text(maybe_cut(data, json.dumps(mutated(data, small_real_traj, json_value, ("replace", "delete", "nul",
                                                                                        "fence")))))
    check_converter(conv, p)


# ---------------------------------------------------------------------------------------------
# 2.x (trajectory_format mini-swe-agent-1.1): the generated trajectory, variants of it, bad input

def _v2():
    return json.loads(V2.read_text())


def test_v2_real_trajectory_steps_are_its_tool_calls():
    doc, t = _v2(), _one(V2)
    calls = [(k, json.loads(c["function"]["arguments"])["command"], c["id"])
             for k, m in enumerate(doc["messages"]) for c in m.get("tool_calls") or []]
    replies = {m["tool_call_id"]: m["extra"] for m in doc["messages"] if m["role"] == "tool"}
    bash = [s for s in t.steps if s.tool == "bash"]
    assert len(t.steps) == len(calls) + 1 == 8          # the format error (messages[7]) is a noop
    assert t.steps[3].to_json() == {"step_id": 3, "tool": "noop", "native_tool": "format_error", "args": {}}
    assert [s.command for s in bash] == [cmd for _, cmd, _ in calls]
    cwd = doc["info"]["config"]["environment"]["cwd"]
    assert all(s.args == {"command": s.command, "cwd": cwd, "timeout_ms": 2000} for s in bash)
    # every call but the submit has its tool message; its returncode is the recorded exit code
    assert [replies[cid]["returncode"] for _, _, cid in calls[:-1]] == [0, 0, 0, 2, 1, -1]
    assert _outcomes(t) == [("ok", 0), ("ok", 0), ("ok", 0), None, ("failed", 2), ("failed", 1),
                            ("timeout", None), None]
    assert [s.recorded_output for s in bash[:4]] == [replies[cid]["raw_output"] for _, _, cid in calls[:4]]
    assert bash[1].recorded_output == "alpha\nbeta\n" and bash[3].recorded_output.startswith("ls: cannot access")
    assert bash[4].recorded_output.endswith("ValueError: invalid literal for int() with base 10: 'x'\n")
    # the submit: no tool message, the exit message holds the submission (as 1.x: no exit code)
    assert doc["messages"][-1]["role"] == "exit" and bash[-1].command.startswith("echo COMPLETE_TASK_AND_SUBMIT")
    assert bash[-1].recorded_output == doc["info"]["submission"] == "alpha\nbeta\n"
    assert all(s.duration_ms is None for s in t.steps)          # scripted turns carry no timestamp
    assert t.trace_id == "mini-swe-agent/local-run"
    assert {k: t.source[k] for k in ("model", "exit_status", "mini_version")} == {
        "model": "deterministic_toolcall", "exit_status": "Submitted", "mini_version": "2.4.6"}
    assert parse_trace(t.to_json()).to_json() == t.to_json()


def test_v2_cli_converts_and_validates(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["traces", "convert", str(V2), "-o", str(out)]) == 0
    assert f"{V2}: mini-swe-agent, 1 trace(s), 8 step(s)" in capsys.readouterr().out
    assert cli.main(["traces", "validate", str(out / "mini-swe-agent" / "local-run.json")]) == 0


def test_v2_responses_api_items_read_as_their_chat_messages(tmp_path):
    # the Responses-API models write a turn as a role-less `response` object and an observation as a
    # `function_call_output` item naming its call by `call_id`: the same steps come out
    doc = _v2()
    for k, m in enumerate(doc["messages"]):
        if m["role"] == "assistant":
            doc["messages"][k] = {"object": "response", "extra": m["extra"], "output": [
                {"type": "function_call", "call_id": c["id"], "name": "bash", "arguments": c["function"]["arguments"]}
                for c in m["tool_calls"]]}
        elif m["role"] == "tool":
            doc["messages"][k] = {"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"],
                                  "extra": m["extra"]}
    assert _one(_write(tmp_path, doc)).to_json()["steps"] == _one(V2).to_json()["steps"]
    doc["messages"][5]["call_id"] = "call_9"
    _err(_write(tmp_path, doc), ["field 'messages[5].call_id'", "answers tool call 'call_9'"])


def _v2_turn(k, *commands, ids=None):
    """An assistant message k of the 2.x shape: tool calls and the actions parsed from them."""
    ids = ids or [f"c{k}_{j}" for j in range(len(commands))]
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": i, "type": "function", "function": {"name": "bash",
                                                                     "arguments": json.dumps({"command": c})}}
                           for i, c in zip(ids, commands)],
            "extra": {"actions": [{"command": c, "tool_call_id": i} for i, c in zip(ids, commands)]}}


def _v2_obs(call_id, code, out="", **extra):
    return {"role": "tool", "tool_call_id": call_id, "content": f"{code}",
            "extra": {"raw_output": out, "returncode": code, "exception_info": "", **extra}}


def _v2_doc(*messages, exit_status="Submitted", submission=""):
    doc = _v2()
    doc["messages"] = doc["messages"][:2] + list(messages) + [
        {"role": "exit", "content": submission, "extra": {"exit_status": exit_status, "submission": submission}}]
    return doc


def test_v2_interactive_rejection_and_padding(tmp_path):
    # interactive mode: rejected commands are padded "not executed"; on submit, the submit call and the
    # ones after it are padded too, after the results of those that ran
    pad = {"exception_info": "action was not executed"}
    doc = _v2_doc(_v2_turn(2, "rm -rf /"), _v2_obs("c2_0", -1, **pad),
                  {"role": "user", "content": "Commands not executed.", "extra": {"interrupt_type": "UserRejection"}},
                  _v2_turn(5, "make", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "ls"), _v2_obs("c5_0", 0, "built"),
                  _v2_obs("c5_1", -1, **pad), _v2_obs("c5_2", -1, **pad), submission="diff\n")
    t = _one(_write(tmp_path, doc))
    assert [(s.tool, s.native_tool) for s in t.steps] == [("noop", "not_executed"), ("bash", "bash"),
                                                          ("bash", "bash"), ("noop", "not_executed")]
    assert t.steps[0].args == {"action": "rm -rf /"} and t.steps[3].args == {"action": "ls"}
    assert _outcomes(t) == [None, ("ok", 0), None, None]
    assert [t.steps[1].recorded_output, t.steps[2].recorded_output] == ["built", "diff\n"]


def test_v2_text_based_model_human_command_timestamps_and_errors(tmp_path):
    # text-based models: actions without tool calls, observations are `user` messages with a returncode;
    # a command typed in human mode is a turn too; a format error counts the actions it found
    obs = lambda code, out, **e: {"role": "user", "content": out, "extra": {"raw_output": out, "returncode": code,
                                                                          "exception_info": "", **e}}
    doc = _v2_doc({"role": "assistant", "content": "x", "extra": {"actions": [{"command": "ls"}], "timestamp": 10.0}},
                  {**obs(0, "a\n"), "extra": {**obs(0, "a\n")["extra"], "timestamp": 10.25}},
                  {"role": "user", "content": "found 2", "extra": {"interrupt_type": "FormatError", "n_actions": 2}},
                  {"role": "user", "content": "User command: pwd", "extra": {"actions": [{"command": "pwd"}]}},
                  obs(-1, "", exception_info="An error occurred while executing the command: boom"),
                  exit_status="LimitsExceeded")
    t = _one(_write(tmp_path, doc))
    assert [(s.tool, s.command, s.args.get("actions")) for s in t.steps] == [
        ("bash", "ls", None), ("noop", None, 2), ("bash", "pwd", None)]
    assert _outcomes(t) == [("ok", 0), None, ("error", None)]
    assert (t.steps[0].duration_ms.value, t.steps[0].duration_ms.provenance) == (250.0, "derived")


def test_v2_unanswered_commands_record_nothing(tmp_path):
    # a run stopped mid-turn; a submitted final turn of two calls, neither with a result: which submitted
    # is not written down
    doc = _v2_doc(_v2_turn(2, "sleep 9"), exit_status="KeyboardInterrupt")
    assert _outcomes(_one(_write(tmp_path, doc))) == [None]
    assert _one(_write(tmp_path, doc)).steps[0].recorded_output is None
    doc = _v2_doc(_v2_turn(2, "make", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"), submission="s")
    t = _one(_write(tmp_path, doc))
    assert [(s.tool, s.recorded_outcome, s.recorded_output) for s in t.steps] == [("bash", None, None)] * 2


_V2 = _v2()


@pytest.mark.parametrize("doc, expect", [
    (_mut(_V2, ["trajectory_format"], "mini-swe-agent-9"), ["field 'trajectory_format'", "unsupported",
                                                            "'mini-swe-agent-1.1'"]),
    ({**_V2, "messages": [*_V2["messages"][:3], {**_V2["messages"][3], "extra": {"raw_output": ""}}]},
     ["field 'messages[3].extra.returncode'", "missing"]),
    (_mut(_V2, ["messages", 3, "extra", "returncode"], "0"), ["field 'messages[3].extra.returncode'", "expected int"]),
    (_mut(_V2, ["messages", 3, "extra", "returncode"], 2 ** 40), ["field 'messages[3].extra.returncode'", "returncode"]),
    (_mut(_V2, ["messages", 3, "extra", "raw_output"], 5), ["field 'messages[3].extra.raw_output'", "expected str"]),
    (_mut(_V2, ["messages", 3, "extra"], []), ["field 'messages[3].extra'", "expected dict"]),
    (_mut(_V2, ["messages", 4, "tool_calls", 1, "function", "arguments"], "{}"),
     ["field 'messages[4].tool_calls[1].function.arguments.command'", "missing"]),
    (_mut(_V2, ["messages", 4, "tool_calls", 1, "function", "arguments"], "{"),
     ["field 'messages[4].tool_calls[1].function.arguments'", "invalid JSON"]),
    (_mut(_V2, ["messages", 4, "tool_calls", 1, "function", "name"], "python"),
     ["field 'messages[4].tool_calls[1].function.name'", "one tool is bash"]),
    (_mut(_V2, ["messages", 4, "tool_calls"], {}), ["field 'messages[4].tool_calls'", "expected list"]),
    (_mut(_V2, ["messages", 4, "extra", "actions", 0], {"tool_call_id": "call_2"}),
     ["field 'messages[4].extra.actions[0].command'", "missing"]),
    (_mut(_V2, ["messages", 4, "extra", "actions", 0, "command"], ["ls"]),
     ["field 'messages[4].extra.actions[0].command'", "expected str"]),
    (_mut(_V2, ["messages", 4, "extra", "actions", 0, "command"], "cat other.txt"),
     ["field 'messages[4].extra.actions[0].tool_call_id'", "not in messages[4].tool_calls"]),
    (_mut(_V2, ["messages", 4, "extra", "actions"], "ls"), ["field 'messages[4].extra.actions'", "expected list"]),
    (_mut(_V2, ["messages", 5, "tool_call_id"], "call_3"),
     ["field 'messages[5].tool_call_id'", "answers tool call 'call_3', but the next unanswered one is 'call_2'"]),
    (_mut(_V2, ["messages", 7], _V2["messages"][6]), ["field 'messages[7]'", "no action waiting"]),
    (_mut(_V2, ["messages", 9], "tool"), ["field 'messages[9]'", "expected an object"]),
    ({**_V2, "messages": _V2["messages"] + [_V2["messages"][3]]}, ["field 'messages[16]'", "after the exit message"]),
    (_mut(_V2, ["messages", 15, "extra", "submission"], 1), ["field 'messages[15].extra.submission'", "expected str"]),
    (_mut(_V2, ["messages", 2, "extra", "actions", 0, "command"], "ls\u0000"),
     ["field 'messages[2].extra.actions[0].command'", "NUL"]),
])
def test_v2_bad_files(tmp_path, doc, expect):
    _err(_write(tmp_path, doc), expect)


def test_v2_timestamps_out_of_order(tmp_path):
    doc = _v2_doc(_v2_turn(2, "ls"), _v2_obs("c2_0", 0, timestamp=4.0), exit_status="")
    doc["messages"][2]["extra"]["timestamp"] = 5.0
    _err(_write(tmp_path, doc), ["step 0", "field 'messages[3].extra.timestamp'", "before its turn"])


@pytest.fixture(scope="module")
def small_v2_traj():
    doc = _v2()
    doc["info"]["config"] = {"model": {"model_name": "m"}, "environment": doc["info"]["config"]["environment"]}
    doc["messages"][1]["content"] = "task"
    doc["messages"][7]["content"] = doc["messages"][7]["content"][:60]
    return doc


@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_fuzz_mutated_v2_traj(fuzz_dir, small_v2_traj, data):
    words = json_values(["mini-swe-agent-1.1", "tool", "exit", "assistant", "Submitted", "FormatError", "bash",
                         "TimeoutExpired", "action was not executed", '{"command": "ls"}', "call_1", -1, 2],
                        ["role", "content", "extra", "actions", "command", "tool_call_id", "tool_calls", "function",
                         "arguments", "name", "id", "returncode", "raw_output", "exception_info", "timestamp",
                         "interrupt_type", "n_actions", "exit_status", "submission"])
    p = fuzz_dir / "mut2.traj.json"
    p.write_text(maybe_cut(data, json.dumps(mutated(data, small_v2_traj, words))))
    check_converter(conv, p)
