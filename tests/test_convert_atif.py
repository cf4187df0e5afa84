"""atif converter (Harbor's Agent Trajectory Interchange Format) and the ATIF writer: the spec's own
example and two hand-written files (tests/data/atif/README.md), the tool names of other producers,
the round trip IR -> ATIF -> IR over the shipped corpus, that what we write is valid ATIF, bad
input, fuzzing.

Expected steps were read off each file by hand: one per tool call of an agent step, one per agent
step without tool calls, none for user and system steps.
"""
from __future__ import annotations

import copy
import json
from datetime import datetime
from functools import partial
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from pytest_agentcgroup.traces import convert as registry
from pytest_agentcgroup.traces.convert import atif as conv
from pytest_agentcgroup.traces.convert import ir as ir_conv
from pytest_agentcgroup.traces.ir import Measure, Profile, Step, Trace, read_traces, write_trace
from pytest_agentcgroup.traces.corpus import ir_files
from converter_checks import (DATASETS, FUZZ, check_converter, expect_trace_error, json_values, maybe_cut,
                              mutated, only_trace)

DATA = Path(__file__).resolve().parent / "data" / "atif"
RFC, TERMINUS, CLAUDE = DATA / "rfc-0001-example.json", DATA / "terminus-2.json", DATA / "claude-code-subagent.json"
CORPUS = Path(__file__).resolve().parents[1] / "traces"

_one = partial(only_trace, conv)
_err = partial(expect_trace_error, conv)


def _corpus_traces() -> list[Trace]:
    return [t for p in ir_files([CORPUS]) for t in read_traces(p)]


# ---------------------------------------------------------------------------------------------
# What Harbor's pydantic models (harbor.models.trajectories) require of the fields we write, v1.4

_KEYS = {
    "root": ({"schema_version", "session_id", "agent", "steps"}, {"notes", "final_metrics", "extra"}),
    "agent": ({"name", "version"}, {"model_name", "extra"}),
    "step": ({"step_id", "source", "message"}, {"timestamp", "model_name", "reasoning_effort",
                                               "reasoning_content", "tool_calls", "observation", "metrics", "extra"}),
    "tool_call": ({"tool_call_id", "function_name", "arguments"}, set()),
    "final_metrics": (set(), {"total_prompt_tokens", "total_completion_tokens", "total_cached_tokens",
                              "total_cost_usd", "total_steps", "extra"}),
}
_AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


def atif_problems(doc) -> list[str]:
    """Every way `doc` breaks the ATIF-v1.4 schema as Harbor's models enforce it ([] when valid)."""
    out: list[str] = []

    def keys(obj, kind, where):
        if not isinstance(obj, dict):
            out.append(f"{where}: expected an object")
            return False
        need, may = _KEYS[kind]
        out.extend(f"{where}.{k}: required" for k in need - set(obj))
        out.extend(f"{where}.{k}: not a field of {kind}" for k in set(obj) - need - may)
        out.extend(f"{where}.extra: expected an object" for k in ("extra",) if k in obj and not isinstance(obj[k], dict))
        return True

    if not keys(doc, "root", "trajectory"):
        return out
    if doc.get("schema_version") not in [f"ATIF-v1.{i}" for i in range(9)]:
        out.append("trajectory.schema_version: unknown")
    if not isinstance(doc.get("session_id"), str):
        out.append("trajectory.session_id: expected str")
    if keys(doc.get("agent"), "agent", "trajectory.agent"):
        out.extend(f"trajectory.agent.{k}: expected str" for k in ("name", "version")
                   if not isinstance(doc["agent"].get(k), str))
    if "final_metrics" in doc:
        keys(doc["final_metrics"], "final_metrics", "trajectory.final_metrics")
    steps = doc.get("steps")
    if not isinstance(steps, list) or not steps:
        return out + ["trajectory.steps: expected a non-empty list"]
    for i, s in enumerate(steps):
        w = f"trajectory.steps.{i}"
        if not keys(s, "step", w):
            continue
        if s.get("step_id") != i + 1:
            out.append(f"{w}.step_id: expected {i + 1} (sequential from 1), got {s.get('step_id')!r}")
        if s.get("source") not in ("system", "user", "agent"):
            out.append(f"{w}.source: not system, user or agent")
        if not isinstance(s.get("message"), str):
            out.append(f"{w}.message: expected str")
        if s.get("source") != "agent":
            out.extend(f"{w}.{k}: only for agent steps" for k in _AGENT_ONLY if s.get(k) is not None)
        if "timestamp" in s:
            datetime.fromisoformat(s["timestamp"].replace("Z", "+00:00"))
        ids = []
        for k, tc in enumerate(s.get("tool_calls") or []):
            if keys(tc, "tool_call", f"{w}.tool_calls.{k}"):
                ids.append(tc.get("tool_call_id"))
                if not isinstance(tc.get("arguments"), dict) or not isinstance(tc.get("function_name"), str):
                    out.append(f"{w}.tool_calls.{k}: arguments must be an object, function_name a str")
        if len(set(ids)) != len(ids):
            out.append(f"{w}.tool_calls: duplicate tool_call_id")
        for r in (s.get("observation") or {}).get("results", []):
            if r.get("source_call_id") is not None and r["source_call_id"] not in ids:
                out.append(f"{w}.observation: source_call_id {r['source_call_id']!r} not a tool call of the step")
    return out


