"""The claude-code converter: concrete counts on the shipped dataset, derivation rules on a
hand-built task, and TraceError on malformed input."""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from pytest_agentcgroup.traces import convert as convert_pkg
from pytest_agentcgroup.traces.convert import claude_code as cc
from pytest_agentcgroup.traces.convert import claude_code_samples as ccs
from pytest_agentcgroup.traces.ir import TOOLS, TraceError, parse_trace
from converter_checks import DATASETS

DATA = DATASETS / "agentcgroup-claude-code"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="agentcgroup-claude-code dataset not present")


@pytest.fixture(scope="module")
def all_traces():
    if not DATA.is_dir():
        pytest.skip("agentcgroup-claude-code dataset not present")
    return {t.trace_id: t for t in cc.convert(DATA)}


# ---------------------------------------------------------------------------------------------
# The real dataset

@needs_data
def test_rdflib_haiku_concrete():
    (trace,) = cc.convert(DATA / "haiku" / "RDFLib__rdflib-1117")
    assert trace.trace_id == "claude-code/haiku/RDFLib__rdflib-1117"
    assert len(trace.steps) == 17
    assert [s.step_id for s in trace.steps] == list(range(17))
    assert [s.native_tool for s in trace.steps] == [
        "TodoWrite", "Glob", "Read", "Edit", "Edit", "Edit", "Bash", "Edit", "Bash", "Read", "Read",
        "Bash", "Bash", "Bash", "Bash", "Bash", "Edit"]
    kinds = [s.tool for s in trace.steps]
    assert kinds.count("bash") == 7 and kinds.count("edit") == 5 and kinds.count("read") == 3
    assert kinds.count("search") == 1 and kinds.count("noop") == 1
    s6 = trace.steps[6]
    assert s6.args == {"command": "python3 -m pytest", "cwd": "/testbed"}
    assert s6.duration_ms.value == 1956.0 and s6.duration_ms.provenance == "recorded"
    assert trace.steps[0].duration_ms.value == 80.0
    assert trace.steps[2].args == {"file_path": "/testbed/rdflib/tools/csv2rdf.py"}
    # the edit in full (the editor's terms), so a replay applies it, and the size it writes
    assert trace.steps[3].args == {"op": "str_replace", "path": "/testbed/rdflib/tools/csv2rdf.py",
                                   "old_str": "header_labels = list(csvreader.next())",
                                   "new_str": "header_labels = list(next(csvreader))",
                                   "bytes": len("header_labels = list(next(csvreader))")}
    assert trace.steps[1].args == {"pattern": "**/csv2rdf.py"}
    # the agent sent HTML-escaped '&amp;&amp;'; kept verbatim (the shell failed on it)
    assert "&amp;&amp;" in trace.steps[13].command
    container = trace.source["container"]
    assert trace.source.pop("agent_time_s") == {"value": 198.373, "provenance": "recorded"}   # results.json claude_time
    assert {k: v for k, v in trace.source.items() if k != "container"} == {
        "format": "claude-code", "dataset": "agentcgroup-claude-code", "path": "haiku/RDFLib__rdflib-1117",
        "origin": "yunwei37/agentcgroup@5af9e7b8f37a93513206c331c7ec0ff149e89f27", "licence": "GPL-2.0",
        "model": "haiku", "image": "swerebench/sweb.eval.x86_64.rdflib_1776_rdflib-1117"}
    for s in trace.steps:
        assert {"peak_mb", "ramp_ms", "cpu_ms"} <= set(s.profile.to_json())
        assert s.profile.provenance() == "derived"
    assert max(s.profile.peak_mb.value for s in trace.steps) == 49.9     # MiB (52.3 decimal MB)
    # the whole-container summary agrees with the upstream resources.json `summary` (63 samples,
    # max 262.0 MB = 249.9 MiB, cpu avg 13.119 %); per step the baseline its peak_mb is over
    assert (container["samples"], container["mem_mb_max"], container["cpu_percent_mean"]) == (63, 249.9, 13.12)
    assert container["provenance"] == "derived" and container["from"] == "resources.json samples"
    assert container["mem_mb_min"] == round(11.85e6 / 2**20, 1)
    assert len(container["step_baseline_mb"]) == 17 and None not in container["step_baseline_mb"]


