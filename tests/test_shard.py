"""Sharding (`--agentcgroup-shard K/N`) and `agentcgroup merge`, end to end in pytest subprocesses on
real cgroups: the synthetic study run unsharded, as shard 1/2 and as shard 2/2; the two shards
partition its tests; their merge holds the unsharded run's tests, deterministic metrics and claim
verdicts, and `agentcgroup compare` finds no regression between them. Bad shard values and runs
that are not one run's shards are refused with one message."""
from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, run_study, step_rec, write_results, write_study
from pytest_agentcgroup.cli import main
from pytest_agentcgroup.harness.collect import shard_of

ARMS = ("unlimited", "static-env", "static-toolcall", "static-high")
# static-toolcall (shard 2 of 2) against unlimited and static-high (shard 1): no shard can check these alone
CLAIMS = '["static-toolcall.oom_kills > unlimited.oom_kills", "static-high.oom_kills < static-toolcall.oom_kills"]'


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _tests(run: Path) -> set[tuple]:
    return {(r["config"], r["trace_id"]) for r in _records(run)}


def _deterministic(run: Path) -> dict:
    """Per test and step: what the replay decides, not what the clock measures."""
    return {(r["config"], r["trace_id"], r["step_id"]): (r["executed"], r["oom_kills"], r["replayed_peak_mb"],
                                                          r["exit_code"], r["timed_out"]) for r in _records(run)}


@pytest.fixture
def study(pytester):
    config = write_study(pytester.path)
    text = config.read_text().replace('subset = "smoke"', f'subset = "smoke"\nclaims = {CLAIMS}')
    config.write_text(text.replace("time_scale = 1.0", "time_scale = 0.2"))
    pytester.makepyfile(test_exp1=EXP_MODULE)
    return pytester.path


def test_a_tests_shard_is_a_hash_of_its_id_stable_and_spread():
    ids = [f"test_exp1.py::test_exp1[{arm}:t{i}]" for arm in ARMS for i in range(50)]
    assert shard_of(ids[0], 2) == shard_of(ids[0], 2) and all(1 <= shard_of(i, 3) <= 3 for i in ids)
    counts = [sum(shard_of(i, 4) == k for i in ids) for k in (1, 2, 3, 4)]
    assert min(counts) > 20, counts                 # 200 ids over 4 shards: none near empty
    # the study's tests below: static-toolcall alone in shard 2
    assert [shard_of(f"test_exp1.py::test_exp1[{a}:oom-once]", 2) for a in ARMS] == [1, 1, 2, 1]