def test_the_checker_rejects():
    # the validity tests below would pass vacuously if it did not
    good = conv.to_atif(Trace("t", {"format": "x"}, (Step(0, "bash", {"command": "ls"}, native_tool="Bash"),)))
    assert atif_problems(good) == []
    breakages = [("steps", 0, "step_id", 0), ("steps", 0, "source", "tool"), ("agent", None, "version", None),
                 ("steps", 0, "frobnicate", 1), (None, None, "trajectory_id", "x")]
    for top, idx, key, val in breakages:
        doc = copy.deepcopy(good)
        obj = doc if top is None else doc[top] if idx is None else doc[top][idx]
        if val is None:
            del obj[key]
        else:
            obj[key] = val
        assert atif_problems(doc), (top, key)
    user = copy.deepcopy(good)
    user["steps"][0]["source"] = "user"
    assert "trajectory.steps.0.tool_calls: only for agent steps" in atif_problems(user)


# ---------------------------------------------------------------------------------------------
# Reading

@pytest.mark.parametrize("path", [RFC, TERMINUS, CLAUDE], ids=lambda p: p.name)
def test_sniff(path):
    assert conv.sniff(path) and registry.sniff(path) == "atif"


def test_sniff_tells_the_formats_apart(tmp_path):
    ir_file = tmp_path / "t.json"
    trace = Trace("x/y", {"format": "x"}, (Step(0, "bash", {"command": "ls"}),))
    write_trace(trace, ir_file)
    atif_file = tmp_path / "a.json"
    conv.write_atif(trace, atif_file)     # names the IR schema in `extra`: still ATIF
    assert registry.sniff(ir_file) == "ir" and registry.sniff(atif_file) == "atif"
    assert not conv.sniff(ir_file) and ir_conv.sniff(atif_file)   # why atif is sniffed first
    samples = [p for p in sorted(DATASETS.rglob("*")) if p.is_file() and p.suffix in (".json", ".jsonl", ".traj")]
    if not samples:
        pytest.skip(f"real samples not present under {DATASETS}")
    assert [p for p in samples if registry.sniff(p) in ("atif", "ir")] == []


def test_rfc_example():
    t = _one(RFC)
    assert t.trace_id == "atif/025B810F-B3A2-4C67-93C0-FE7A142A947A"
    # the user's question is no step; two financial_search calls (no tool we know: noop), the answer
    assert [(s.step_id, s.tool, s.native_tool) for s in t.steps] == [
        (0, "noop", "financial_search"), (1, "noop", "financial_search"), (2, "noop", "(message)")]
    assert all(s.duration_ms is None and not s.profile.to_json() for s in t.steps)
    assert t.source == {"format": "atif", "dataset": "ATIF trajectory", "path": "atif/rfc-0001-example.json",
                        "licence": "unknown", "origin": "unknown", "agent": "harbor-agent", "agent_version": "1.0.0",
                        "model": "gemini-2.5-flash"}