def test_sniff(tmp_path):
    if DATA.is_dir():
        task = DATA / "haiku" / "RDFLib__rdflib-1117"
        assert cc.sniff(task) and cc.sniff(task / "tool_calls.json")
        assert not cc.sniff(task / "resources.json")
        assert not cc.sniff(DATA)
    assert not cc.sniff(tmp_path)
    (tmp_path / "tool_calls.json").write_text("[]")
    assert not cc.sniff(tmp_path)                       # resources.json missing
    (tmp_path / "resources.json").write_text("{}")
    assert cc.sniff(tmp_path)
    assert not cc.sniff(tmp_path / "nope")
    assert convert_pkg.converter("claude-code") is cc and cc.FORMAT == "claude-code"


@needs_data
def test_whole_dataset(all_traces):
    assert len(all_traces) == 63
    assert sum(t.trace_id.startswith("claude-code/haiku/") for t in all_traces.values()) == 18
    assert sum(len(t.steps) for t in all_traces.values()) == 3019
    for t in all_traces.values():
        assert parse_trace(json.loads(t.dumps())) == t
        assert "result_preview" not in t.dumps()
        for s in t.steps:
            assert s.tool in TOOLS and s.native_tool
            assert s.duration_ms.provenance == "recorded"
            assert all(m.provenance == "derived" for m in (s.profile.peak_mb, s.profile.ramp_ms, s.profile.cpu_ms) if m)
            if s.profile.ramp_ms:
                assert 0 <= s.profile.ramp_ms.value <= s.duration_ms.value
    tools = [s.native_tool for t in all_traces.values() for s in t.steps if s.tool == "noop"]
    assert tools.count("TodoWrite") == 251 and tools.count("Task") == 5 and tools.count("WebSearch") == 2


@needs_data
def test_dataset_path_variants():
    ids = [t.trace_id for t in cc.convert(DATA / "haiku")]
    assert len(ids) == 18 and ids == sorted(ids)
    (t,) = cc.convert(DATA / "local" / "dask__dask-5510" / "tool_calls.json")
    assert t.trace_id == "claude-code/local/dask__dask-5510" and t.source["model"] == "qwen3"
    assert len(t.steps) == 78


@needs_data
def test_background_and_noops(all_traces):
    t = all_traces["claude-code/haiku/pre-commit__pre-commit-2524"]
    assert len(t.steps) == 24 and sum(s.tool == "bash" for s in t.steps) == 11
    assert t.steps[16].args["background"] is True and t.steps[16].command == "python3 -m pytest tests/"
    assert (t.steps[17].tool, t.steps[17].native_tool, t.steps[17].args) == \
        ("noop", "BashOutput", {"bash_id": "b767c3", "filter": "FAILED"})
    assert (t.steps[19].tool, t.steps[19].native_tool) == ("noop", "KillShell")
    assert t.steps[15].profile.peak_mb.value >= 1024           # the 1.8 GB full test-suite run


@needs_data
def test_rejected_call_is_noop(all_traces):
    s = all_traces["claude-code/local/sigmavirus24__github3.py-673"].steps[38]
    assert (s.tool, s.native_tool) == ("noop", "Edit")
    assert s.args == {"rejected": True, "file_path": "/testbed/tests/unit/json/content_example"}


@needs_data
def test_an_edit_the_runtime_refused_is_not_applied(all_traces):
    # "File has not been read yet": Claude Code changed nothing; the same edit, after a Read, applied
    steps = all_traces["claude-code/haiku/streamlink__streamlink-3485"].steps
    refused, applied = steps[5], steps[7]
    assert refused.tool == "edit" and refused.args["refused"] is True and "op" not in refused.args
    assert refused.recorded_outcome.status == "failed" and set(refused.args) == {"path", "bytes", "refused"}
    assert applied.args["op"] == "str_replace" and applied.args["path"] == refused.args["path"]
    assert applied.recorded_outcome is not None and applied.recorded_outcome.status == "ok"   # the runtime applied it


def test_an_edit_whose_text_cannot_be_kept_keeps_its_size_and_says_why(tmp_path):
    task = make_task(tmp_path, [
        call(0, 0.1, "Write", file_path="/testbed/blob", content="a\x00b"),
        call(0, 0.1, "Edit", file_path="/testbed/big.py", old_string="x", new_string="é" * (1 << 19 | 1)),
        call(0, 0.1, "Write", file_path="/testbed/cut", content="emoji \ud83d"),
    ])
    (t,) = cc.convert(task)
    assert t.steps[0].args == {"path": "/testbed/blob", "bytes": 3, "not_kept": "input.content contains a NUL character"}
    assert t.steps[1].args == {"path": "/testbed/big.py", "bytes": 2 * (1 << 19 | 1),
                               "not_kept": "input.new_string is over 1,048,576 bytes"}
    assert t.steps[2].args == {"path": "/testbed/cut", "bytes": 9,
                               "not_kept": "input.content contains an unpaired surrogate at offset 6"}


