"""Experiments take only faithful traces: `traces sweep` and `traces select` leave out traces replayed
here whose stored faithfulness verdict does not pass, say how many and why, and take them all with
--include-unfaithful; the shipped subsets hold only passing traces and keep their breadth."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_agentcgroup.cli import main
from pytest_agentcgroup.metrics import source_faithfulness as rule
from pytest_agentcgroup.traces import sweep
from pytest_agentcgroup.traces.ir import Measure, Outcome, Profile, Step, Trace, write_trace

ROOT = Path(__file__).resolve().parent.parent


def trace(tid: str, verdict: str | None, *, fmt: str = "mini-swe-agent", profiled: bool = True,
          rule_version: str = rule.RULE_VERSION, peak: float = 10.0, recorded: bool = True) -> Trace:
    src: dict = {"format": fmt}
    if profiled:
        src["profiled"] = {"by": "agentcgroup traces profile"}
        if verdict is not None:
            src["faithfulness"] = {"rule": rule_version, "verdict": verdict}
    step = Step(0, "bash", {"command": "true"}, profile=Profile(peak_mb=Measure(peak, "recorded")),
                recorded_outcome=Outcome("ok", 0) if recorded else None)
    return Trace(tid, src, (step,))


def test_left_out_by_the_stored_verdict_of_a_trace_replayed_here():
    assert rule.left_out(trace("a/pass", "pass")) is None
    assert rule.left_out(trace("a/fail", "fail")) == "unfaithful"
    assert rule.left_out(trace("a/unv", "unverified")) == "unverified"
    assert rule.left_out(trace("a/none", None)) == "unverified"                    # profiled, never judged
    assert rule.left_out(trace("a/old", "pass", rule_version="faithful/0")) == "unverified"
    # a profile not replayed here (derived from the source's samples, synthetic): nothing to judge
    assert rule.left_out(trace("a/derived", None, profiled=False)) is None
    # passed on steps other than its commands: none of its commands' outcomes is recorded
    assert rule.left_out(trace("a/edits", "pass", recorded=False)) == "unverified"


def corpus(tmp_path: Path) -> Path:
    """Six traces of two agents: the three largest peaks are one fail, one unverified, one pass."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    made = [trace("m/fail", "fail", peak=900), trace("m/unverified", "unverified", peak=800),
            trace("m/pass-big", "pass", peak=700), trace("m/pass-mid", "pass", peak=300),
            trace("m/pass-small", "pass", peak=200), trace("c/derived", None, fmt="claude-code", profiled=False, peak=50)]
    entries = []
    for t in made:
        write_trace(t, tmp_path / f"{t.trace_id.replace('/', '_')}.json")
        entries.append({"trace_id": t.trace_id, "file": f"{t.trace_id.replace('/', '_')}.json",
                        "peak_mb": t.steps[0].profile.peak_mb.value})
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": "agentcgroup-manifest/1", "subsets": {},
                                                        "traces": entries}))
    return tmp_path


def test_sweep_takes_only_faithful_traces_and_says_how_many_it_skipped(tmp_path, capsys):
    root = corpus(tmp_path)
    assert main(["traces", "sweep", str(root), "--smoke", "s", "--write-manifest"]) == 0
    out = capsys.readouterr().out
    assert "# skipped 2 of 6 traces of full: 1 unfaithful (stored verdict fail), 1 unverified" in out
    assert "--include-unfaithful takes them" in out
    subsets = json.loads((root / "manifest.json").read_text())["subsets"]
    for name in ("paper", "s"):
        assert not {"m/fail", "m/unverified"} & set(subsets[name]), (name, subsets[name])
    # the smoke subset: each agent's largest faithful trace first, then the largest peaks left
    assert subsets["s"] == ["m/pass-big", "c/derived", "m/pass-mid", "m/pass-small"]
    assert "max 700" in out                                  # the limits sweep the faithful peaks only
    assert main(["traces", "sweep", str(root), "--smoke", "s", "--write-manifest",
                 "--include-unfaithful"]) == 0
    out = capsys.readouterr().out
    assert "took all 6 traces of full (--include-unfaithful" in out and "max 900" in out
    subsets = json.loads((root / "manifest.json").read_text())["subsets"]
    assert subsets["s"][:2] == ["m/fail", "c/derived"]