def test_terminus_2():
    t = _one(TERMINUS)
    assert t.trace_id == "atif/5d0c7f1e-8a43-4b5e-9c1d-2f6a7e3b9c10"
    assert [(s.tool, s.command or s.args.get("keystrokes", s.native_tool)) for s in t.steps] == [
        ("bash", "ls -la /app"), ("bash", "cat /app/README.md"), ("bash", "pip install -r requirements.txt"),
        ("noop", ""),                     # a wait: empty keystrokes
        ("noop", "(message)"),            # the response that failed to parse: no tool call
        ("bash", "python -m pytest -q tests"),
        ("noop", "C-c"),                  # keystrokes without a newline run nothing
        ("noop", "mark_task_complete")]
    assert [s.step_id for s in t.steps] == list(range(8))
    assert {s.native_tool for s in t.steps if s.tool == "bash"} == {"bash_command"}
    assert all("cwd" not in s.args and s.duration_ms is None for s in t.steps)


def test_claude_code_with_a_subagent():
    main, sub = conv.convert(CLAUDE)
    assert main.trace_id == "atif/c3f1a2b4-0d9e-4f7a-8b6c-5e4d3c2b1a09"
    assert [(s.tool, s.native_tool) for s in main.steps] == [
        ("bash", "Bash"), ("read", "Read"), ("search", "Grep"), ("noop", "Task"), ("edit", "Edit"), ("bash", "Bash"),
        ("noop", "(message)")]
    assert main.steps[0].args == {"command": "git status --short"}
    assert main.steps[1].args == {"path": "/testbed/widgets/pager.py"}
    assert main.steps[2].args == {"pattern": "page_count", "path": "/testbed/widgets"}
    assert main.steps[4].args == {"op": "Edit", "path": "/testbed/widgets/pager.py"}
    # `timeout` is ms for Claude Code, seconds for OpenHands: only an explicit `timeout_ms` is kept
    assert main.steps[5].args == {"command": "python -m pytest -x tests/test_pager.py"}
    assert sub.trace_id == main.trace_id + "/explore-1"
    assert [(s.tool, s.native_tool) for s in sub.steps] == [("search", "Glob"), ("read", "Read"), ("noop", "(message)")]
    assert sub.source["model"] == "claude-haiku-4-5" and main.source["model"] == "claude-sonnet-4-5"


def _doc(*calls, source="agent", **top):
    step = {"step_id": 1, "source": source, "message": ""}
    if calls:
        step["tool_calls"] = [{"tool_call_id": f"c{i}", "function_name": n, "arguments": a}
                              for i, (n, a) in enumerate(calls)]
    return {"schema_version": "ATIF-v1.6", "session_id": "s", "agent": {"name": "a", "version": "1"},
            "steps": [step], **top}


def _write(tmp_path, doc, name="trajectory.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("name, arguments, expect", [
    ("exec_command", {"command": ["bash", "-lc", "ls -la"], "workdir": "/repo", "timeout_ms": 5000},
     ("bash", {"command": "bash -lc 'ls -la'", "cwd": "/repo", "timeout_ms": 5000.0})),
    ("run_shell_command", {"command": "make", "dir_path": "/x"}, ("bash", {"command": "make"})),
    ("shell", {"cmd": "echo hi"}, ("bash", {"command": "echo hi"})),
    ("execute_bash", {"command": "pytest", "timeout": 30}, ("bash", {"command": "pytest"})),
    ("execute_ipython_cell", {"code": "print(1)"}, ("python", {"command": "print(1)"})),
    ("str_replace_editor", {"command": "view", "path": "/a.py"}, ("read", {"op": "view", "path": "/a.py"})),
    ("str_replace_editor", {"command": "create", "path": "/b.py", "file_text": "x"},
     ("edit", {"op": "create", "path": "/b.py"})),
    ("read_file", {"absolute_path": "/c.py"}, ("read", {"path": "/c.py"})),
    ("write_file", {"file_path": "/d.py", "content": "y"}, ("edit", {"op": "write_file", "path": "/d.py"})),
    ("search_file_content", {"pattern": "TODO"}, ("search", {"pattern": "TODO"})),
    ("browser", {"url": "https://example.org", "code": "click('a')"}, ("browser", {"url": "https://example.org"})),
    ("swe_agent_action", {"raw_action": "open src/x.py"}, ("read", {"op": "open", "action": "open src/x.py",
                                                                   "path": "src/x.py"})),
    ("swe_agent_action", {"raw_action": "python reproduce.py"}, ("bash", {"command": "python reproduce.py"})),
    ("mcp__github__create_issue", {"title": "t"}, ("noop", {})),
    ("computer_click", {"x": 5, "y": 9}, ("noop", {})),
])
def test_tool_names_of_other_producers(tmp_path, name, arguments, expect):
    (s,) = _one(_write(tmp_path, _doc((name, arguments)))).steps
    assert (s.tool, s.args) == expect
    # SWE-agent's action is named by its command, as the swe-agent converters name it
    assert s.native_tool == {"open src/x.py": "open", "python reproduce.py": "bash"}.get(arguments.get("raw_action"),
                                                                                          name)