@needs_data
def test_big_peaks(all_traces):
    peak = {tid: max(s.profile.peak_mb.value for s in t.steps) for tid, t in all_traces.items()}
    assert peak["claude-code/local/pydicom__pydicom-2065"] == 1778.0        # MiB
    assert peak["claude-code/haiku/pre-commit__pre-commit-2524"] == 1594.5
    assert peak["claude-code/local/dask__dask-5510"] == 1089.1
    assert sum(p > 1024 for p in peak.values()) == 3


# ---------------------------------------------------------------------------------------------
# Derivation rules on a hand-built task

T0 = 1_700_000_000.0


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def call(start: float, end: float, tool: str = "Bash", **inp) -> dict:
    if tool == "Bash":
        inp.setdefault("command", "true")
    return {"timestamp": iso(T0 + start), "end_timestamp": iso(T0 + end), "tool": tool, "id": "x",
            "input": inp, "result_preview": "out"}


MEM = ["100MiB", "100MiB", "100MiB", "153600KiB", "0.29296875GiB", "250MiB", "100MiB", "100MiB", "100MiB", "100MiB",
       "0B"]
CPU = ["10%", "10%", "10%", "50%", "150%", "100%", "10%", "10%", "10%", "10%", "0.00%"]


def samples(mem=MEM, cpu=CPU) -> list[dict]:
    return [{"timestamp": "naive-local-ignored", "epoch": T0 + k,
             "mem_usage": f"{m} / {'0B' if m == '0B' else '134.5GB'}", "mem_percent": "0%", "cpu_percent": c}
            for k, (m, c) in enumerate(zip(mem, cpu))]


def make_task(root: Path, calls, samples_=None, *, name="m/t", results=None) -> Path:
    task = root / name
    task.mkdir(parents=True)
    (task / "tool_calls.json").write_text(json.dumps(calls))
    (task / "resources.json").write_text(json.dumps({"samples": samples() if samples_ is None else samples_,
                                                     "summary": {}}))
    if results is not None:
        (task / "results.json").write_text(json.dumps(results))
    return task


def test_derivation_known_values(tmp_path):
    task = make_task(tmp_path, [
        call(2.5, 5.5, command="pytest -x", timeout=60000),   # A: spans the 300 MB sample
        call(7.2, 7.25, "Read", file_path="/testbed/a.py"),   # B: short, inside a gap
        call(-5, -4, "TodoWrite", todos=[]),                   # C: before any sample
        call(20, 21, "Grep", pattern="x", path="/testbed"),   # D: after the last sample
        call(3, 3, "Glob", pattern="*.py"),                    # E: zero length, exactly on a sample
    ], results={"model": "m-model"})
    (t,) = cc.convert(task)
    assert t.trace_id == "claude-code/m/t" and t.source["model"] == "m-model"
    assert t.source["path"] == "m/t"
    assert (t.source["origin"], t.source["licence"]) == ("unknown", "unknown")   # not the shipped dataset
    a, b, c, d, e = t.steps
    assert a.args == {"command": "pytest -x", "cwd": "/testbed", "timeout_ms": 60000}
    assert a.duration_ms.value == 3000.0
    # baseline 100 (sample 2); window [2.5, 6.5] -> 150, 300, 250, 100; peak 300 at t=4
    assert a.profile.peak_mb.value == 200.0
    assert a.profile.ramp_ms.value == 1500.0
    # cpu: .5 s x 50% + 1 s x 150% + 1 s x 100% + .5 s x 10% = 2.8 s
    assert a.profile.cpu_ms.value == 2800.0
    # B: baseline sample 7 (100), window [7.2, 8.25] holds sample 8 (100) -> 0; cpu 0.05 s x 10%
    assert (b.profile.peak_mb.value, b.profile.ramp_ms.value, b.profile.cpu_ms.value) == (0.0, 0.0, 5.0)
    assert b.tool == "read" and b.args == {"file_path": "/testbed/a.py"}
    # C: no sample at/before or within a period after the start; no cpu interval overlaps
    assert c.profile.to_json() == {} and c.tool == "noop" and c.args == {}
    # D: baseline known (sample 9, the "0B / 0B" sample 10 is ignored) but nothing at/after the start
    assert d.profile.peak_mb is None and d.profile.ramp_ms is None and d.profile.cpu_ms is None
    assert d.tool == "search" and d.args == {"pattern": "x", "path": "/testbed"}
    # E: baseline = sample 3 itself (150); window [3, 4] -> 150, 300
    assert e.profile.peak_mb.value == 150.0 and e.profile.ramp_ms.value == 0.0   # ramp clamped to duration 0
    assert e.profile.cpu_ms.value == 0.0


