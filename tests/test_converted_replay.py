"""Converted OpenHands, SWE-agent and Claude Code traces replay in exp1 under
every arm. One real sample of each format is converted into a corpus with a manifest, then a study
with the four arms (executor "emulate", small time_scale) is run in a pytest subprocess: 3 traces x
4 arms, and metrics.jsonl has a line per step per arm. The Claude Code trace's tests pass (its
profiles are derived from its samples); the OpenHands and SWE-agent samples carry no profile, so
each of their tests fails saying the trace has nothing to replay."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from helpers import EXP_MODULE, cgroups_or_skip
from pytest_agentcgroup.traces.convert import claude_code, openhands_rows, swe_agent_traj
from pytest_agentcgroup.traces.corpus import Corpus
from pytest_agentcgroup.traces.ir import write_trace

DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
ARMS = ("unlimited", "static-env", "static-toolcall", "static-high")
CLAUDE_TASK = "numba__numba-5721"          # 5 steps, small peaks: quick to emulate


@pytest.fixture
def converted_study(pytester: pytest.Pytester):
    if not DATASETS.is_dir():
        pytest.skip(f"real samples absent: {DATASETS}")
    traces = [
        next(iter(openhands_rows.convert(DATASETS / "openhands-swe-rebench-row" / "sample_raw.json"))),
        next(iter(swe_agent_traj.convert(DATASETS / "swe-agent-traj" / "v1_marshmallow_fc_replace_src.traj"))),
        next(iter(claude_code.convert(DATASETS / "agentcgroup-claude-code" / "haiku" / CLAUDE_TASK))),
    ]
    corpus = pytester.path / "traces"
    corpus.mkdir()
    entries = []
    for i, t in enumerate(traces):
        write_trace(t, corpus / f"t{i}.json")
        entries.append({"trace_id": t.trace_id, "file": f"t{i}.json", "format": t.source.get("format"),
                        "steps": len(t.steps)})
    (corpus / "manifest.json").write_text(json.dumps({
        "schema": "agentcgroup-manifest/1", "subsets": {"converted": [t.trace_id for t in traces]},
        "traces": entries}))
    assert Corpus.open(corpus).ids("converted") == tuple(t.trace_id for t in traces)
    (pytester.path / "study.toml").write_text(textwrap.dedent("""
        traces = "traces"
        [defaults]
        executor = "emulate"
        time_scale = 0.001
        step_timeout_s = 60
        [arms.unlimited]
        [arms.static-env]
        scope = "trace"
        memory_max_mb = 2048
        [arms.static-toolcall]
        memory_max_mb = 2048
        [arms.static-high]
        memory_high_mb = 2048
        [experiments.exp1]
        subset = "converted"
    """))
    pytester.makepyfile(test_exp1=EXP_MODULE)
    return traces


@pytest.mark.slow
def test_converted_traces_replay_in_exp1_under_every_arm(pytester, converted_study):
    cgroups_or_skip()
    traces = converted_study
    assert {t.source["format"] for t in traces} == {"openhands-rows", "swe-agent-traj", "claude-code"}
    # -rN: no short summary, whose lines repeat each message only where CI=true stops their truncation
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rN", "--agentcgroup-config", "study.toml",
                                           "--agentcgroup-out", "out", timeout=600)
    unprofiled = [t for t in traces if all(s.profile.provenance() == "none" for s in t.steps)]
    assert [t.source["format"] for t in unprofiled] == ["openhands-rows", "swe-agent-traj"]
    result.assert_outcomes(passed=len(ARMS), failed=len(unprofiled) * len(ARMS))
    out = result.stdout.str()
    for t in unprofiled:
        assert out.count(f"trace {t.trace_id} has nothing to replay under the emulate executor") == len(ARMS), out
    lines = [json.loads(x) for x in (pytester.path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()]
    got = {(r["config"], r["trace_id"], r["step_id"]) for r in lines}
    want = {(arm, t.trace_id, s.step_id) for arm in ARMS for t in traces for s in t.steps}
    assert len(lines) == len(want) and got == want
    assert not any(r["oom_kills"] for r in lines)
