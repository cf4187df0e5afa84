"""The session glue (harness/session.py, harness/controller.py), issue 11's review findings:

* an error while the run tree is closed must not cost the run its results (the store is closed,
  the run merged and marked, the error still reported);
* an xdist worker is known by its `workerinput`, not by an environment variable a serial pytest
  inherits from the xdist worker that started it;
* under xdist the controller makes the run directory once, before the workers start, so two
  sessions cannot both take the same run number;
* a session that runs no experiment test (`-k` selecting nothing) neither leaves a run nor
  rewrites the unfinished run a resume would continue.
"""
from __future__ import annotations

import json

from conftest import cgroups_or_skip
from pytest_agentcgroup.metrics import store
from test_plugin import leaked, project, run_study  # noqa: F401  (project: a fixture)

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