def test_derivation_units_and_first_sample(tmp_path):
    s = samples(mem=["1GB", "2097152KiB", "1000000kB", "524288000B"], cpu=["0%", "0%", "0%", "0%"])
    task = make_task(tmp_path, [call(-0.5, 0.2), call(0.5, 1.5), call(1.5, 3.5)], s)
    (t,) = cc.convert(task)
    # 1GB = 953.67 MiB, 2097152KiB = 2048 MiB, 1000000kB = 953.67 MiB, 524288000B = 500 MiB
    # step 0 starts 0.5 s before the first sample (< one period): the first sample is the baseline
    assert t.steps[0].profile.peak_mb.value == round(2048 - 1e9 / 2**20, 1) == 1094.3
    assert t.steps[1].profile.peak_mb.value == 1094.3
    assert t.steps[2].profile.peak_mb.value == 0.0       # memory only falls after 2 GiB
    assert t.steps[0].profile.cpu_ms.value == 0.0


def test_cpu_extrapolated_over_uncovered_part(tmp_path):
    s = samples(mem=["1MB"] * 3, cpu=["200%", "200%", "200%"])
    task = make_task(tmp_path, [call(1.0, 4.0)], s)        # covered (1, 2], rest after the last sample
    (t,) = cc.convert(task)
    assert t.steps[0].profile.cpu_ms.value == 6000.0     # 2 CPUs x 3 s, extrapolated from (1, 2]


def test_edit_write_multiedit_args(tmp_path):
    task = make_task(tmp_path, [
        call(0, 0.1, "Write", file_path="/testbed/n.py", content="héllo"),
        call(0, 0.1, "MultiEdit", file_path="/testbed/n.py", edits=[{"old_string": "a", "new_string": "bb"},
                                                                    {"old_string": "c", "new_string": "ddd",
                                                                     "replace_all": True}]),
        call(0, 0.1, "NotebookEdit", notebook_path="/testbed/n.ipynb", new_source="x = 1"),
        call(0, 0.1, "WeirdNewTool", anything={"deep": [1, 2]}),
        call(0, 0.1, command="sleep 100", run_in_background=True),
    ])
    (t,) = cc.convert(task)
    assert [s.tool for s in t.steps] == ["edit", "edit", "edit", "noop", "bash"]
    assert t.steps[0].args == {"op": "write", "path": "/testbed/n.py", "file_text": "héllo", "bytes": 6}
    assert t.steps[1].args == {"op": "multi_edit", "path": "/testbed/n.py", "bytes": 5,
                               "edits": [{"old_str": "a", "new_str": "bb"},
                                         {"old_str": "c", "new_str": "ddd", "replace_all": True}]}
    assert t.steps[2].args == {"notebook_path": "/testbed/n.ipynb", "bytes": 5}     # not applied: its size only
    assert t.steps[3].args == {} and t.steps[3].native_tool == "WeirdNewTool"
    assert t.steps[4].args == {"command": "sleep 100", "cwd": "/testbed", "background": True}


def test_no_samples_gives_no_profile(tmp_path):
    (t,) = cc.convert(make_task(tmp_path, [call(0, 1)], []))
    assert t.steps[0].profile.to_json() == {} and t.steps[0].duration_ms.value == 1000.0


# ---------------------------------------------------------------------------------------------
# Malformed input

def _tc(mutate):
    def apply(task: Path):
        calls = [call(0, 1), call(1, 2, "Read", file_path="/a")]
        mutate(calls)
        (task / "tool_calls.json").write_text(json.dumps(calls))
    return apply


def _raw(name: str, data: bytes):
    def apply(task: Path):
        (task / name).write_bytes(data)
    return apply


def _res(mutate):
    def apply(task: Path):
        s = samples()
        mutate(s)
        (task / "resources.json").write_text(json.dumps({"samples": s}))
    return apply


def _set(i, key, val):
    def f(items):
        if val is KeyError:
            del items[i][key]
        else:
            items[i][key] = val
    return f


def _set_input(i, key, val):
    def f(calls):
        calls[i]["input"][key] = val
    return f


