"""Nothing passes silently and no result is lost, in pytest subprocesses on real cgroups: a step
that could not start, an emulated step that exits non-zero unexplained, or an executor crash fails
its test (records kept); a session without experiments leaves the results directory byte for byte
and mtime for mtime as it was; two runs into one results directory keep both."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, leaked, run_study, write_study


@pytest.fixture
def project(pytester):
    write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)


# The real emulate executor and real cgroups; only step 1's command is swapped for a faulty one.
FAULTY = '''
import dataclasses
import pytest
from pytest_agentcgroup.replay.executors import EmulateExecutor
pytestmark = pytest.mark.experiment(name="exp1")

@pytest.fixture(autouse=True)
def fault(monkeypatch):
    real = EmulateExecutor.launch
    def launch(self, step):
        got = real(self, step)
        if step.step_id != 1:
            return got
        if FAULT == "exit":
            return dataclasses.replace(got, argv=["/bin/sh", "-c", "exit 3"])
        if FAULT == "unstartable":
            return dataclasses.replace(got, argv=["/nonexistent/agcg-no-such-binary"])
        raise RuntimeError("the executor broke")
    monkeypatch.setattr(EmulateExecutor, "launch", launch)

def test_exp1(agentcgroup_run):
    agentcgroup_run()             # no budget is asserted: the harness itself must fail the test
'''


def _records(pytester):
    return [json.loads(x) for x in (pytester.path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("fault, says, kept", [
    ("exit", ["*exp1 under arm unlimited: 1 step(s) did not run as replayed (emulate executor*",
              "*synthetic/oom-once step 1 (bash: *): the emulator ended with exit code 3, and no OOM kill, "
              "timeout or policy kill was counted*"], 4),
    ("unstartable", ["*synthetic/oom-once step 1 (bash: *): could not be started: cannot start "
                     "'/nonexistent/agcg-no-such-binary': no such executable*"], 4),
    ("crash", ["*RuntimeError: the executor broke*",
               "*the emulate executor crashed replaying synthetic/oom-once under arm unlimited at step 1; "
               "1 step record(s) kept in *metrics.jsonl*"], 1),
])
def test_a_step_that_did_not_run_as_asked_fails_its_test(pytester, project, fault, says, kept):
    host = cgroups_or_skip()
    pytester.makepyfile(test_exp1=f"FAULT = {fault!r}\n" + FAULTY)
    result = run_study(pytester, "-k", "unlimited")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(says)
    recs = _records(pytester)
    assert [r["step_id"] for r in recs] == list(range(kept)), "the records written before the failure are kept"
    if fault == "exit":
        assert recs[1]["exit_code"] == 3 and recs[1]["executed"] and not recs[1]["oom_kills"]
    if fault == "unstartable":
        assert not recs[1]["executed"] and "no such executable" in recs[1]["error"]
        summary = json.loads((pytester.path / "out" / "latest" / "summary.json").read_text())
        assert (summary[0]["executed_steps"], summary[0]["unstarted_steps"]) == (3, 1)    # emulate runs the noop too
    assert leaked(host) == []


@pytest.mark.slow
def test_an_oom_killed_emulated_step_is_expected_not_a_failure(pytester, project):
    """The counted OOM kill explains step 1's SIGKILL under the per-step limit: the test passes."""
    cgroups_or_skip()
    result = run_study(pytester, "-k", "static-toolcall")
    result.assert_outcomes(passed=1)
    assert [(r["step_id"], r["signal"], r["oom_kills"]) for r in _records(pytester) if r["signal"]] == [(1, 9, 1)]


def _snapshot(root: Path) -> dict:
    """Every entry under root (root too): its bytes or link target, its mode and mtime (lstat)."""
    out = {}
    for p in [root, *sorted(root.rglob("*"))]:
        st = p.lstat()
        what = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None
        out[str(p.relative_to(root))] = (st.st_mode, st.st_mtime_ns, what)
    return out


@pytest.mark.slow
def test_a_session_without_experiments_leaves_the_results_directory_untouched(pytester, project):
    out = pytester.path / "out"
    earlier = out / "0001_20260101T000000"            # an earlier, unfinished run (resume would continue it)
    earlier.mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text('{"trace_id": "t", "config": "a", "step_id": 0}\n')
    (earlier / "summary.json").write_text("[]\n")
    os.symlink(earlier.name, out / "latest")
    (pytester.path / "legacy").mkdir()                 # results written before runs had directories
    (pytester.path / "legacy" / "metrics.jsonl").write_text("{}\n")
    pytester.makepyfile(test_plain="def test_ir():\n    assert 1 + 1 == 2\n")
    before, legacy = _snapshot(out), _snapshot(pytester.path / "legacy")
    for args in ([], ["--agentcgroup-resume"], ["-n", "2"], ["-n", "2", "--agentcgroup-resume"]):
        run_study(pytester, "test_plain.py", *args).assert_outcomes(passed=1)
        assert _snapshot(out) == before, args
        run_study(pytester, "test_plain.py", "--agentcgroup-out", "legacy", *args).assert_outcomes(passed=1)
        assert _snapshot(pytester.path / "legacy") == legacy, args
    # nor is one made where there was none
    for args in ([], ["-n", "2"]):
        run_study(pytester, "test_plain.py", "--agentcgroup-out", "fresh", *args).assert_outcomes(passed=1)
        assert not (pytester.path / "fresh").exists(), args


@pytest.mark.slow
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_two_runs_into_one_results_directory_keep_both(pytester, project, workers):
    cgroups_or_skip()
    out = pytester.path / "out"
    run_study(pytester, "-k", "unlimited or static-env", *workers).assert_outcomes(passed=2)
    first = (out / "latest").resolve()
    kept = _snapshot(first)
    # the second run gates against the first, named as the results directory (= its newest run then)
    second_result = run_study(pytester, "-k", "static-high", "--agentcgroup-baseline", "out", *workers)
    second_result.assert_outcomes(passed=1)
    second = (out / "latest").resolve()
    assert first != second and first.name.startswith("0001_") and second.name.startswith("0002_")
    assert _snapshot(first) == kept, "the second run changed the first"
    assert sorted(p.name for p in out.iterdir()) == sorted([first.name, second.name, "latest"])
    for run, arms in ((first, {"unlimited", "static-env"}), (second, {"static-high"})):
        assert sorted(p.name for p in run.iterdir()) == ["complete.json", "metrics.jsonl", "run.json", "summary.json"]
        assert {r["config"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())} == arms
    # the baseline was the first run (not the second, itself): its static-high is `new`
    second_result.stdout.fnmatch_lines([f"*baseline: {first}; 0 trace x arm compared*",
                                        "*new (not in the baseline, not gated): exp1/static-high*"])
