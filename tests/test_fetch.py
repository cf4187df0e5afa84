"""`traces fetch`: partial parquet reads through an fsspec filesystem, resume, unreachable Hub."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
fsspec = pytest.importorskip("fsspec")

from pytest_agentcgroup.traces import fetch as F  # noqa: E402
from pytest_agentcgroup.traces.convert import openhands_rows  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "openhands-swe-rebench-row" / "sample_raw.json"
ROWS_PER_GROUP, GROUPS = 4, 5


def _rows() -> list[dict]:
    if SAMPLE.is_file():
        base = json.loads(SAMPLE.read_text())
    else:  # a minimal row in the same schema
        base = [{"trajectory_id": "t", "instance_id": "o__r-1", "repo": "o/r", "trajectory": [
            {"role": "system", "content": "s", "name": None, "tool_call_id": None, "tool_calls": None},
            {"role": "assistant", "content": "", "name": None, "tool_call_id": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "execute_bash", "arguments": '{"command": "ls"}'}}]},
            {"role": "tool", "content": "x\n[Current working directory: /testbed]", "name": "execute_bash",
             "tool_call_id": "c1", "tool_calls": None}],
            "tools": [], "model_patch": "", "exit_status": "submit", "resolved": 1,
            "gen_tests_correct": None, "pred_passes_gen_tests": None}]
    out = []
    for i in range(ROWS_PER_GROUP * GROUPS):
        r = dict(base[i % len(base)])
        r["trajectory_id"] = f"traj-{i:04d}"
        r["instance_id"] = f"{r['instance_id']}-{i}"
        out.append(r)
    return out


@pytest.fixture(scope="module")
def parquet_file(tmp_path_factory) -> Path:
    """A parquet file in the real schema (nested list<struct> trajectory), GROUPS row groups."""
    path = tmp_path_factory.mktemp("hub") / "train-00000-of-00001.parquet"
    rows = _rows()
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, path, row_group_size=ROWS_PER_GROUP)
    assert pq.ParquetFile(path).metadata.num_row_groups == GROUPS
    return path


def _ids(result) -> list[str]:
    out = []
    for f in result.files:
        out += pq.read_table(f, columns=["trajectory_id"]).column(0).to_pylist()
    return out[: result.rows]


def test_reads_only_needed_row_groups(parquet_file, tmp_path):
    calls = []
    res = F.fetch_rows(fsspec.filesystem("file"), [str(parquet_file)], 6, tmp_path / "c",
                       on_chunk=lambda *a: calls.append(a))
    assert res.rows == 6 and res.fetched_row_groups == 2 and res.total_rows == ROWS_PER_GROUP * GROUPS
    assert [c[2] for c in calls] == [0, 1]
    assert _ids(res) == [f"traj-{i:04d}" for i in range(6)]
    # the last chunk holds only the rows asked for
    assert pq.read_metadata(res.files[-1]).num_rows == 2


def test_resume_after_interrupt(parquet_file, tmp_path):
    n = ROWS_PER_GROUP * GROUPS - 1
    dest = tmp_path / "c"

    def boom(done, fi, rg):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        F.fetch_rows(fsspec.filesystem("file"), [str(parquet_file)], n, dest, on_chunk=boom)
    state = json.loads((dest / F.STATE).read_text())
    assert len(state["chunks"]) == 2
    res = F.fetch_rows(fsspec.filesystem("file"), [str(parquet_file)], n, dest)
    assert res.reused_row_groups == 2 and res.fetched_row_groups == GROUPS - 2
    ids = _ids(res)
    assert ids == [f"traj-{i:04d}" for i in range(n)] and len(set(ids)) == n
    out = tmp_path / "all.parquet"
    assert F.combine(res, out) == n
    assert pq.read_table(out).column("trajectory_id").to_pylist() == ids
    # a third run reads nothing
    again = F.fetch_rows(fsspec.filesystem("file"), [str(parquet_file)], n, dest)
    assert again.fetched_row_groups == 0 and _ids(again) == ids


def test_fetched_rows_convert(parquet_file, tmp_path):
    res = F.fetch_local(parquet_file, 5, tmp_path / "cache")
    out = tmp_path / "rows.parquet"
    F.combine(res, out)
    traces = list(openhands_rows.convert(out))
    assert len(traces) == 5 and all(t.steps for t in traces)
    jl = F.fetch_local(parquet_file, 3, tmp_path / "cache2", fmt="jsonl")
    lines = [json.loads(x) for f in jl.files for x in f.read_text().splitlines()]
    assert [r["trajectory_id"] for r in lines][:3] == ["traj-0000", "traj-0001", "traj-0002"]


def _cli(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "pytest_agentcgroup.cli", "traces", "fetch", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_cli_source(parquet_file, tmp_path):
    out = tmp_path / "o.jsonl"
    p = _cli("--source", str(parquet_file), "-n", "7", "--cache", str(tmp_path / "c"), "-o", str(out), "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["rows"] == 7 and len(out.read_text().splitlines()) == 7


def test_cli_unreachable_hub_one_line(tmp_path):
    pytest.importorskip("huggingface_hub")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"), NO_PROXY="*", no_proxy="*")
    t0 = time.monotonic()
    p = _cli("-n", "3", "--cache", str(tmp_path / "c"), "--timeout", "3", env=env)
    assert time.monotonic() - t0 < 45
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "cannot reach the Hugging Face Hub (127.0.0.1:9)" in lines[0] and "--source FILE" in lines[0]


def test_cli_missing_source(tmp_path):
    p = _cli("--source", str(tmp_path / "nope.parquet"), "--cache", str(tmp_path / "c"))
    assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# Pinning: the commit the Hub resolved is what the fetch records, so it can be repeated exactly.
# The Hub is not reachable here: its filesystem layout (`datasets/<repo>@<sha>/<path>`) is laid out
# in a local directory and read through fsspec's local filesystem, the same code path after the
# revision lookup (`fetch_at_commit`); the lookup's answer is checked by `pinned_commit`.

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture()
def hub_dir(parquet_file, tmp_path) -> Path:
    d = tmp_path / "hub" / "datasets" / "o" / f"r@{SHA}" / "data"
    d.mkdir(parents=True)
    (d / "train-00000-of-00001.parquet").write_bytes(parquet_file.read_bytes())
    return tmp_path / "hub" / "datasets"


def test_pinned_commit_is_the_hubs_answer():
    assert F.pinned_commit(SHA.upper(), "main", "o/r") == SHA          # a branch resolves to its commit
    assert F.pinned_commit(SHA, SHA, "o/r") == SHA                      # a SHA asked for is kept
    with pytest.raises(F.FetchError, match="names no commit SHA"):
        F.pinned_commit(None, "main", "o/r")                            # never record a moving name
    with pytest.raises(F.FetchError, match="names no commit SHA"):
        F.pinned_commit("main", "main", "o/r")
    with pytest.raises(F.FetchError, match="answered with commit"):
        F.pinned_commit(SHA, "f" * 40, "o/r")


def test_fetch_at_commit_records_the_commit_everywhere(hub_dir, tmp_path):
    fs = fsspec.filesystem("file")
    res = F.fetch_at_commit(fs, "o/r", SHA, 6, revision="main", cache=tmp_path / "c", root=str(hub_dir))
    assert res.rows == 6 and res.dest == tmp_path / "c" / "o__r" / SHA
    assert res.origin == {"repo": "o/r", "commit": SHA, "revision_asked": "main",
                          "paths": ["data/train-00000-of-00001.parquet"]}
    state = json.loads((res.dest / F.STATE).read_text())
    assert state["origin"]["commit"] == SHA and state["identity"]["revision"] == SHA
    out = tmp_path / "rows.parquet"
    assert F.combine(res, out) == 6
    side = json.loads((tmp_path / "rows.parquet.origin.json").read_text())
    assert side["commit"] == SHA and side["rows"] == 6
    assert side["repeat"] == f"agentcgroup traces fetch -n 6 --repo o/r --revision {SHA}"
    meta = json.loads(pq.read_schema(out).metadata[F.ORIGIN_KEY])
    assert meta == side
    # repeating with the SHA as --revision reads the same rows from the same cache directory
    again = F.fetch_at_commit(fs, "o/r", F.pinned_commit(SHA, SHA, "o/r"), 6, revision=SHA, cache=tmp_path / "c",
                              root=str(hub_dir), path="data/train-00000-of-00001.parquet")
    assert again.dest == res.dest and again.reused_row_groups == 2 and _ids(again) == _ids(res)
    assert F.repeat_command(again.origin, 6).endswith(f"--revision {SHA} --path data/train-00000-of-00001.parquet")
    jl = tmp_path / "rows.jsonl"
    F.combine(res, jl)
    assert json.loads((tmp_path / "rows.jsonl.origin.json").read_text())["commit"] == SHA


def test_cli_source_output_says_its_origin(parquet_file, tmp_path):
    out = tmp_path / "o.parquet"
    p = _cli("--source", str(parquet_file), "-n", "3", "--cache", str(tmp_path / "c"), "-o", str(out), "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["origin"]["source"] == str(parquet_file.resolve())
    side = json.loads((tmp_path / "o.parquet.origin.json").read_text())
    assert side["rows"] == 3 and side["repeat"] == f"agentcgroup traces fetch -n 3 --source {parquet_file.resolve()}"
