"""The `real` subset (traces/mini-swe-agent): public trajectories whose real commands replay in
workspaces built from PyPI. What ships (origin, licence, a pinned workspace per trace), the tool
that builds it (which tasks it takes, deterministic output, one message for a wrong directory).
Its replay, and how faithful it is, is `make real` (CI runs it)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from converter_checks import DATASETS
from pytest_agentcgroup.tools import real_corpus
from pytest_agentcgroup.traces.corpus import LOCK_FILE, Corpus
from pytest_agentcgroup.traces.ir import TraceError, read_traces
from pytest_agentcgroup.traces.task import task_of
from pytest_agentcgroup.workspaces.lock import LockFile

ROOT = Path(__file__).resolve().parent.parent / "traces"
SAMPLES = Path(__file__).resolve().parent / "data" / "mini-swe-agent"


def test_the_shipped_real_families_name_their_origin_and_pin_a_workspace_for_every_trace():
    corpus = Corpus.open(ROOT)
    real, diverging = corpus.ids("real"), corpus.ids("real-diverging")
    lock = LockFile.read(ROOT / LOCK_FILE)
    family = {tid for tid in corpus.files if tid.startswith((f"{real_corpus.FAMILY}/", f"{real_corpus.ROWS}/"))}
    assert len(real) >= 20 and set(real) | set(diverging) <= family
    assert {t.split("/")[1] for t in diverging} == set(real_corpus.DIVERGING)
    assert any(t.startswith(f"{real_corpus.ROWS}/") for t in real)
    for tid in sorted(family):
        trace = corpus.load(tid)
        task = task_of(trace)
        entry = lock.entries[task.instance_id]
        if entry.provider == "git":           # the task's own commit, from the store the corpus ships
            assert len(entry.commit) == 40 and entry.commit_from and all(len(w["sha256"]) == 64 for w in entry.wheels)
        else:
            assert len(entry.sdist["sha256"]) == 64 and all(len(w["sha256"]) == 64 for w in entry.wheels)
        if tid.startswith(f"{real_corpus.ROWS}/"):
            assert trace.source["licence"] == "CC-BY-4.0"
            assert trace.source["origin"].startswith(f"{real_corpus.ROWS_ORIGIN}:{real_corpus.ROWS_PATH}#row")
            assert task.path.startswith("/workspace/") and entry.system == "debian-bullseye"
            continue
        n = int(tid.rsplit("-", 1)[1])
        assert trace.source["licence"] == "MIT" and (tid in real) == (n >= real_corpus.SYMPY_FROM)
        assert trace.source["origin"] == f"{real_corpus.ORIGIN}:{trace.source['path']}"
        assert task.path == "/testbed" and task.instance_id == tid.split("/", 1)[1] and entry.project == "sympy"
        # the earlier sympy releases ran on Python 3.9 and install on it only; the real subset's tasks
        # are checked out at their base commits with SWE-bench's environment for sympy (Python 3.9)
        assert entry.system == "debian-bullseye" if (n < real_corpus.SYMPY_FROM or entry.provider == "git") \
            else entry.system is None, tid
    readme = (ROOT / "mini-swe-agent" / "README.md").read_text(encoding="utf-8")
    n = sum(t.startswith(f"{real_corpus.FAMILY}/") for t in family)
    assert real_corpus.ORIGIN in readme and "MIT" in readme and f"{n} trajectories" in readme
    readme = (ROOT / "openhands-rows" / "README.md").read_text(encoding="utf-8")
    assert real_corpus.ROWS_ORIGIN in readme and "CC-BY-4.0" in readme and all(w in readme for w in real_corpus.DIVERGING.values())


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


def test_the_tool_takes_the_runs_sympy_tasks_the_later_ones_as_real_and_writes_them_the_same_every_time(tmp_path):
    trajs = _run(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({
        "schema": "agentcgroup-manifest/1", "traces": [{"trace_id": "x/1", "file": "x/1.json"}],
        "subsets": {"smoke": ["x/1"], "recorded": ["mini-swe-agent/sympy__sympy-20001", "x/1"]}}))
    entries = real_corpus.build(trajs, out)
    assert [e["instance"] for e in entries] == ["sympy__sympy-19999", "sympy__sympy-20001", "sympy__sympy-100000"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["subsets"]["real"] == ["mini-swe-agent/sympy__sympy-100000", "mini-swe-agent/sympy__sympy-20001"]
    assert manifest["subsets"]["smoke"] == ["x/1"] and "x/1" in [e["trace_id"] for e in manifest["traces"]]  # kept
    assert manifest["subsets"]["recorded"] == ["x/1"]       # written unprofiled: out of `recorded`
    (trace,) = read_traces(out / "mini-swe-agent" / "sympy__sympy-20001.json")
    assert trace.source["origin"].endswith(f"{real_corpus.RUN}/sympy__sympy-20001/sympy__sympy-20001.traj.json")
    first = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    real_corpus.build(trajs, out)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == first
    shutil.rmtree(trajs / "sympy__sympy-100000")            # a task the run no longer has: gone from disk too
    real_corpus.build(trajs, out)
    assert sorted(p.name for p in (out / "mini-swe-agent").glob("*.json")) == ["sympy__sympy-19999.json",
                                                                                "sympy__sympy-20001.json"]
    assert json.loads((out / "manifest.json").read_text())["subsets"]["real"] == ["mini-swe-agent/sympy__sympy-20001"]
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["subsets"]["recorded"] = ["mini-swe-agent/sympy__sympy-20001"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    real_corpus.build(trajs, out)
    assert "recorded" not in json.loads((out / "manifest.json").read_text())["subsets"]    # none left: no subset


def test_the_tool_says_what_it_expected_of_a_wrong_directory(tmp_path, capsys):
    from pytest_agentcgroup.cli import main
    with pytest.raises(TraceError, match=r"no sympy__sympy-N/sympy__sympy-N.traj.json here \(expected the run's trajs"):
        real_corpus.build(tmp_path, tmp_path / "out")
    assert main(["tools", "real-corpus", str(tmp_path / "absent"), str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agentcgroup tools real-corpus: ") and real_corpus.RUN in err and "Traceback" not in err
    trajs = _run(tmp_path)                          # a file whose trajectory is another task's
    shutil.copy(trajs / "sympy__sympy-20001" / "sympy__sympy-20001.traj.json",
                trajs / "sympy__sympy-100000" / "sympy__sympy-100000.traj.json")
    with pytest.raises(TraceError, match="is mini-swe-agent/sympy__sympy-20001, not the task its directory names"):
        real_corpus.build(trajs, tmp_path / "out")


def test_the_openhands_rows_go_to_real_or_real_diverging_and_keep_the_other_familys_members(tmp_path):
    """The Agent Data Protocol's three rows (the shared dataset, when present): each stamped with its
    row, the ones DIVERGING names in `real-diverging`, the other in `real` beside the sympy tasks."""
    rows = DATASETS / "openhands-swe-rebench-row" / "sample_raw.json"
    if not rows.is_file():
        pytest.skip(f"real samples absent: {rows} (the shared datasets hold the OpenHands rows)")
    trajs, out = _run(tmp_path), tmp_path / "out"
    entries = real_corpus.build(trajs, out, rows)
    subsets = json.loads((out / "manifest.json").read_text())["subsets"]
    by_family = {e["trace_id"].split("/")[0] for e in entries}
    assert by_family == {"mini-swe-agent", "openhands-rows"}
    assert subsets["real-diverging"] == ["openhands-rows/PyPSA__linopy-79/1", "openhands-rows/tianocore__edk2-pytool-library-372/0"]
    assert subsets["real"] == ["mini-swe-agent/sympy__sympy-100000", "mini-swe-agent/sympy__sympy-20001",
                               "openhands-rows/numpy__numpydoc-101/2"]
    (trace,) = read_traces(out / "openhands-rows" / "numpy__numpydoc-101" / "2.json")
    assert trace.source["origin"] == f"{real_corpus.ROWS_ORIGIN}:{real_corpus.ROWS_PATH}#row2"
    real_corpus.build(trajs, out)                   # the sympy tasks alone: the rows' members stay
    assert json.loads((out / "manifest.json").read_text())["subsets"]["real"] == subsets["real"]
