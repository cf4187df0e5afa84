"""One verdict line per bare-Debian machine, printed at the end of the session (tests/background.py).
What runs in a bare root runs through kernels/vmharness.run_killable, which the session's end stops."""
from __future__ import annotations

import pytest
from background import on_session_end, verdicts
from kernels import vmharness

on_session_end(vmharness.kill_running)


@pytest.fixture
def bare_debian_verdicts(request: pytest.FixtureRequest) -> list[str]:
    return verdicts(request.config, "bare Debian set-up")
