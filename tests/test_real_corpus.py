"""The `real` subset (traces/mini-swe-agent): public trajectories whose real commands replay in
workspaces built from PyPI. What ships (origin, licence, a pinned workspace per trace), the tool
that builds it (which tasks it takes, deterministic output, one message for a wrong directory).
Its replay, and how faithful it is, is `make real` (CI runs it)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_agentcgroup.tools import real_corpus
from pytest_agentcgroup.traces.corpus import LOCK_FILE, Corpus
from pytest_agentcgroup.traces.ir import TraceError, read_traces
from pytest_agentcgroup.traces.task import task_of
from pytest_agentcgroup.workspaces.lock import LockFile

ROOT = Path(__file__).resolve().parent.parent / "traces"
SAMPLES = Path(__file__).resolve().parent / "data" / "mini-swe-agent"


def test_the_shipped_real_subset_names_its_origin_and_pins_a_workspace_for_every_trace():
    corpus = Corpus.open(ROOT)
    ids = corpus.ids("real")
    lock = LockFile.read(ROOT / LOCK_FILE)
    assert len(ids) >= 20
    for tid in ids:
        trace = corpus.load(tid)
        assert tid.startswith("mini-swe-agent/sympy__sympy-")
        assert trace.source["licence"] == "MIT"
        assert trace.source["origin"] == f"{real_corpus.ORIGIN}:{trace.source['path']}"
        task = task_of(trace)
        assert task.path == "/testbed" and task.instance_id == tid.split("/", 1)[1]
        entry = lock.entries[task.instance_id]
        assert entry.project == "sympy" and len(entry.sdist["sha256"]) == 64
        assert all(len(w["sha256"]) == 64 for w in entry.wheels)
    readme = (ROOT / "mini-swe-agent" / "README.md").read_text(encoding="utf-8")
    assert real_corpus.ORIGIN in readme and "MIT" in readme and f"{len(ids)} trajectories" in readme


def _run(tmp_path: Path) -> Path:
    """A trajs directory as the run's repository has it, from the converter's real samples: the
    sympy sample under three instance names, and a django one."""
    trajs = tmp_path / "trajs"
    for name, sample in (("sympy__sympy-20001", "sympy__sympy-16886"), ("sympy__sympy-19999", "sympy__sympy-16886"),
                         ("sympy__sympy-100000", "sympy__sympy-16886"), ("django__django-20002", "django__django-13670")):
        (trajs / name).mkdir(parents=True)
        data = json.loads((SAMPLES / f"{sample}.traj.json").read_text(encoding="utf-8"))
        (trajs / name / f"{name}.traj.json").write_text(json.dumps({**data, "instance_id": name}), encoding="utf-8")
    return trajs


def test_the_tool_takes_the_runs_later_sympy_tasks_and_writes_them_the_same_every_time(tmp_path):
    trajs = _run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({
        "schema": "agentcgroup-manifest/1", "traces": [{"trace_id": "x/1", "file": "x/1.json"}],
        "subsets": {"smoke": ["x/1"], "recorded": ["mini-swe-agent/sympy__sympy-20001", "x/1"]}}))
    entries = real_corpus.build(trajs, out)
    assert [e["instance"] for e in entries] == ["sympy__sympy-20001", "sympy__sympy-100000"]   # numeric order
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["subsets"]["real"] == [e["trace_id"] for e in entries]
    assert manifest["subsets"]["smoke"] == ["x/1"] and "x/1" in [e["trace_id"] for e in manifest["traces"]]  # kept
    assert manifest["subsets"]["recorded"] == ["x/1"]       # written unprofiled: out of `recorded`
    (trace,) = read_traces(out / "mini-swe-agent" / "sympy__sympy-20001.json")
    assert trace.source["origin"].endswith(f"{real_corpus.RUN}/sympy__sympy-20001/sympy__sympy-20001.traj.json")
    first = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    real_corpus.build(trajs, out)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == first
    shutil.rmtree(trajs / "sympy__sympy-100000")            # a task the run no longer has: gone from disk too
    real_corpus.build(trajs, out)
    assert sorted(p.name for p in (out / "mini-swe-agent").glob("*.json")) == ["sympy__sympy-20001.json"]
    assert json.loads((out / "manifest.json").read_text())["subsets"]["real"] == ["mini-swe-agent/sympy__sympy-20001"]
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["subsets"]["recorded"] = ["mini-swe-agent/sympy__sympy-20001"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    real_corpus.build(trajs, out)
    assert "recorded" not in json.loads((out / "manifest.json").read_text())["subsets"]    # none left: no subset


def test_the_tool_says_what_it_expected_of_a_wrong_directory(tmp_path, capsys):
    from pytest_agentcgroup.cli import main
    with pytest.raises(TraceError, match="sympy__sympy-N.traj.json with N >= 20000"):
        real_corpus.build(tmp_path, tmp_path / "out")
    assert main(["tools", "real-corpus", str(tmp_path / "absent"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agentcgroup tools real-corpus: ") and real_corpus.RUN in err and "Traceback" not in err
    trajs = _run(tmp_path)                          # a file whose trajectory is another task's
    shutil.copy(trajs / "sympy__sympy-20001" / "sympy__sympy-20001.traj.json",
                trajs / "sympy__sympy-100000" / "sympy__sympy-100000.traj.json")
    with pytest.raises(TraceError, match="is mini-swe-agent/sympy__sympy-20001, not the task its directory names"):
        real_corpus.build(trajs, tmp_path / "out")
