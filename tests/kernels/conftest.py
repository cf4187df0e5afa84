"""Parametrizes the kernel tests over the series chosen with --agentcgroup-kernels (the option is
registered in tests/conftest.py, which pytest loads before it parses the command line) and prints
one verdict line per booted kernel at the end of the session. The boots run in the background
(tests/background.py: the subsets one kernel at a time in lane "vm", the delegated user's boot
beside them in lane "vm-delegated"); a session that ends first kills them.
"""
from __future__ import annotations

import pytest
from background import on_session_end, verdicts

from . import vmharness

on_session_end(vmharness.kill_running)


def selected_series(config: pytest.Config) -> list[str]:
    value = config.getoption("agentcgroup_kernels")
    if value.strip() == "all":
        return list(vmharness.SERIES)
    chosen = [s.strip() for s in value.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in vmharness.SERIES]
    if unknown or not chosen:
        raise pytest.UsageError(f"--agentcgroup-kernels: unknown series {unknown or value!r} "
                                f"(known: {', '.join(vmharness.SERIES)}, or all)")
    return chosen


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kernel_series" in metafunc.fixturenames:
        metafunc.parametrize("kernel_series", selected_series(metafunc.config))


@pytest.fixture
def kernel_verdicts(request: pytest.FixtureRequest) -> list[str]:
    return verdicts(request.config, "pure cgroup v2 kernels")