def _as(i, tool, **inp):
    def f(calls):
        calls[i]["tool"], calls[i]["input"] = tool, {"file_path": "/testbed/a.py", **inp}
    return f


BAD = [
    # (id, mutation, file, record, field, text in the message)
    ("truncated", _raw("tool_calls.json", b'[{"timestamp": "2026-'), "tool_calls.json", None, None, "invalid JSON"),
    ("nul", _raw("tool_calls.json", b'[]\x00'), "tool_calls.json", None, None, "NUL byte"),
    ("not-utf8", _raw("tool_calls.json", b'["\xff"]'), "tool_calls.json", None, None, "not UTF-8"),
    ("not-a-list", _raw("tool_calls.json", b'{"a": 1}'), "tool_calls.json", None, None, "JSON array"),
    ("empty", _raw("tool_calls.json", b'[]'), "tool_calls.json", None, None, "no tool calls"),
    ("record-not-object", _tc(lambda c: c.__setitem__(1, "Bash")), "tool_calls.json", 1, None, "expected an object"),
    ("missing-timestamp", _tc(_set(1, "timestamp", KeyError)), "tool_calls.json", 1, "timestamp", "missing"),
    ("timestamp-type", _tc(_set(0, "timestamp", 17)), "tool_calls.json", 0, "timestamp", "got int"),
    ("timestamp-garbage", _tc(_set(0, "end_timestamp", "yesterday")), "tool_calls.json", 0, "end_timestamp",
     "not an ISO-8601"),
    ("timestamp-naive", _tc(_set(1, "timestamp", "2023-11-14T22:13:20.000")), "tool_calls.json", 1, "timestamp",
     "no time zone"),
    ("end-before-start", _tc(_set(1, "end_timestamp", iso(T0 + 0.5))), "tool_calls.json", 1, "end_timestamp",
     "before it starts"),
    ("missing-tool", _tc(_set(0, "tool", KeyError)), "tool_calls.json", 0, "tool", "missing"),
    ("tool-type", _tc(_set(0, "tool", ["Bash"])), "tool_calls.json", 0, "tool", "tool name"),
    ("input-type", _tc(_set(1, "input", "cat a")), "tool_calls.json", 1, "input", "expected an object"),
    ("missing-input", _tc(_set(1, "input", KeyError)), "tool_calls.json", 1, "input", "missing"),
    ("command-missing", _tc(lambda c: c[0]["input"].pop("command")), "tool_calls.json", 0, "input.command", "missing"),
    ("command-type", _tc(_set_input(0, "command", ["ls"])), "tool_calls.json", 0, "input.command", "got list"),
    ("timeout-type", _tc(_set_input(0, "timeout", "60s")), "tool_calls.json", 0, "input.timeout", "milliseconds"),
    ("background-type", _tc(_set_input(0, "run_in_background", "yes")), "tool_calls.json", 0,
     "input.run_in_background", "got str"),
    ("file-path-type", _tc(_set_input(1, "file_path", 3)), "tool_calls.json", 1, "input.file_path", "got int"),
    ("edit-old-missing", _tc(_as(1, "Edit", new_string="b")), "tool_calls.json", 1, "input.old_string", "missing"),
    ("edit-new-type", _tc(_as(1, "Edit", old_string="a", new_string=5)), "tool_calls.json", 1, "input.new_string",
     "got int"),
    ("write-content-type", _tc(_as(1, "Write", content=None)), "tool_calls.json", 1, "input.content", "got NoneType"),
    ("multiedit-missing", _tc(_as(1, "MultiEdit")), "tool_calls.json", 1, "input.edits", "missing"),
    ("multiedit-empty", _tc(_as(1, "MultiEdit", edits=[])), "tool_calls.json", 1, "input.edits", "non-empty list"),
    ("multiedit-new-missing", _tc(_as(1, "MultiEdit", edits=[{"old_string": "a"}])), "tool_calls.json", 1,
     "input.edits[0].new_string", "missing"),
    ("multiedit-item-type", _tc(_as(1, "MultiEdit", edits=["a"])), "tool_calls.json", 1, "input.edits[0]",
     "expected an object"),
    ("multiedit-replace-all-type", _tc(_as(1, "MultiEdit", edits=[{"old_string": "a", "new_string": "b",
                                                                   "replace_all": "yes"}])),
     "tool_calls.json", 1, "input.edits[0].replace_all", "got str"),
    ("surrogate", _tc(_set_input(0, "command", "echo \ud800")), "tool_calls.json", 0, "input.command", "surrogate"),
    ("nul-in-command", _tc(_set_input(0, "command", "echo \x00")), "tool_calls.json", 0, "input.command", "NUL"),
    ("huge-path", _tc(_set_input(1, "file_path", "a" * (1 << 20 | 1))), "tool_calls.json", 1, "input.file_path",
     "limit for one step argument"),
    ("nan-offset", _raw("tool_calls.json", json.dumps([call(0, 1, "Read", file_path="/a")]).replace(
        '"file_path"', '"offset": NaN, "file_path"').encode()), "tool_calls.json", 0, "input.offset", "finite number"),
    ("res-truncated", _raw("resources.json", b'{"samples": [{"epoch": 1'), "resources.json", None, None,
     "invalid JSON"),
    ("res-nul", _raw("resources.json", b'{"samples": []}\x00'), "resources.json", None, None, "NUL byte"),
    ("res-no-samples", _raw("resources.json", b'{"summary": {}}'), "resources.json", None, "samples", "missing"),
    ("res-samples-type", _raw("resources.json", b'{"samples": {}}'), "resources.json", None, "samples", "list"),
    ("res-sample-type", _res(lambda s: s.__setitem__(2, 5)), "resources.json", 2, None, "expected an object"),
    ("mem-bad-unit", _res(_set(3, "mem_usage", "12QB / 1GB")), "resources.json", 3, "mem_usage", "bad memory size"),
    ("mem-no-limit", _res(_set(3, "mem_usage", "12MB")), "resources.json", 3, "mem_usage", "USED / LIMIT"),
    ("mem-dashes", _res(_set(3, "mem_usage", "-- / --")), "resources.json", 3, "mem_usage", "bad memory size"),
    ("mem-type", _res(_set(4, "mem_usage", 12.5)), "resources.json", 4, "mem_usage", "got float"),
    ("mem-missing", _res(_set(4, "mem_usage", KeyError)), "resources.json", 4, "mem_usage", "missing"),
    ("cpu-bad", _res(_set(5, "cpu_percent", "fast%")), "resources.json", 5, "cpu_percent", "percentage"),
    ("cpu-negative", _res(_set(5, "cpu_percent", "-3%")), "resources.json", 5, "cpu_percent", ">= 0"),
    ("epoch-type", _res(_set(6, "epoch", "1700000006")), "resources.json", 6, "epoch", "Unix seconds"),
    ("epoch-missing", _res(_set(6, "epoch", KeyError)), "resources.json", 6, "epoch", "missing"),
    ("results-bad-json", _raw("results.json", b'{"model": '), "results.json", None, None, "invalid JSON"),
    ("results-model-type", _raw("results.json", b'{"model": 3}'), "results.json", None, "model", "printable str"),
]