@pytest.mark.parametrize("value", ["0/2", "3/2", "x", "1/0", "1/2/3", "-1/2"])
def test_a_bad_shard_is_one_usage_error_naming_the_option(pytester, study, value):
    result = run_study(pytester, f"--agentcgroup-shard={value}", "--collect-only", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--agentcgroup-shard (ini agentcgroup_shard): expected K/N, shard K of N with 1 <= K <= N (e.g. 1/4), " \
           f"got {value!r}" in result.stderr.str()
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_the_shards_partition_the_selection_whatever_else_is_selected(pytester, study):
    ids = {}
    for k in (1, 2):
        result = run_study(pytester, "--agentcgroup-shard", f"{k}/2", "--collect-only", "-q")
        ids[k] = {line for line in result.outlines if "::" in line}
    everything = {f"test_exp1.py::test_exp1[{a}:oom-once]" for a in ARMS}
    assert ids[1] and ids[2] and not ids[1] & ids[2] and ids[1] | ids[2] == everything
    # -k narrows a shard; it does not move a test into another shard
    result = run_study(pytester, "--agentcgroup-shard", "1/2", "-k", "static", "--collect-only", "-q")
    assert {line for line in result.outlines if "::" in line} == {i for i in ids[1] if "static" in i}
    result.stdout.fnmatch_lines(["*2/4 tests collected (2 deselected)*"])


@pytest.mark.slow
def test_merged_shards_equal_the_unsharded_run(pytester, study, capsys):
    cgroups_or_skip()
    whole = run_study(pytester, "--agentcgroup-out", "whole", "-rs")
    whole.assert_outcomes(passed=5)          # 4 trace x arm + claims[exp1]
    whole.stdout.fnmatch_lines(["exp1: claim static-toolcall.oom_kills > unlimited.oom_kills: 1 > 0 -> holds"])

    shards = {}
    for k, tests, workers in ((1, 3, ["-n", "2"]), (2, 1, [])):      # shard 1 in two xdist workers
        result = run_study(pytester, "--agentcgroup-out", f"shard{k}", "--agentcgroup-shard", f"{k}/2", "-rs", *workers)
        # skipped: claims[exp1]; xdist's controller does not count what its workers deselected
        result.assert_outcomes(passed=tests, skipped=1, **({} if workers else {"deselected": 4 - tests}))
        assert result.ret == 0
        result.stdout.fnmatch_lines([f"agentcgroup: shard {k}/2 (--agentcgroup-shard)*"])
        result.stdout.fnmatch_lines([
            "exp1: claim static-toolcall.oom_kills > unlimited.oom_kills: not checked: sharded run (shard "
            f"{k}/2), checked by `agentcgroup merge`"])
        shards[k] = (pytester.path / f"shard{k}" / "latest").resolve()
        assert json.loads((shards[k] / "run.json").read_text())["shard"] == f"{k}/2"
        kept = json.loads((shards[k] / "complete.json").read_text())["claims"]     # for the merge's claims
        assert kept["arms"] == {"exp1": {a: "ran" for a, s in zip(ARMS, (1, 1, 2, 1)) if s == k}}
    one, two, unsharded = _tests(shards[1]), _tests(shards[2]), _tests((pytester.path / "whole" / "latest").resolve())
    assert one < unsharded and two < unsharded and not one & two and one | two == unsharded

    # not all shards: refused, nothing written
    assert main(["merge", str(shards[1]), "-o", str(pytester.path / "merged")]) == 2
    assert "shard(s) 2/2 missing (given: 1/2); --partial merges the shards given" in capsys.readouterr().err
    assert not (pytester.path / "merged").exists()

    assert main(["merge", str(pytester.path / "shard2"), str(shards[1]), "-o", str(pytester.path / "merged")]) == 0
    out = capsys.readouterr().out
    assert "exp1: claim static-toolcall.oom_kills > unlimited.oom_kills: 1 > 0 -> holds" in out
    assert "exp1: claim static-high.oom_kills < static-toolcall.oom_kills: 0 < 1 -> holds" in out
    merged = (pytester.path / "merged" / "latest").resolve()
    whole_run = (pytester.path / "whole" / "latest").resolve()
    assert _tests(merged) == unsharded
    assert _deterministic(merged) == _deterministic(whole_run)
    assert sorted(_records(merged), key=lambda r: (r["config"], r["step_id"])) == \
        sorted(_records(shards[1]) + _records(shards[2]), key=lambda r: (r["config"], r["step_id"]))
    facts = json.loads((merged / "run.json").read_text())
    assert [m["shard"] for m in facts["merged_from"]] == ["1/2", "2/2"] and "shard" not in facts
    assert "--agentcgroup-shard" not in facts["pytest_args"]
    done = json.loads((merged / "complete.json").read_text())
    assert done["exitstatus"] == 0 and [v["state"] for v in done["claims"]["verdicts"]] == ["holds", "holds"]
    # the machines that measured: one here, named by the xdist shard's workers and by the serial shard alike
    assert list(done["hosts"]) == [platform.node()] == sorted({r["host"] for r in _records(merged)})
    summary = {s["config"]: s for s in json.loads((merged / "summary.json").read_text())}
    whole_summary = {s["config"]: s for s in json.loads((whole_run / "summary.json").read_text())}
    for key in ("oom_kills", "executed_steps", "total_steps", "unstarted_steps", "timeouts"):
        assert {a: s[key] for a, s in summary.items()} == {a: s[key] for a, s in whole_summary.items()}, key

    # the merged run is a run: the gate and compare take it
    assert main(["compare", str(whole_run), str(pytester.path / "merged"), "--only-worse"]) == 0, capsys.readouterr()
    capsys.readouterr()
    gated = run_study(pytester, "--agentcgroup-out", "again", "--agentcgroup-baseline", str(merged))
    gated.stdout.fnmatch_lines(["*baseline: *; 4 trace x arm compared, 0 regression(s), 0 new, 0 missing*"])
    assert gated.ret == 0

    # and the results page names the shards it was merged from
    assert main(["report", "--markdown", str(pytester.path / "merged"), "-o", str(pytester.path / "page")]) == 0
    capsys.readouterr()
    page = (pytester.path / "page" / "results.md").read_text()
    merged_from = next(line for line in page.splitlines() if line.startswith("- **merged from**: shard 1/2: "))
    assert "shard 2/2: " in merged_from and shards[2].name.replace("_", "\\_") in merged_from

    # the same shard twice, or a shard merged with the unsharded run: refused
    assert main(["merge", str(shards[1]), str(shards[1]), "-o", str(pytester.path / "m2")]) == 2
    assert f"shard 1/2 given twice: {shards[1]} and {shards[1]}" in capsys.readouterr().err
    assert main(["merge", str(shards[1]), str(whole_run), "-o", str(pytester.path / "m2")]) == 2
    assert f"{whole_run}: not a sharded run (run.json has no shard" in capsys.readouterr().err


def _shard_run(root: Path, k: int, records: list[dict], **facts) -> Path:
    run = write_results(root / f"shard{k}" / "0001_20261202T000000", records)
    (run / "run.json").write_text(json.dumps({"shard": f"{k}/2", "config_sha256": "a", "cwd": str(root),
                                              "config": "study.toml", **facts}))
    (run / "complete.json").write_text(json.dumps({"finished": "2026-12-02T00:00:00+00:00", "exitstatus": 0}))
    return run


@pytest.mark.parametrize("second, records, message", [
    ({"config_sha256": "b"}, [step_rec(config="static-high")], "ran from different configs (sha256) (a vs b)"),
    ({"corpus": {"manifest_sha256": "x"}}, [step_rec(config="static-high")], None),
    ({}, [step_rec()], "test exp1 unlimited:t/a (seed 0, params {}) is in two shards"),
])
def test_runs_that_are_not_one_runs_shards_are_refused(tmp_path, capsys, second, records, message):
    one = _shard_run(tmp_path, 1, [step_rec()], corpus={"manifest_sha256": "m"})
    two = _shard_run(tmp_path, 2, records, **{"corpus": {"manifest_sha256": "m"}, **second})
    assert main(["merge", str(one), str(two), "-o", str(tmp_path / "merged")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentcgroup merge: ") and err.count("\n") == 1
    assert message in err if message else f"{one} and {two} ran from different corpora (manifest sha256) (m vs x)" in err
    assert not (tmp_path / "merged").exists()


def test_a_partial_merge_says_which_shards_are_missing_and_checks_what_it_can(tmp_path, capsys):
    config = write_study(tmp_path)
    config.write_text(config.read_text().replace('subset = "smoke"', f'subset = "smoke"\nclaims = {CLAIMS}'))
    digest = hashlib.sha256(config.read_bytes()).hexdigest()
    one = _shard_run(tmp_path, 1, [step_rec(config="unlimited"), step_rec(config="static-high")],
                     config_sha256=digest)
    assert main(["merge", str(one), "-o", str(tmp_path / "merged")]) == 2          # not without --partial
    assert "shard(s) 2/2 missing" in capsys.readouterr().err
    assert main(["merge", str(one), "-o", str(tmp_path / "merged"), "--partial"]) == 0
    out = capsys.readouterr().out
    assert "partial: shard(s) 2 missing" in out
    assert ("exp1: claim static-toolcall.oom_kills > unlimited.oom_kills: not checked: arm static-toolcall is in "
            "none of the merged runs (shard(s) 2/2 missing)") in out
    merged = (tmp_path / "merged" / "latest").resolve()
    assert json.loads((merged / "run.json").read_text())["missing_shards"] == ["2/2"]
    assert _records(merged) == _records(one)
    # a shard whose session failed: named, and the merged run's exit status is its
    (one / "complete.json").write_text(json.dumps({"finished": "2026-12-02T00:00:00+00:00", "exitstatus": 1}))
    assert main(["merge", str(one), "-o", str(tmp_path / "merged"), "--partial"]) == 0
    assert f"shard 1/2 ({one}) ended with pytest exit status 1: its failures are the shard's" in capsys.readouterr().out
    assert json.loads((tmp_path / "merged" / "latest" / "complete.json").read_text())["exitstatus"] == 1
