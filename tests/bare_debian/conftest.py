"""One verdict line per bare-Debian machine at the end of the session. What runs in a bare root
runs through kernels/vmharness.run_killable, which the session's end stops."""
from __future__ import annotations

import pytest
from background import on_session_end
from kernels import vmharness

_VERDICTS = pytest.StashKey[list]()
on_session_end(vmharness.kill_running)


@pytest.fixture
def bare_debian_verdicts(request: pytest.FixtureRequest) -> list[str]:
    return request.config.stash.setdefault(_VERDICTS, [])


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    verdicts = config.stash.get(_VERDICTS, [])
    if verdicts:
        terminalreporter.section("bare Debian set-up")
        for line in verdicts:
            terminalreporter.write_line(line)