def test_sweep_with_no_faithful_trace_says_why_and_writes_nothing(tmp_path, capsys):
    root = corpus(tmp_path)
    assert main(["traces", "sweep", str(root), "--from", "bad", "--write-manifest"]) == 2   # no such subset
    data = json.loads((root / "manifest.json").read_text())
    data["subsets"]["bad"] = ["m/fail", "m/unverified"]
    (root / "manifest.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert main(["traces", "sweep", str(root), "--from", "bad", "--name", "p", "--write-manifest"]) == 1
    err = capsys.readouterr().err
    assert "no trace of bad to sweep: skipped 2 of 2 traces of bad: 1 unfaithful" in err
    assert "p" not in json.loads((root / "manifest.json").read_text())["subsets"]


def test_select_leaves_out_unfaithful_traces_unless_told(tmp_path, capsys):
    root = corpus(tmp_path / "in")
    assert main(["traces", "select", str(root), "-o", str(tmp_path / "out"), "--paper", "50"]) == 0
    out = capsys.readouterr().out
    assert "skipped 2 of 6 traces of the input: 1 unfaithful (stored verdict fail), 1 unverified" in out
    written = {e["trace_id"] for e in json.loads((tmp_path / "out" / "manifest.json").read_text())["traces"]}
    assert written == {"m/pass-big", "m/pass-mid", "m/pass-small", "c/derived"}
    assert main(["traces", "select", str(root), "-o", str(tmp_path / "all"), "--paper", "50",
                 "--include-unfaithful", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["traces"] == 6 and report["skipped"] == {}


# -- the shipped subsets -----------------------------------------------------------------------------

def shipped(name: str) -> list[tuple[dict, Trace]]:
    data, entries = sweep.manifest_entries(ROOT / "traces", name)
    return [(e, sweep.read_trace(ROOT / "traces", data, e["trace_id"])) for e in entries]


@pytest.mark.parametrize("name, least, agents", [("recorded-smoke", 5, 2), ("paper-recorded", 40, 3)])
def test_shipped_recorded_subsets_hold_only_passing_traces_of_several_agents(name, least, agents):
    got = shipped(name)
    bad = {e["trace_id"]: rule.left_out(t) for e, t in got if rule.left_out(t)}
    assert not bad, f"{name} holds traces an experiment may not take: {bad}"
    # every one of them was replayed here and passes (none is taken for want of a replay)
    assert all(t.source["faithfulness"]["verdict"] == "pass" for _, t in got)
    keys = [sweep.breadth_keys(t) for _, t in got]
    assert len(got) >= least and len({k["agent"] for k in keys}) >= agents, sweep.breadth(keys)


def test_shipped_recorded_subsets_follow_the_rule():
    data, recorded = sweep.manifest_entries(ROOT / "traces", "recorded")
    taken = [dict(e, **sweep.breadth_keys(t)) for e in recorded
             if not rule.left_out(t := sweep.read_trace(ROOT / "traces", data, e["trace_id"]))]
    assert data["subsets"]["paper-recorded"] == sweep.paper_subset(taken)
    # breadth: every agent and every repository that has a faithful trace is in paper-recorded
    paper = [e for e in taken if e["trace_id"] in data["subsets"]["paper-recorded"]]
    for key in ("agent", "repository"):
        assert {e[key] for e in paper} == {e[key] for e in taken}, key
    smoke = data["subsets"]["recorded-smoke"]
    assert smoke == sweep.smoke_subset(taken) and len(smoke) == sweep.SMOKE_SIZE
    twins = sweep.derived_twins(ROOT / "traces", data, smoke)
    assert twins and data["subsets"]["recorded-smoke-1hz"] == [twins[t] for t in smoke if t in twins]
    for rec, der in twins.items():             # the same source run, once replayed here, once from 1 Hz samples
        assert rec.split("/", 1)[1] == der.split("/", 1)[1] and rec != der
