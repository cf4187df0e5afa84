"""What a Claude Code tool call's preview tells of its outcome (traces/convert/claude_code_outcomes.py),
and `agentcgroup tools recorded-outcomes`, which puts it and each profiled trace's verdict into
existing IR files."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_agentcgroup.cli import main
from pytest_agentcgroup.metrics.source_faithfulness import judge_trace
from pytest_agentcgroup.traces.convert.claude_code_outcomes import bash_outcome, edit_outcome, simple_chain
from pytest_agentcgroup.traces.ir import Outcome, read_traces, write_trace

REPO = Path(__file__).resolve().parents[1]
DATASET = next((p for p in (REPO.parent.parent / "shared" / "datasets" / "agentcgroup-claude-code",
                             REPO.parent / "shared" / "datasets" / "agentcgroup-claude-code") if p.is_dir()),
               REPO.parent / "shared" / "datasets" / "agentcgroup-claude-code")
CUT = "x" * 500 + "..."


@pytest.mark.parametrize("command, preview, want", [
    ("python3 -m pytest tests/", "Command timed out after 2m 0s\n=== test session starts ===", Outcome("timeout")),
    ("find . | xargs grep -l x", "Error", Outcome("failed")),
    ("xonsh -c 'print(1)'", "(eval):1: command not found: xonsh", Outcome("failed", 127)),
    # in a pipeline the last command's exit is the line's: not told
    ("ldconfig -p | grep lapack", "(eval):1: command not found: ldconfig", None),
    ("pip install a &; b", "(eval):1: parse error near `;&'", Outcome("failed", 1)),
    ("pip install -e .", "error: externally-managed-environment\n\n× This environment", Outcome("failed", 1)),
    ("cd /testbed && python -c 'import x'", "Traceback (most recent call last):\n  File ...", Outcome("failed", 1)),
    ("python -c 'import x'; echo done", "Traceback (most recent call last):\n  File ...", None),
    ("python3 -m pytest tests/x.py", "ImportError while loading conftest '/testbed/tests/conftest.py'.",
     Outcome("failed", 4)),
    ("/testbed/venv/bin/python -m pytest", "/testbed/venv/bin/python: No module named pytest", Outcome("failed", 1)),
    ("python -m pytest t.py", "=== test session starts ===\nt.py ..\n===== 2 passed in 0.10s =====", Outcome("ok", 0)),
    ("python -m pytest t.py", "=== test session starts ===\nt.py F.\n=== 1 failed, 1 passed in 0.1s ===",
     Outcome("failed", 1)),
    ("python -m pytest t.py", "=== test session starts ===\n=== no tests ran in 0.01s ===", Outcome("failed", 5)),
    # a cut preview: its last line is not the output's
    ("python -m pytest t.py", "=== 2 passed in 0.10s ===\n" + CUT, None),
    # output that looks fine: the source does not say it exited 0
    ("ls /testbed", "setup.py\nsrc", None),
    ("git add x", "", None),
    ("true", None, None),
])
def test_a_bash_call_is_told_only_where_its_preview_says(command, preview, want):
    assert bash_outcome(command, preview) == want


def test_simple_chains_and_edits():
    assert simple_chain("cd /testbed && python -c \"a; b | c\n d\"")
    assert not any(map(simple_chain, ["a | b", "a; b", "a || b", "a & b", "a\nb", "echo 'unclosed"]))
    assert simple_chain("ls 2>&1") and simple_chain("pytest > out.txt")
    assert edit_outcome("The file /testbed/x.py has been updated.") == Outcome("ok")
    assert edit_outcome("<tool_use_error>String to replace not found in file.</tool_use_error>") == Outcome("failed")
    assert edit_outcome(None) is None


needs_dataset = pytest.mark.skipif(not DATASET.is_dir(), reason="the agentcgroup-claude-code dataset is not here")


@needs_dataset
def test_the_tool_puts_back_what_the_source_records_and_the_verdict(tmp_path, capsys):
    corpus = tmp_path / "traces"
    shipped = ["claude-code-recorded/haiku/xonsh__xonsh-3255.json", "claude-code/haiku/xonsh__xonsh-3255.json",
               "mini-swe-agent/sympy__sympy-20154.json"]
    for rel in shipped:
        (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
        (trace,) = read_traces(REPO / "traces" / rel)
        bare = dataclasses.replace(trace, source={k: v for k, v in trace.source.items() if k != "faithfulness"},
                                   steps=tuple(dataclasses.replace(s, recorded_outcome=None)
                                               if trace.source["format"] == "claude-code" else s
                                               for s in trace.steps))
        if trace.source.get("profiled"):
            (corpus / rel).write_text(bare.dumps() + "\n", encoding="utf-8")
        else:
            write_trace(bare, corpus / rel)
    assert main(["tools", "recorded-outcomes", str(DATASET), str(corpus)]) == 0
    assert "2 Claude Code trace(s) given recorded outcomes, 2 profiled trace(s) given a faithfulness verdict; " \
           "3 file(s) changed" in capsys.readouterr().out
    # byte for byte what the corpus ships (which the converter also writes: see below)
    for rel in shipped:
        assert (corpus / rel).read_bytes() == (REPO / "traces" / rel).read_bytes(), rel
    (xonsh,) = read_traces(corpus / shipped[0])
    by_id = {s.step_id: s for s in xonsh.steps}
    assert by_id[9].recorded_outcome == Outcome("failed", 127)          # "(eval):1: command not found: xonsh"
    assert by_id[8].recorded_outcome is None                            # a cut pytest head: unknown
    assert by_id[7].recorded_outcome == Outcome("ok")                   # the edit applied there
    assert xonsh.source["faithfulness"] == judge_trace(xonsh).stored()
    # deterministic: again, nothing changes
    assert main(["tools", "recorded-outcomes", str(DATASET), str(corpus)]) == 0
    assert "0 file(s) changed" in capsys.readouterr().out


@needs_dataset
def test_the_converter_writes_the_same_recorded_outcomes():
    from pytest_agentcgroup.traces.convert.claude_code import convert_task
    got = convert_task(DATASET / "haiku" / "xonsh__xonsh-3255")
    (shipped,) = read_traces(REPO / "traces" / "claude-code" / "haiku" / "xonsh__xonsh-3255.json")
    assert [s.recorded_outcome for s in got.steps] == [s.recorded_outcome for s in shipped.steps]


def test_without_the_dataset_the_tool_says_so_and_exits_2(tmp_path, capsys):
    assert main(["tools", "recorded-outcomes", str(tmp_path / "nowhere"), str(REPO / "traces")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "dataset is not there" in err


@needs_dataset
def test_a_trace_that_is_not_the_datasets_task_is_named(tmp_path, capsys):
    (trace,) = read_traces(REPO / "traces" / "claude-code" / "haiku" / "xonsh__xonsh-3255.json")
    steps = tuple(dataclasses.replace(s, args={**s.args, "command": "echo other"}) if s.step_id == 9 else s
                  for s in trace.steps)
    write_trace(dataclasses.replace(trace, steps=steps), tmp_path / "x.json")
    assert main(["tools", "recorded-outcomes", str(DATASET), str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "x.json" in err and "step 9" in err and "Traceback" not in err
    assert list(read_traces(tmp_path / "x.json"))                       # left as it was: still a trace