def test_user_and_system_steps_are_no_steps(tmp_path):
    doc = _doc(("bash", {"command": "ls"}))
    doc["steps"] = [{"step_id": 1, "source": "system", "message": "be brief"},
                    {"step_id": 2, "source": "user", "message": "list"}, {**doc["steps"][0], "step_id": 3}]
    assert [s.command for s in _one(_write(tmp_path, doc)).steps] == ["ls"]


# ---------------------------------------------------------------------------------------------
# Writing, and the round trip

def test_written_atif_is_valid_and_carries_the_steps():
    traces = _corpus_traces()
    assert len(traces) >= 75 and sum(len(t.steps) for t in traces) > 3000
    for t in traces:
        doc = conv.to_atif(t)
        assert atif_problems(doc) == [], t.trace_id
        calls = [s["tool_calls"] for s in doc["steps"]]
        assert [len(c) for c in calls] == [1] * len(t.steps)
        assert [(c[0]["function_name"], c[0]["arguments"]) for c in calls] == [
            (s.native_tool or s.tool, s.args) for s in t.steps]


def test_round_trip_keeps_the_corpus_exactly(tmp_path):
    # IR -> ATIF -> IR over every shipped trace: steps, order, args, every number and its provenance
    out = tmp_path / "t.json"
    for t in _corpus_traces():
        conv.write_atif(t, out)
        assert _one(out).to_json() == t.to_json(), t.trace_id


def test_numbers_keep_their_provenance_in_extra(tmp_path):
    step = Step(3, "bash", {"command": "make", "cwd": "/w"}, native_tool=None,
                duration_ms=Measure(1500.0, "recorded"),
                profile=Profile(peak_mb=Measure(312.5, "derived"), io_bytes=Measure(0.0, "synthetic")))
    trace = Trace("x/1", {"format": "claude-code", "model": "haiku", "licence": "GPL-2.0",
                          "agent_time_s": {"value": 9.5, "provenance": "recorded"}}, (step,))
    doc = conv.to_atif(trace)
    assert doc["agent"] == {"name": "claude-code", "version": "unknown", "model_name": "haiku"}
    (s,) = doc["steps"]
    assert s["tool_calls"][0]["function_name"] == "bash"
    assert s["extra"]["agentcgroup"] == {
        "step_id": 3, "tool": "bash", "duration_ms": {"value": 1500.0, "provenance": "recorded"},
        "profile": {"peak_mb": {"value": 312.5, "provenance": "derived"},
                    "io_bytes": {"value": 0.0, "provenance": "synthetic"}}}
    assert doc["extra"]["agentcgroup"]["source"]["agent_time_s"]["provenance"] == "recorded"
    back = _one(_write(tmp_path, doc))
    assert back == trace and back.steps[0].native_tool is None


