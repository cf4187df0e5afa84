"""pytest-agentcgroup: every trace × arm of an experiment is a test that replays the trace in real
per-step cgroups, checks the experiment's budgets, and reports its metrics through pytest-benchmark.

This module only registers: the hooks below hand over to the harness (pytest_agentcgroup/harness/,
split by role as pytest-xdist splits plugin / dsession / remote), and the fixtures are imported
here so that pytest finds them in this plugin:

    settings.py    every setting (option > marker > ini > config file > default: `setting()`)
    collect.py     trace × arm × matrix parametrization, stable ids (Case)
    fixtures.py    run tree, workload cgroup, placements, executors, policies; owns every teardown
    session.py     per process: the results store, what a worker's reports carry, the end of session
    controller.py  the controller: the run directory, merged worker results, benchmark JSON, gate
    state.py       the session state and stash keys they share

and procedures/study.py the `agentcgroup_study` fixture: a study's test runs its kind's procedure.

Settings: see harness/settings.py (or `pytest --help`, group "agentcgroup").
May import: the harness and procedures (and through them everything below). Nothing in the package
imports plugin.py.
"""
from __future__ import annotations

import pytest

from .harness import collect, fixtures, settings
from .harness import session as harness_session
# pytest finds a plugin's fixtures among the module's names: these are the plugin's fixtures
from .harness.fixtures import (agentcgroup_docker, agentcgroup_placement, agentcgroup_policies,  # noqa: F401
                               agentcgroup_replayer, agentcgroup_run, agentcgroup_trace, agentcgroup_tree,
                               step_cgroups, workload_cgroup)
from .harness.state import STATE
from .procedures.study import agentcgroup_study  # noqa: F401  (the fixture of every kind of study's test)


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "experiment(name, subset=None, arms=None): an agentcgroup experiment; its test is "
        "parametrized over the experiment's traces x arms (select with -m \"experiment(name='exp1')\")")
    harness_session.configure(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    collect.generate_tests(metafunc)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    collect.select_shard(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    report = yield
    harness_session.mark_report(item, call, report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session):
    """After the last test (xdist: every worker's), before the session's exit status is decided:
    the claims comparing arms, as test reports of their own."""
    result = yield
    harness_session.check_claims(session)
    return result


@pytest.hookimpl(trylast=True)    # after pytest's own session teardown of fixtures
def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    try:
        fixtures.close_session(state)    # a session interrupted before fixture teardown
    finally:                             # whatever closing raised: the results are kept and merged
        harness_session.finish(session, state)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    harness_session.terminal_summary(terminalreporter, config)