@pytest.mark.parametrize("mutate, fname, record, field, text", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_input_raises_trace_error(tmp_path, mutate, fname, record, field, text):
    task = make_task(tmp_path, [call(0, 1), call(1, 2, "Read", file_path="/a")])
    mutate(task)
    with pytest.raises(TraceError) as info:
        list(cc.convert(task))
    err = info.value
    assert err.file == str(task / fname)
    assert err.record == record
    assert err.field == field
    assert text in str(err)
    assert str(task / fname) in str(err)
    if field:
        assert f"field '{field}'" in str(err)


def test_iter_results_keeps_going(tmp_path):
    make_task(tmp_path, [call(0, 1)], name="m/good")
    bad = make_task(tmp_path, [call(0, 1)], name="m/bad")
    (bad / "tool_calls.json").write_text("[")
    out = list(cc.iter_results(tmp_path))
    assert isinstance(out[0], TraceError) and out[0].file == str(bad / "tool_calls.json")
    assert out[1].trace_id == "claude-code/m/good"
    with pytest.raises(TraceError):
        list(cc.convert(tmp_path))


def test_not_a_task_directory(tmp_path):
    with pytest.raises(TraceError, match="no claude-code task directories"):
        list(cc.convert(tmp_path))
    with pytest.raises(TraceError, match="not a claude-code task directory"):
        list(cc.convert(tmp_path / "missing"))


def test_parsers_directly():
    assert ccs.parse_mem_mb("185.3MB / 134.5GB") == pytest.approx((185.3e6 / 2**20, 134.5e9 / 2**20))
    assert ccs.parse_mem_mb("1.5KiB / 2TiB") == (1.5 / 1024, 2 * 1024.0 ** 2)
    assert ccs.parse_mem_mb("0B / 0B") == (0.0, 0.0)
    assert ccs.parse_cpu("62.21%") == 62.21 and ccs.parse_cpu(3) == 3.0
    for bad in ("", "MB / GB", "1e999MB / 1GB", "5 / 5"):
        with pytest.raises(TraceError):
            ccs.parse_mem_mb(bad)
    with pytest.raises(TraceError):
        ccs.parse_cpu(True)
    with pytest.raises(TraceError):
        ccs.parse_cpu("nan%")


# ---------------------------------------------------------------------------------------------
# Layout variants: samples only in results.json, tool calls only in results.json, no samples at all,
# tool calls without end_timestamp

def _results(calls, samples_=None, *, samples_as_list=False) -> dict:
    out = {"image": "img", "model": "m", "claude_time": 1.0, "traces": {"files": [], "tool_calls": calls}}
    if samples_ is not None:
        out["resource_samples"] = samples_ if samples_as_list else {"samples": samples_, "summary": {}}
    return out


def _variant(root: Path, name: str, *, tool_calls=None, resources=None, results=None) -> Path:
    task = root / "m" / name
    task.mkdir(parents=True)
    if tool_calls is not None:
        (task / "tool_calls.json").write_text(json.dumps(tool_calls))
    if resources is not None:
        (task / "resources.json").write_text(json.dumps({"samples": resources, "summary": {}}))
    if results is not None:
        (task / "results.json").write_text(json.dumps(results))
    return task


CALLS = [call(2.5, 5.5, command="pytest -x"), call(7.2, 7.25, "Read", file_path="/testbed/a.py")]


def test_samples_from_results_json_equal_resources_json(tmp_path):
    ref = _variant(tmp_path, "ref", tool_calls=CALLS, resources=samples())
    for name, res in (("dict", _results(CALLS, samples())), ("list", _results(CALLS, samples(), samples_as_list=True))):
        task = _variant(tmp_path, name, tool_calls=CALLS, results=res)
        assert cc.sniff(task) and cc.sniff(task / "tool_calls.json") and not cc.sniff(task / "results.json")
        (t,) = cc.convert(task)
        (r,) = cc.convert(ref)
        assert [s.to_json() for s in t.steps] == [s.to_json() for s in r.steps]
        assert t.steps[0].profile.peak_mb.value == 200.0          # 300 MiB sample - 100 MiB baseline
        assert t.source["container"]["from"] == "results.json resource_samples"
        assert {k: v for k, v in t.source["container"].items() if k != "from"} == \
            {k: v for k, v in r.source["container"].items() if k != "from"}


def test_tool_calls_only_in_results_json(tmp_path):
    task = _variant(tmp_path, "res-only", results=_results(CALLS, samples()))
    assert cc.sniff(task) and cc.sniff(task / "results.json")
    assert convert_pkg.sniff(task / "results.json") == "claude-code"
    (t,) = cc.convert(tmp_path)                                 # found when walking, too
    assert t.trace_id == "claude-code/m/res-only" and [s.tool for s in t.steps] == ["bash", "read"]
    assert t.steps[0].profile.peak_mb.value == 200.0
    # a results.json that is not AgentCgroup's is not claimed
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.json").write_text('{"accuracy": 0.5}')
    assert not cc.sniff(other) and convert_pkg.sniff(other / "results.json") is None


def test_tool_calls_alone_convert_without_profile_and_say_why(tmp_path):
    task = _variant(tmp_path, "alone", tool_calls=CALLS)
    assert cc.sniff(task / "tool_calls.json") and convert_pkg.sniff(task / "tool_calls.json") == "claude-code"
    (t,) = cc.convert(task)
    assert [s.duration_ms.to_json() for s in t.steps] == [{"value": 3000.0, "provenance": "recorded"},
                                                           {"value": 50.0, "provenance": "recorded"}]
    assert all(s.profile.to_json() == {} for s in t.steps)
    assert "container" not in t.source
    assert t.source["profile_note"].startswith("no resource samples: the task directory has no resources.json "
                                               "and no results.json")
    # with a results.json that has no samples, the note says so
    task2 = _variant(tmp_path, "nosamples", tool_calls=CALLS, results={"model": "m"})
    (t2,) = cc.convert(task2)
    assert "its results.json no resource_samples" in t2.source["profile_note"]


def test_missing_end_timestamp_gives_no_duration_and_no_profile(tmp_path):
    calls = [dict(c) for c in CALLS]
    del calls[1]["end_timestamp"]
    calls[0]["end_timestamp"] = None
    (t,) = cc.convert(_variant(tmp_path, "noend", tool_calls=calls, resources=samples()))
    assert [s.duration_ms for s in t.steps] == [None, None]
    assert all(s.profile.to_json() == {} for s in t.steps)
    assert t.source["container"]["step_baseline_mb"] == [None, None]


def test_results_json_errors_name_the_field(tmp_path):
    bad_calls = [call(0, 1), {"tool": "Bash", "input": {"command": "ls"}}]
    task = _variant(tmp_path, "bad1", results=_results(bad_calls, samples()))
    with pytest.raises(TraceError) as info:
        list(cc.convert(task))
    assert (info.value.file, info.value.field) == (str(task / "results.json"), "traces.tool_calls[1].timestamp")
    s = samples()
    s[3]["mem_usage"] = "12QB / 1GB"
    task = _variant(tmp_path, "bad2", tool_calls=CALLS, results=_results(CALLS, s))
    with pytest.raises(TraceError) as info:
        list(cc.convert(task))
    assert info.value.field == "resource_samples.samples[3].mem_usage" and "bad memory size" in str(info.value)
    task = _variant(tmp_path, "bad3", results={"claude_time": 3.0, "traces": {"files": []}})
    with pytest.raises(TraceError, match="no tool_calls.json in the task directory"):
        list(cc.convert(task))
    task = _variant(tmp_path, "bad4", results=_results([call(0, 1, command=["ls"])], samples()))
    with pytest.raises(TraceError) as info:
        list(cc.convert(task))
    assert info.value.field == "traces.tool_calls[0].input.command"


@needs_data
def test_real_task_without_resources_json(tmp_path):
    """A real task copied without resources.json converts from results.json's identical samples to
    the same steps; with tool_calls.json alone it keeps the recorded durations."""
    src = DATA / "haiku" / "RDFLib__rdflib-1117"
    (ref,) = cc.convert(src)
    for keep, expect_profile in ((("tool_calls.json", "results.json"), True), (("results.json",), True),
                                 (("tool_calls.json",), False)):
        task = tmp_path / "-".join(keep) / "haiku" / src.name
        task.mkdir(parents=True)
        for f in keep:
            (task / f).write_bytes((src / f).read_bytes())
        (t,) = cc.convert(task)
        assert len(t.steps) == 17
        assert [s.duration_ms for s in t.steps] == [s.duration_ms for s in ref.steps]
        if expect_profile:
            assert [s.profile for s in t.steps] == [s.profile for s in ref.steps]
        else:
            assert all(s.profile.to_json() == {} for s in t.steps) and "profile_note" in t.source


# ---------------------------------------------------------------------------------------------
# Fuzzing: the task directory's three files, mutated

from hypothesis import given, settings, strategies as st   # noqa: E402
from converter_checks import FUZZ, check_converter, json_values, mutated   # noqa: E402

_value = json_values(
    ["2026-02-07T09:44:42.394Z", "12MB / 1GB", "0B / 0B", "50%", "Bash"],
    ["samples", "epoch", "mem_usage", "cpu_percent", "tool", "input", "timestamp", "end_timestamp", "command",
     "traces", "tool_calls", "resource_samples"], width=3, max_leaves=12)


@pytest.mark.slow
@settings(FUZZ, max_examples=80)
@given(data=st.data())
def test_fuzz_mutated_task(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("ccfuzz")
    layout = data.draw(st.sampled_from(["all", "results-only", "tool-calls-only", "results-samples"]))
    docs = {"tool_calls.json": [call(0, 1), call(1, 2, "Read", file_path="/a"), call(2, 3, "Edit", file_path="/a",
                                                                                   old_string="w", new_string="x")],
            "resources.json": {"samples": samples()[:5]},
            "results.json": _results([call(0, 1)], samples()[:4])}
    keep = {"all": docs, "results-only": {"results.json": docs["results.json"]},
            "tool-calls-only": {"tool_calls.json": docs["tool_calls.json"]},
            "results-samples": {"tool_calls.json": docs["tool_calls.json"], "results.json": docs["results.json"]}}[layout]
    task = root / "m" / "t"
    task.mkdir(parents=True)
    name = data.draw(st.sampled_from(sorted(keep)))
    doc = mutated(data, keep[name], _value)
    for f, d in keep.items():
        (task / f).write_text(json.dumps(d if f != name else doc))
    check_converter(cc, task)
