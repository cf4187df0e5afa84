"""Tests whose slow part runs beside the rest of the session: a VM boot takes minutes of one core
(single-threaded TCG), the bare-Debian set-up minutes of downloads and unpacking, while the host's
tests need the other core. Such a test names its slow part with `background(run=FUNCTION,
lane=NAME)`: when collection ends, FUNCTION(out, **its parameters) of every selected such test
starts in a thread of its lane (one at a time per lane: two VMs would take both cores), the tests
move to the end of the run, and each gets what its function returned from the `background_result`
fixture (a skip or failure the function raised is raised there) and asserts on it. Where nothing
runs beside them (`--collect-only`, an xdist worker, or AGENTCGROUP_BACKGROUND=0) the function runs
when its test does. `out` is a new directory of the test's own.

A plugin of the test suite (tests/conftest.py loads it), not of the product.
"""
from __future__ import annotations

import inspect
import os
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import pytest

_BACKGROUND = pytest.StashKey["Background"]()
_VERDICTS = pytest.StashKey[dict]()
#: called when the session ends, so that nothing a background function started outlives it
_STOPPERS: list[Callable[[], None]] = []


def on_session_end(stop: Callable[[], None]) -> Callable[[], None]:
    """Register `stop` (e.g. kill the VMs still running) for the end of the session (once)."""
    if stop not in _STOPPERS:
        _STOPPERS.append(stop)
    return stop


def _work_of(item: pytest.Item):
    """(function, lane, kwargs) of the item's background marker, or None."""
    marker = item.get_closest_marker("background")
    if marker is None:
        return None
    run = marker.kwargs["run"]
    params = getattr(item, "callspec", None)
    params = params.params if params else {}
    names = inspect.signature(run).parameters
    return run, marker.kwargs.get("lane", run.__name__), {k: v for k, v in params.items() if k in names}


class Background:
    """The session's background work, by test node id; one thread per lane."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self.lanes: dict[str, ThreadPoolExecutor] = {}
        self.jobs: dict[str, Future] = {}
        self.tmp = tmp_path_factory

    def start(self, item: pytest.Item) -> None:
        run, lane, kwargs = _work_of(item)
        pool = self.lanes.get(lane) or self.lanes.setdefault(
            lane, ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"background-{lane}"))
        # a name as pytest's tmp_path makes it (vng takes no `[` or `=` in --rwdir)
        out = self.tmp.mktemp(re.sub(r"[\W]", "_", item.name)[:30], numbered=True)
        self.jobs[item.nodeid] = pool.submit(run, out, **kwargs)

    def close(self) -> None:
        for job in self.jobs.values():
            job.cancel()                    # not started yet: never starts
        for stop in _STOPPERS:
            stop()                          # started: ends now
        for pool in self.lanes.values():
            pool.shutdown(wait=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "background(run, lane): the test's slow part, run(out, **params), "
                                       "starts when collection ends and runs beside the other tests "
                                       "(tests/background.py)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    later = [i for i in items if _work_of(i)]
    items[:] = [i for i in items if not _work_of(i)] + later


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    runs_no_test = any(getattr(config.option, o, False) for o in
                       ("collectonly", "setuponly", "setupplan", "showfixtures", "show_fixtures_per_test"))
    if runs_no_test or hasattr(config, "workerinput") or os.environ.get("AGENTCGROUP_BACKGROUND", "1") == "0":
        return
    items = [i for i in session.items if _work_of(i)]
    if items:
        background = config.stash[_BACKGROUND] = Background(config._tmp_path_factory)
        for item in items:
            background.start(item)


def pytest_sessionfinish(session: pytest.Session) -> None:
    background = session.config.stash.get(_BACKGROUND, None)
    if background is not None:
        background.close()


@pytest.fixture
def background_result(request: pytest.FixtureRequest, tmp_path: Path):
    """What this test's background function returned (run now where it did not run in the background)."""
    background = request.config.stash.get(_BACKGROUND, None)
    job = background.jobs.get(request.node.nodeid) if background else None
    if job is not None:
        return job.result()
    run, _, kwargs = _work_of(request.node)
    return run(tmp_path, **kwargs)


def verdicts(config: pytest.Config, section: str) -> list[str]:
    """The verdict lines of `section` (one per VM, per bare machine...), printed at the session's end."""
    return config.stash.setdefault(_VERDICTS, {}).setdefault(section, [])


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    for section, lines in config.stash.get(_VERDICTS, {}).items():
        if lines:
            terminalreporter.section(section)
            for line in lines:
                terminalreporter.write_line(line)
