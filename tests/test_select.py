"""`traces select`: step/trace classification and seeded stratified subsets written as a corpus."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_agentcgroup.traces import select as S
from pytest_agentcgroup.traces.corpus import Corpus
from pytest_agentcgroup.traces.ir import Measure, Profile, Step, Trace, write_trace

CMDS = {"test": "python -m pytest -x tests", "install": "pip install -e .", "build": "make -j4",
        "vcs": "git diff", "search": "grep -rn foo src", "fileops": "cat setup.py", "other": "python repro.py"}


def _trace(i: int, fmt: str, n_steps: int, kind: str, *, burst: bool = False, timed: bool = False) -> Trace:
    steps = []
    for j in range(n_steps):
        k = kind if j % 2 == 0 else "fileops"
        if kind == "fileops":
            k = "fileops"
        dur = Measure(1000.0, "recorded") if timed else None
        prof = Profile()
        if burst is not None and fmt == "claude-code":
            prof = Profile(peak_mb=Measure(900.0 if (burst and j == 1) else 50.0, "recorded"))
        steps.append(Step(step_id=j, tool="bash", args={"command": CMDS[k]}, duration_ms=dur, profile=prof))
    return Trace(trace_id=f"{fmt}/t{i:03d}", source={"format": fmt}, steps=tuple(steps))


@pytest.fixture
def corpus_dir(tmp_path) -> Path:
    src = tmp_path / "ir"
    src.mkdir()
    i = 0
    for fmt in ("openhands-rows", "claude-code", "swe-agent-traj"):
        for n in (6, 60):
            for kind in ("test", "search", "fileops"):
                for burst in (False, True):
                    for _ in range(3):
                        write_trace(_trace(i, fmt, n, kind, burst=burst, timed=fmt == "swe-agent-traj"),
                                    src / f"t{i:03d}.json")
                        i += 1
    return src


def test_step_and_trace_classification():
    t = _trace(0, "openhands-rows", 6, "test")
    assert S.step_kinds(t) == ["test", "fileops"] * 3
    d = S.describe(t)
    assert (d["length"], d["category"], d["bash_steps"]) == ("short", "test", 6)
    assert d["kinds"] == {"test": 3, "fileops": 3}
    big = S.describe(_trace(1, "claude-code", 60, "search", burst=True))
    assert (big["length"], big["category"], big["bursty"], big["bursty_basis"]) == ("long", "search", True, "peak_mb")
    assert S.describe(_trace(2, "claude-code", 60, "search"))["bursty"] is False
    # no measurements: judged on command clustering
    steps = [Step(step_id=j, tool="bash", args={"command": CMDS[k]})
             for j, k in enumerate(["fileops"] * 6 + ["test", "build", "test"] + ["search"] * 6)]
    d = S.describe(Trace("x", {"format": "openhands-rows"}, tuple(steps)))
    assert d["bursty"] and d["bursty_basis"] == "commands"
    empty = S.describe(Trace("e", {"format": "f"}, (Step(step_id=0, tool="noop"),)))
    assert (empty["category"], empty["bursty"], empty["bursty_basis"]) == ("other", False, "none")


def test_seeded_stratified_and_nested(corpus_dir, tmp_path):
    traces, errors = S.load([corpus_dir])
    assert not errors and len(traces) == 108
    m1 = S.build(traces, tmp_path / "a", seed=3)
    m2 = S.build(list(reversed(traces)), tmp_path / "b", seed=3)
    assert m1["subsets"] == m2["subsets"]                      # deterministic, input order irrelevant
    m3 = S.build(traces, tmp_path / "c", seed=4)
    assert m3["subsets"]["dev"] != m1["subsets"]["dev"]
    subs = m1["subsets"]
    assert [len(subs[k]) for k in ("smoke", "dev", "paper", "full")] == [5, 20, 100, 108]
    assert subs["dev"][:5] == subs["smoke"] and subs["paper"][:20] == subs["dev"]
    entries = {e["trace_id"]: e for e in m1["traces"]}
    strata = {S.stratum(e) for e in entries.values()}
    # bursty is judged on peak_mb for claude-code only here (the others: equal durations / no cluster)
    assert len(strata) == 12 + 6 + 6
    # the first len(strata) picks cover every stratum; smoke/dev pick distinct strata
    assert {S.stratum(entries[i]) for i in subs["full"][:len(strata)]} == strata
    assert len({S.stratum(entries[i]) for i in subs["dev"]}) == 20
    c = Corpus.open(tmp_path / "a")
    assert c.ids("smoke") == tuple(subs["smoke"]) and len(c.ids("full")) == 108
    assert c.load(subs["smoke"][0]).trace_id == subs["smoke"][0]


def test_cli_select(corpus_dir, tmp_path):
    out = tmp_path / "sel"
    cmd = [sys.executable, "-m", "pytest_agentcgroup.cli", "traces", "select", str(corpus_dir), "-o", str(out),
           "--seed", "7", "--paper", "50", "--subsets", "smoke,dev,paper", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["subsets"]["paper"]["traces"] == 50 and rep["subsets"]["smoke"]["traces"] == 5
    c = Corpus.open(out)
    assert len(list((out / "traces").glob("*.json"))) == 50 and len(c.ids("paper")) == 50
    bad = subprocess.run(cmd[:-1] + ["--paper", "10"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    (corpus_dir / "broken.json").write_text("{not json")
    p = subprocess.run(cmd[:5] + [str(corpus_dir), "-o", str(tmp_path / "s2")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and "broken.json" in p.stderr and (tmp_path / "s2" / "manifest.json").is_file()


def test_real_samples(tmp_path):
    ds = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
    if not ds.is_dir():
        pytest.skip(f"{ds} absent")
    from pytest_agentcgroup.cli import main
    ir = tmp_path / "ir"
    main(["traces", "convert", str(ds / "openhands-swe-rebench-row"), str(ds / "swe-agent-traj"), "-o", str(ir)])
    traces, _ = S.load([ir])
    assert len(traces) >= 5
    m = S.build(traces, tmp_path / "sel", seed=1)
    assert len(m["subsets"]["smoke"]) == 5
    cats = {e["trace_id"]: e for e in m["traces"]}
    oh = [e for e in cats.values() if e["format"] == "openhands-rows"]
    assert len(oh) == 3 and all(e["bash_steps"] >= 27 and e["bursty_basis"] == "commands" for e in oh)
