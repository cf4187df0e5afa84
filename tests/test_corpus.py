"""The shipped corpus (traces/): every trace validates and matches the manifest, subsets have the
promised shape, the builder regenerates it byte for byte; plus the command classifier."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_agentcgroup.tools import build_corpus as bc
from pytest_agentcgroup.traces.classify import KINDS, classify_command, dominant_kind
from pytest_agentcgroup.traces.corpus import Corpus
from pytest_agentcgroup.traces.ir import TraceError, read_traces

ROOT = Path(__file__).resolve().parent.parent / "traces"
DATA = Path("/work/shared/datasets/agentcgroup-claude-code")
FAMILY = "claude-code/"


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus.open(ROOT)


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((ROOT / "manifest.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def entries(manifest) -> dict:
    """The Claude Code traces (the synthetic noisy neighbours and browser traces are checked on their own)."""
    return {e["trace_id"]: e for e in manifest["traces"] if e["trace_id"].startswith("claude-code/")}


def test_every_trace_validates_and_matches_manifest(corpus, manifest, entries):
    # other families (own directories, READMEs and builders) are checked on their own
    others = ("playwright/", "recorded-here/", "mini-swe-agent/", "openhands-rows/", "claude-code-recorded/")
    assert len(entries) == 63 and len([t for t in corpus.files if not t.startswith(others)]) == 63 + 4
    on_disk = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.json")
                     if p.name not in ("manifest.json", "workspaces.lock.json")
                     and not p.relative_to(ROOT).as_posix().startswith(others))
    assert on_disk == sorted(e["file"] for e in manifest["traces"] if not e["trace_id"].startswith(others))
    for tid, entry in entries.items():
        (trace,) = read_traces(ROOT / entry["file"])            # parses = validates
        assert trace.trace_id == tid == f"claude-code/{entry['file'][len('claude-code/'):-len('.json')]}"
        assert corpus.load(tid) == trace
        assert bc.describe(trace, entry["file"]) == entry
        assert trace.source["licence"] == "GPL-2.0"
        assert trace.source["origin"] == "yunwei37/agentcgroup@5af9e7b8f37a93513206c331c7ec0ff149e89f27"


def test_noisy_neighbours_are_synthetic_and_only_in_their_subset(corpus, manifest):
    from pytest_agentcgroup.traces import noisy
    noisy_ids = corpus.ids("noisy")
    assert noisy_ids == tuple(t.trace_id for t in noisy.traces())
    assert not set(noisy_ids) & {t for n in ("smoke", "dev", "full") for t in corpus.ids(n)}
    for tid in noisy_ids:
        trace = corpus.load(tid)
        assert trace == next(t for t in noisy.traces() if t.trace_id == tid)     # file == generator
        assert trace.source["format"] == "synthetic"
        for step in trace.steps:
            assert step.duration_ms.provenance == "synthetic" and step.profile.provenance() in ("synthetic", "none")
            assert step.tool == "bash" and step.args["timeout_ms"] > 0


def test_manifest_keys_concrete(entries):
    e = entries["claude-code/haiku/RDFLib__rdflib-1117"]
    assert (e["steps"], e["bash_steps"], e["length"], e["category"], e["bursty"]) == (17, 7, "short", "test", False)
    assert e["kinds"] == {"test": 5, "fileops": 2}
    e = entries["claude-code/local/pydicom__pydicom-2065"]
    assert (e["steps"], e["length"], e["bursty"], e["peak_mb"]) == (68, "long", True, 1778.0)
    assert e["steps_over_mb"] == {"128": 1, "256": 1, "512": 1, "1024": 1}
    lengths = [x["length"] for x in entries.values()]
    assert (lengths.count("short"), lengths.count("medium"), lengths.count("long")) == (15, 21, 27)


def test_subsets(corpus, entries):
    smoke, dev, full = (corpus.ids(n) for n in ("smoke", "dev", "full"))
    assert len(full) == 63 and set(full) == set(entries)
    assert 1 <= len(smoke) <= 5 and len(set(smoke)) == len(smoke)
    assert sum(entries[t]["total_step_ms"] for t in smoke) <= 600_000
    assert any(entries[t]["peak_mb"] >= 1024 for t in smoke)
    assert {entries[t]["length"] for t in smoke} >= {"short", "long"}
    assert len({entries[t]["category"] for t in smoke}) >= 3
    assert 12 <= len(dev) <= 20 and len(set(dev)) == len(dev) and set(smoke) <= set(dev)
    d = [entries[t] for t in dev]
    assert any(10 <= e["steps"] <= 20 for e in d) and any(e["steps"] >= 50 for e in d)
    assert any(e["category"] == "test" for e in d) and any(e["kinds"].get("install", 0) >= 3 for e in d)
    assert any(e["kinds"].get("search", 0) + e["kinds"].get("vcs", 0) >= 10 for e in d)
    assert sum(e["bursty"] for e in d) >= 3
    assert sum(e["peak_mb"] >= 1024 for e in d) == 3
    assert smoke == ("claude-code/local/pydicom__pydicom-2065", "claude-code/haiku/xonsh__xonsh-3255",
                     "claude-code/local/12rambau__sepal_ui-516", "claude-code/haiku/dask__dask-2205",
                     "claude-code/haiku/libp2p__py-libp2p-533")
    assert len(dev) == 18


@pytest.mark.skipif(not DATA.is_dir(), reason="agentcgroup-claude-code dataset not present")
def test_builder_regenerates_shipped_corpus(tmp_path):
    # The builder keeps other families' manifest entries: start from the shipped manifest.
    (tmp_path / "manifest.json").write_bytes((ROOT / "manifest.json").read_bytes())
    bc.build(DATA, tmp_path)
    built = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    shipped = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                     and not any(p.is_relative_to(ROOT / d) for d in ("playwright", "recorded-here", "mini-swe-agent", "openhands-rows",
                                                                  "claude-code-recorded", "sources"))
                     and p.name != "workspaces.lock.json")
    assert built == shipped
    for rel in built:
        assert (tmp_path / rel).read_bytes() == (ROOT / rel).read_bytes(), rel


def test_builder_cli_errors(tmp_path, capsys):
    from pytest_agentcgroup.cli import main
    assert main(["tools", "build-corpus", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 1
    assert "not a claude-code task directory" in capsys.readouterr().err


def test_selection_is_deterministic_under_reordering(entries):
    es = list(entries.values())
    smoke = bc.select_smoke(es)
    assert bc.select_smoke(es[::-1]) == smoke
    assert bc.select_dev(es[::-1], smoke) == bc.select_dev(es, smoke)


def test_bursty_and_length_rules():
    assert bc.length_class(20) == "short" and bc.length_class(21) == "medium" and bc.length_class(50) == "long"
    assert bc.is_bursty([1, 2, 3, 100]) and not bc.is_bursty([1, 2, 3, 99.9])
    assert not bc.is_bursty([200, 210, 300, 400])           # 400 < 3 x median 255
    assert not bc.is_bursty([])


def test_corpus_open_errors(tmp_path):
    with pytest.raises(TraceError, match="no manifest.json"):
        Corpus.open(tmp_path)
    (tmp_path / "manifest.json").write_text('{"schema": "agentcgroup-manifest/1", "subsets": ["smoke"]}')
    with pytest.raises(TraceError, match="field 'subsets'"):
        Corpus.open(tmp_path)
    (tmp_path / "manifest.json").write_text(
        '{"schema": "agentcgroup-manifest/1", "traces": [], "subsets": {"smoke": ["x"]}}')
    with pytest.raises(TraceError, match="field 'subsets.smoke'"):
        Corpus.open(tmp_path)


# ---------------------------------------------------------------------------------------------
# classify

@pytest.mark.parametrize("cmd, kind", [
    ("python3 -m pytest", "test"),
    ("cd /testbed && python -m pytest tests/ -x 2>&1 | tail -30", "test"),
    ("PYTHONPATH=/testbed pytest -q", "test"),
    ("timeout 60 tox -e py311", "test"),
    ("python test_quote_issue.py", "test"),
    ("pip install pytest nose && python3 -m pytest", "test"),
    ("pip install -e . -q 2>&1 | tail -20", "install"),
    ("python3 -m venv venv && source venv/bin/activate && pip install -e .", "install"),
    ("apt-get update -qq && apt-get install -y liblapack3", "install"),
    ("python setup.py install", "install"),
    ("python -m py_compile a.py", "build"),
    ("make -j4", "build"),
    ("make test", "test"),
    ("git diff", "vcs"),
    ("git log --oneline | grep fix", "vcs"),
    ("git grep foo", "search"),
    ("grep -rn foo /testbed | head -20", "search"),
    ("find . -name '*.py' | xargs grep -l x", "search"),
    ("ls -la /testbed", "fileops"),
    ("cat README.md | head -30", "fileops"),
    ("sed -n '1,20p' a.py", "fileops"),
    ('python -c "import a; print(1)"', "other"),
    ("python3 << 'EOF'\nimport pytest\nprint(1)\nEOF", "other"),
    ("python x.py && cat out.txt", "other"),
    ("pip list", "other"),
    ("echo hi", "other"),
    ("", "other"),
    ('echo "unbalanced', "other"),
])
def test_classify_command(cmd, kind):
    assert classify_command(cmd) == kind


def test_dominant_kind():
    assert dominant_kind([]) == "other"
    assert dominant_kind(["ls", "ls", "pytest"]) == "fileops"                       # unweighted: count
    assert dominant_kind(["ls", "ls", "pytest"], [10, 10, 5000]) == "test"         # weighted by time
    assert dominant_kind(["git diff", "ls"], [0, 0]) == "vcs"                       # tie -> order of KINDS
    assert KINDS == ("test", "install", "build", "vcs", "search", "fileops", "other")