def test_the_task_a_trace_ran_on_goes_out_and_comes_back(tmp_path):
    from pytest_agentcgroup.traces.task import Task
    task = Task(instance_id="PyPSA__linopy-79", repository="PyPSA/linopy", version="0.0",
                path="/workspace/PyPSA__linopy__0.0")
    trace = Trace("x/1", {"format": "x"}, (Step(0, "bash", {"command": "ls"}),), task=task)
    doc = conv.to_atif(trace)
    assert doc["extra"]["agentcgroup"]["task"] == task.to_json()
    assert _one(_write(tmp_path, doc)).task == task
    doc["extra"]["agentcgroup"]["task"]["commit"] = ""
    expect_trace_error(conv, _write(tmp_path, doc), ("field 'extra.agentcgroup.task.commit'", "non-empty string"))


def test_round_trip_from_atif(tmp_path):
    # ATIF of another producer -> IR -> ATIF -> IR: the second IR is the first
    first = _one(TERMINUS)
    conv.write_atif(first, tmp_path / "again.json")
    assert _one(tmp_path / "again.json") == first


# ---------------------------------------------------------------------------------------------
# Bad input

def _ours(**changes):
    doc = conv.to_atif(Trace("x/1", {"format": "x"}, (Step(0, "bash", {"command": "ls"},
                                                           duration_ms=Measure(5.0, "recorded")),)))
    for path, val in changes.items():
        obj = doc
        keys = path.split("__")
        for k in keys[:-1]:
            obj = obj[int(k)] if k.isdigit() else obj[k]
        obj[keys[-1]] = val
    return doc


@pytest.mark.parametrize("doc, expect", [
    ([], ["expected an ATIF trajectory object, got list"]),
    ({"steps": []}, ["field 'schema_version'", "missing"]),
    (_doc(schema_version="ATIF-v2.0"), ["field 'schema_version'", "unsupported schema_version 'ATIF-v2.0'"]),
    ({**_doc(), "agent": "claude"}, ["field 'agent'", "expected dict, got str"]),
    ({**_doc(), "steps": {}}, ["field 'steps'", "expected list, got dict"]),
    ({**_doc(), "steps": ["hi"]}, ["step 0", "field 'steps[0]'", "expected a step object"]),
    (_doc(source="tool"), ["step 0", "field 'steps[0].source'", "expected one of system, user, agent, got 'tool'"]),
    (_doc(source="user"), ["field 'steps'", "no agent steps"]),
    ({**_doc(), "steps": [{"step_id": 1, "source": "agent", "message": "", "tool_calls": {}}]},
     ["step 0", "field 'steps[0].tool_calls'", "expected list or null, got dict"]),
    (_doc(("bash", "ls")), ["step 0", "field 'steps[0].tool_calls[0].arguments'", "expected dict, got str"]),
    (_doc(("bash", {"cwd": "/x"})), ["step 0", "field 'steps[0].tool_calls[0].arguments.command'",
                                     "a shell tool call needs a command"]),
    (_doc(("ls", {}), ("exec_command", {"command": ["ls", 3]})),
     ["step 1", "field 'steps[0].tool_calls[1].arguments.command[1]'", "expected str, got int"]),
    (_doc(("bash", {"command": "ls\u0000"})), ["step 0", "field 'steps[0].tool_calls[0].arguments.command'", "NUL"]),
    (_doc(("Bash", {"command": "x" * (2 << 20)})), ["step 0", "field 'steps[0].tool_calls[0].arguments.command'",
                                                    "limit"]),
    (_doc(("exec_command", {"command": "ls", "timeout_ms": -1})),
     ["step 0", "field 'steps[0].tool_calls[0].arguments.timeout_ms'", ">= 0"]),
    (_doc(("Read", {"file_path": 7})), ["step 0", "field 'steps[0].tool_calls[0].arguments.file_path'",
                                        "expected str, got int"]),
    (_ours(steps__0__extra__agentcgroup__duration_ms={"value": 5.0, "provenance": "guessed"}),
     ["step 0", "field 'steps[0].extra.agentcgroup.duration_ms.provenance'", "provenance must be one of"]),
    (_ours(steps__0__extra__agentcgroup__tool="teleport"),
     ["step 0", "field 'steps[0].extra.agentcgroup.tool'", "unknown tool 'teleport'"]),
    (_ours(steps__0__tool_calls__0__arguments={"cwd": "/x"}),
     ["step 0", "field 'steps[0].tool_calls[0].arguments.command'", "a bash step needs a command"]),
    (_ours(steps__0__extra__agentcgroup__native_tool="Bash"),
     ["step 0", "field 'steps[0].extra.agentcgroup.native_tool'", "is not the tool call's function_name 'bash'"]),
    (_ours(extra={"agentcgroup": {"schema": "agentcgroup-trace/9", "source": {}}}),
     ["field 'extra.agentcgroup.schema'", "unsupported schema"]),
    (_ours(extra={"agentcgroup": {"trace_id": "x/1"}}), ["field 'extra.agentcgroup.source'", "expected dict, got null"]),
])
def test_bad_files(tmp_path, doc, expect):
    _err(_write(tmp_path, doc), expect)


