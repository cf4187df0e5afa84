"""The session glue (harness/session.py, harness/controller.py), and what a review of it found:

* an error while the run tree is closed must not cost the run its results (the store is closed,
  the run merged and marked, the error still reported);
* an xdist worker is known by its `workerinput`, not by an environment variable a serial pytest
  inherits from the xdist worker that started it;
* under xdist the controller alone makes the run directory, when a worker's report first carries
  records; two sessions never take the same run number, and its workers are only told its name;
* a session that runs no experiment test (`-k` selecting nothing) neither leaves a run nor
  rewrites the unfinished run a resume would continue.
"""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from helpers import cgroups_or_skip, leaked, run_study, step_rec
from pytest_agentcgroup.harness.controller import WORKERINPUT_DONE, ControllerSettings, MetricsController
from pytest_agentcgroup.metrics import store

FAILING_CLOSE = '''
from pytest_agentcgroup.cgroups.tree import RunTree

_close = RunTree.close


def _failing_close(self):
    _close(self)
    raise OSError("injected: closing the run tree failed")


RunTree.close = _failing_close
'''


def test_an_error_closing_the_tree_keeps_the_results_and_is_reported(pytester, project):
    host = cgroups_or_skip()
    pytester.makeconftest(FAILING_CLOSE)
    result = run_study(pytester, "-k", "unlimited")
    out = result.stdout.str()
    assert "injected: closing the run tree failed" in out, out
    assert result.ret != 0
    run = (pytester.path / "out" / "latest").resolve()
    summary = json.loads((run / "summary.json").read_text())      # the store was closed all the same
    assert [s["config"] for s in summary] == ["unlimited"]
    assert len((run / store.METRICS_FILE).read_text().splitlines()) == 4
    assert store.finished(run)
    assert not leaked(host)


def test_a_serial_run_started_from_an_xdist_worker_is_not_a_worker(pytester, project, monkeypatch):
    cgroups_or_skip()
    # what a pytest subprocess started by a test running under `-n N` inherits
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    result = run_study(pytester, "-k", "unlimited or static-env")
    result.assert_outcomes(passed=2)
    run = (pytester.path / "out" / "latest").resolve()
    assert len((run / store.METRICS_FILE).read_text().splitlines()) == 2 * 4
    assert not (run / "gw3").exists()


def _controller(out: Path, *, resume: bool = False) -> MetricsController:
    config = types.SimpleNamespace(pluginmanager=types.SimpleNamespace(has_plugin=lambda name: True),
                                   invocation_params=pytest.Config.InvocationParams(args=["-n", "2"], plugins=None,
                                                                                    dir=out.parent))
    return MetricsController(config, ControllerSettings(out=out, resume=resume))


def test_two_parallel_sessions_get_distinct_run_directories_and_their_workers_make_none(tmp_path):
    first, second = _controller(tmp_path / "out"), _controller(tmp_path / "out")
    nodes = [types.SimpleNamespace(workerinput={}) for _ in range(4)]
    for node in nodes[:2]:
        first.pytest_configure_node(node)
    for node in nodes[2:]:
        second.pytest_configure_node(node)
    assert not (tmp_path / "out").exists() or not store.runs(tmp_path / "out")    # nothing made before a record
    assert all(n.workerinput[WORKERINPUT_DONE] == [] for n in nodes)              # a new run: nothing done yet
    # both sessions chose the same next number; the first to open its store takes it, the other the next
    first.take([step_rec("t/a", step_id=0)])
    second.take([step_rec("t/a", step_id=0)])
    assert first.run != second.run and first.run.is_dir() and second.run.is_dir()
    assert [r.name[:4] for r in store.runs(tmp_path / "out")] == ["0001", "0002"]
    for controller in (first, second):
        assert [r["step_id"] for r in store.read_records(controller.run / store.METRICS_FILE)] == [0]
        controller.store.close()
        store.release(controller.claim)


@pytest.mark.slow
def test_xdist_session_selecting_nothing_leaves_no_run_and_rewrites_no_unfinished_run(pytester, project):
    out = pytester.path / "out"
    nothing = run_study(pytester, "-n", "2", "-k", "no-such-arm")
    assert nothing.ret == 5, nothing.stdout.str()
    assert not out.exists() or not store.runs(out), sorted(out.iterdir())

    # a killed parallel run: its workers' files not yet merged into RUN/metrics.jsonl
    run = store.new_run(out)
    (run / "gw0").mkdir(parents=True)
    (run / store.METRICS_FILE).write_text(json.dumps(step_rec("t/a", step_id=0)) + "\n")
    (run / "gw0" / store.METRICS_FILE).write_text(json.dumps(step_rec("t/a", step_id=1)) + "\n")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    again = run_study(pytester, "-n", "2", "-k", "no-such-arm", "--agentcgroup-resume")
    assert again.ret == 5, again.stdout.str()
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert store.runs(out) == [run]


SKIPS_BEFORE_REPLAY = '''
import pytest
pytestmark = pytest.mark.experiment(name="exp1")

def test_exp1(agentcgroup_replayer):
    pytest.skip("decided not to replay after all")
'''


def test_resume_keeps_a_partial_attempt_of_a_test_that_never_replays(pytester, project):
    cgroups_or_skip()
    pytester.makepyfile(test_exp1=SKIPS_BEFORE_REPLAY)
    run = store.new_run(pytester.path / "out")           # unfinished: a partial attempt of one test
    run.mkdir(parents=True)
    partial = json.dumps(step_rec("synthetic/oom-once", step_id=0)) + "\n"
    (run / store.METRICS_FILE).write_text(partial)
    result = run_study(pytester, "--agentcgroup-resume", "-k", "unlimited")
    result.assert_outcomes(skipped=1)
    assert (run / store.METRICS_FILE).read_text() == partial


def test_an_arm_that_ran_but_wrote_no_records_is_named_so(tmp_path):
    """Session-end claims (controller.check_claims): an arm whose test ran (a call report) but left no
    step records is not called deselected."""
    from pytest_agentcgroup import config as cfgmod
    path = tmp_path / "c.toml"
    path.write_text("[arms.a]\n[arms.b]\n[experiments.exp1]\nclaims = ['a.oom_kills <= b.oom_kills']\n")
    controller = _controller(tmp_path / "out")
    reports = []
    controller.config.hook = types.SimpleNamespace(pytest_runtest_logreport=lambda report: reports.append(report))
    controller.arms_seen = {"exp1": {"a": "ran", "b": "ran"}}
    controller.check_claims([step_rec(experiment="exp1", config="a")], cfgmod.load(path))
    assert controller.claim_lines == ["exp1: claim a.oom_kills <= b.oom_kills: not checked: arm b ran, but wrote "
                                      "no step records"]
    [report] = reports                  # the claims are a test of their own: not checked skips it
    assert (report.nodeid, report.outcome) == ("exp1::claims[exp1]", "skipped")
