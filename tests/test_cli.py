"""The `agentcgroup traces convert|validate|stats` command line: exit codes, per-file reports, a corrupt
file in a batch, machine-readable output."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_agentcgroup import cli
from pytest_agentcgroup.traces.ir import read_traces

DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
SAMPLES = {
    "rows.json": DATASETS / "openhands-swe-rebench-row" / "sample_raw.json",
    "swe_rows.json": DATASETS / "swe-agent-hf-rows" / "rows_1-3.json",
    "events.json": DATASETS / "openhands-events" / "wrong_initial_state.json",
    "run.traj": DATASETS / "swe-agent-traj" / "v1_test-repo-6e44b9.traj",
    "pw.zip": DATASETS / "playwright-trace" / "trace-library-1.46.zip",
}
needs_data = pytest.mark.skipif(not all(p.is_file() for p in SAMPLES.values()),
                                reason=f"real samples not present under {DATASETS}")


@pytest.fixture
def batch(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for name, p in SAMPLES.items():
        shutil.copy(p, src / name)
    (src / "README.md").write_text("not a trace")
    return src


@needs_data
def test_convert_a_directory(batch, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["traces", "convert", str(batch), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"{batch / 'rows.json'}: openhands-rows, 3 trace(s), 188 step(s)" in text
    assert f"{batch / 'swe_rows.json'}: swe-agent-rows, 3 trace(s), 25 step(s)" in text
    assert f"{batch / 'events.json'}: openhands-events, 1 trace(s), 4 step(s)" in text
    assert f"{batch / 'run.traj'}: swe-agent-traj, 1 trace(s), 5 step(s)" in text
    assert f"{batch / 'pw.zip'}: playwright, 1 trace(s), 5 step(s)" in text
    assert "converted 9 trace(s)" in text
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert "openhands-rows/PyPSA__linopy-79/1.json" in files and "playwright/pw.json" in files
    assert len(files) == 9
    (t,) = read_traces(out / "openhands-rows" / "PyPSA__linopy-79" / "1.json")
    assert t.trace_id == "openhands-rows/PyPSA__linopy-79/1" and len(t.steps) == 78


@needs_data
def test_a_corrupt_file_is_named_and_the_rest_converts(batch, tmp_path, capsys):
    (batch / "broken.json").write_text(SAMPLES["events.json"].read_text()[:5000])   # truncated event stream
    out = tmp_path / "out"
    assert cli.main(["traces", "convert", str(batch), "-o", str(out)]) == 1
    cap = capsys.readouterr()
    assert f"{batch / 'broken.json'}: invalid JSON" in cap.err
    assert "converted 9 trace(s)" in cap.out and "1 file(s) with errors" in cap.out
    assert len(list(out.rglob("*.json"))) == 9


@needs_data
def test_a_bad_record_is_named_and_its_neighbours_convert(tmp_path, capsys):
    rows = json.loads(SAMPLES["rows.json"].read_text())
    rows[1]["trajectory"][2]["tool_calls"][0]["function"]["name"] = "launch_missiles"
    p = tmp_path / "rows.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["traces", "convert", str(p), "-o", str(tmp_path / "out"), "--json"]) == 1
    cap = capsys.readouterr()
    report = json.loads(cap.out)
    (entry,) = report["files"]
    assert entry["format"] == "openhands-rows" and entry["traces"] == 2 and entry["steps"] == 45 + 65
    assert entry["errors"] == [f"{p}, record 2, step 0, field 'trajectory[2].tool_calls[0].function.name': "
                               "unknown tool 'launch_missiles'; known: execute_bash, str_replace_editor, think, "
                               "finish, task_tracker, execute_ipython_cell, browser, web_read, fetch, edit_file, "
                               "request_condensation"]
    assert entry["errors"][0] in cap.err
    assert report["failed_files"] == 1 and report["traces"] == 2


def test_unrecognised_or_missing_file_named_on_the_command_line(tmp_path, capsys):
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    assert cli.main(["traces", "convert", str(p), "-o", str(tmp_path / "o")]) == 1
    assert f"{p}: format not recognised" in capsys.readouterr().err
    assert cli.main(["traces", "convert", str(tmp_path / "nope.json"), "-o", str(tmp_path / "o")]) == 1
    assert "no such file or directory" in capsys.readouterr().err


def test_empty_directory_is_bad_input(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli.main(["traces", "convert", str(tmp_path / "empty"), "-o", str(tmp_path / "o")]) == 1
    assert "nothing converted" in capsys.readouterr().err


@needs_data
def test_format_override(tmp_path, capsys):
    p = tmp_path / "rows.data"           # a suffix nothing sniffs
    shutil.copy(SAMPLES["swe_rows.json"], p)
    assert cli.main(["traces", "convert", str(p), "-o", str(tmp_path / "o")]) == 1
    capsys.readouterr()
    p2 = tmp_path / "rows.json"
    shutil.copy(SAMPLES["swe_rows.json"], p2)
    assert cli.main(["traces", "convert", str(p2), "-o", str(tmp_path / "o"), "--format", "swe-agent-rows"]) == 0
    assert cli.main(["traces", "convert", str(p2), "-o", str(tmp_path / "o2"), "--format", "playwright"]) == 1
    assert "not a readable zip archive" in capsys.readouterr().err


def test_convert_to_atif(tmp_path, capsys):
    # our own traces (an IR file of the shipped corpus) and another producer's ATIF file, out as ATIF
    repo = Path(__file__).resolve().parents[1]
    ir_file, atif_in = repo / "traces" / "claude-code" / "haiku" / "simonw__files-to-prompt-44.json", \
        repo / "tests" / "data" / "atif" / "claude-code-subagent.json"
    out = tmp_path / "atif"
    assert cli.main(["traces", "convert", str(ir_file), str(atif_in), "-o", str(out), "--to", "atif"]) == 0
    text = capsys.readouterr().out
    assert f"{ir_file}: ir, 1 trace(s), 22 step(s)" in text and f"{atif_in}: atif, 2 trace(s), 10 step(s)" in text
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.json"))
    assert files == ["atif/c3f1a2b4-0d9e-4f7a-8b6c-5e4d3c2b1a09.json",
                     "atif/c3f1a2b4-0d9e-4f7a-8b6c-5e4d3c2b1a09/explore-1.json",
                     "claude-code/haiku/simonw__files-to-prompt-44.json"]
    doc = json.loads((out / files[2]).read_text())
    assert doc["schema_version"] == "ATIF-v1.4" and doc["session_id"] == "claude-code/haiku/simonw__files-to-prompt-44"
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, 23))
    # and back (the default --to is the IR): the same traces
    back = tmp_path / "ir"
    assert cli.main(["traces", "convert", str(out), "-o", str(back)]) == 0
    (again,) = read_traces(back / files[2])
    (original,) = read_traces(ir_file)
    assert again == original


@pytest.mark.parametrize("argv", [
    [], ["traces"], ["traces", "convert"], ["traces", "convert", "x"], ["traces", "convert", "x", "-o", "y", "--format", "nope"],
    ["traces", "convert", "x", "-o", "y", "--to", "json"],
    ["traces", "frobnicate"], ["traces", "stats"], ["--bogus"],
])
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as ei:
        cli.main(argv)
    assert ei.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_help_explains(capsys):
    with pytest.raises(SystemExit) as ei:
        cli.main(["traces", "convert", "--help"])
    assert ei.value.code == 0
    text = capsys.readouterr().out
    assert "openhands-rows" in text and "--format" in text and "exit code" in text and "--to {ir,atif}" in text


@needs_data
def test_validate_and_stats(batch, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["traces", "convert", str(batch / "rows.json"), str(batch / "pw.zip"), "-o", str(out)]) == 0
    capsys.readouterr()
    assert cli.main(["traces", "validate", str(out)]) == 0
    assert capsys.readouterr().out.count(": ok, 1 trace(s)") == 4
    assert cli.main(["traces", "stats", str(out), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["traces"] == 4 and st["steps"] == 188 + 5
    assert st["tools"] == {"bash": 102, "python": 0, "edit": 34, "read": 43, "search": 0, "browser": 5, "noop": 9}
    assert st["formats"] == {"openhands-rows": 3, "playwright": 1}
    assert st["duration_provenance"] == {"recorded": 5, "derived": 0, "synthetic": 0, "none": 188}
    assert st["steps_per_trace"] == {"min": 5, "median": 55.0, "max": 78}
    assert cli.main(["traces", "stats", str(out)]) == 0
    assert "traces: 4   steps: 193" in capsys.readouterr().out
    # a corpus's workspace lock and a cache in a dot-directory are beside its traces, not traces
    (out / "workspaces.lock.json").write_text('{"schema": "agentcgroup-workspaces/1", "workspaces": {}}')
    (out / ".cache").mkdir()
    (out / ".cache" / "meta.json").write_text("{}")
    assert cli.main(["traces", "validate", str(out)]) == 0
    assert capsys.readouterr().out.count(": ok, 1 trace(s)") == 4

    bad = out / "bad.json"
    bad.write_text('{"schema": "agentcgroup-trace/1", "trace_id": "x", "source": {}, "steps": [{"step_id": 0, "tool": "teleport"}]}')
    assert cli.main(["traces", "validate", str(out), "--json"]) == 1
    cap = capsys.readouterr()
    report = json.loads(cap.out)
    assert report["valid"] == 4 and report["invalid"] == 1
    assert f"{bad}, step 0, field 'tool': unknown tool 'teleport'" in cap.err
    assert cli.main(["traces", "stats", str(out)]) == 1
    assert cli.main(["traces", "validate", str(tmp_path / "nothing-here")]) == 1


def test_console_script_entry_point(tmp_path):
    r = subprocess.run([sys.executable, "-c", "import sys; from pytest_agentcgroup.cli import main; sys.exit(main())",
                        "traces", "validate", str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert r.returncode == 1 and "cannot read" in r.stderr