@pytest.mark.parametrize("n", [0, 2])
def test_our_extra_needs_one_tool_call(tmp_path, n):
    doc = _ours()
    doc["steps"][0]["tool_calls"] = [{"tool_call_id": f"c{i}", "function_name": "bash",
                                      "arguments": {"command": "x"}} for i in range(n)]
    _err(_write(tmp_path, doc), ["step 0", "field 'steps[0].tool_calls'", f"exactly one tool call, got {n}"])


def test_a_bad_subagent_is_named_and_the_rest_converts(tmp_path):
    doc = json.loads(CLAUDE.read_text())
    doc["subagent_trajectories"].append({**doc["subagent_trajectories"][0], "trajectory_id": "x", "steps": "none"})
    main, sub, bad = conv.iter_results(_write(tmp_path, doc))
    assert len(main.steps) == 7 and len(sub.steps) == 3
    assert str(bad) == (f"{tmp_path / 'trajectory.json'}, record subagent_trajectories[1], field 'steps': "
                        "expected list, got str")


def test_truncated_and_nul(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(TERMINUS.read_text()[:300])
    _err(p, ["invalid JSON"])
    p.write_bytes(b'{"schema_version": "ATIF-v1.4", \x00}')
    _err(p, ["NUL byte"])


def test_the_ir_reader_names_a_bad_record(tmp_path):
    good = Trace("x/1", {"format": "x"}, (Step(0, "bash", {"command": "ls"}),)).to_json()
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "steps": [{"step_id": 0, "tool": "warp"}]}) + "\n")
    ok, bad = ir_conv.iter_results(p)
    assert ok.trace_id == "x/1" and str(bad) == f"{p}, record 2, step 0, field 'tool': unknown tool 'warp'; " \
                                                "expected one of bash, python, edit, read, search, browser, noop"


# ---------------------------------------------------------------------------------------------
# Fuzzing

json_value = json_values(
    ["ATIF-v1.4", "ATIF-v1.7", "agent", "user", "system", "bash_command", "Bash", "str_replace_editor", "view",
     "exec_command", "swe_agent_action", "ls -la\n", "C-c", "recorded", "derived", "bash", "noop"],
    ["schema_version", "session_id", "trajectory_id", "agent", "steps", "source", "message", "tool_calls",
     "function_name", "arguments", "command", "keystrokes", "cmd", "extra", "agentcgroup", "tool", "step_id",
     "duration_ms", "value", "provenance", "subagent_trajectories", "trace_id"])


@FUZZ
@given(doc=json_value)
def test_fuzz_generated(fuzz_dir, doc):
    p = fuzz_dir / "gen.json"
    p.write_text(json.dumps(doc))
    check_converter(conv, p)


@pytest.fixture(scope="module", params=["claude-code", "ours"])
def small_atif(request):
    if request.param == "ours":
        return conv.to_atif(next(t for t in _corpus_traces() if t.steps[0].profile.peak_mb is not None
                                 and len(t.steps) < 12))
    return json.loads(CLAUDE.read_text())


@settings(FUZZ, max_examples=50)
@given(data=st.data())
def test_fuzz_mutated(fuzz_dir, small_atif, data):
    p = fuzz_dir / "mut.json"
    p.write_text(maybe_cut(data, json.dumps(mutated(data, small_atif, json_value))))
    check_converter(conv, p)
