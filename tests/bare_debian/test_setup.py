"""The README's set-up on a bare Debian machine, every run: a minbase root with only `make` (what the
README promises a user needs), this machine's network settings, a copy of the checkout; inside it,
as root, `make setup-vm` (the set-up `make test` does, a superset of `make run`'s), then the CLI on
the shipped corpus, the check that every program the project starts is on PATH, and a quick subset
of the tests. Set-up installs every package itself, or this fails: a machine that kept what earlier
work installed (this one) cannot show that.

Suites: bookworm (Debian 12, the machine's own release); AGENTCGROUP_BARE_SUITES=bookworm,trixie
adds Debian 13 (Python 3.13).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pytest_agentcgroup import programs
from pytest_agentcgroup.errors import ExecutorUnavailable

from .bareroot import BareRoot, Ran

SUITES = [s.strip() for s in os.environ.get("AGENTCGROUP_BARE_SUITES", "bookworm").split(",") if s.strip()]
#: what runs in the bare root, in order, each with its time limit (s): one failing stops the rest
STEPS = (
    ("set-up", "make setup-vm", 1800),
    ("CLI on the shipped corpus", ".venv/bin/agentcgroup traces validate traces", 300),
    ("every program the project starts", ".venv/bin/agentcgroup doctor core docker browser vm", 120),
    ("quick tests", ".venv/bin/python -m pytest -q -p no:cacheprovider -m 'not root and not docker and not vm' "
                    "tests/test_ir.py tests/test_config.py tests/test_cli.py tests/test_emulator_build.py "
                    "tests/test_apt_sources.py tests/test_programs.py", 900),
)

pytestmark = [pytest.mark.slow, pytest.mark.network, pytest.mark.root]


def set_up_bare(out: Path, suite: str) -> list[Ran]:
    """Make the bare machine and run STEPS in it until one fails (in the background: tests/background.py)."""
    if os.geteuid() != 0:
        pytest.skip("the bare-Debian set-up test needs root (it installs packages into a root of its own)")
    for program in ("bwrap", "debootstrap"):
        try:
            programs.require(program, needed_by="the bare-Debian set-up test")
        except ExecutorUnavailable as exc:
            pytest.fail(str(exc), pytrace=False)
    machine = BareRoot.make(suite, out / "root")
    done = []
    try:
        for i, (what, script, limit) in enumerate(STEPS):
            done.append(machine.run(script, out / f"{i}-{what.split()[0]}.log", limit, what=what))
            if done[-1].rc != 0:
                break
    finally:
        shutil.rmtree(machine.root, ignore_errors=True)     # ~2 GB; the logs stay in `out`
    return done


@pytest.mark.parametrize("suite", SUITES)
@pytest.mark.background(run=set_up_bare, lane="bare-debian")
def test_readme_setup_on_bare_debian(suite: str, background_result: list[Ran], bare_debian_verdicts: list[str]):
    steps = background_result
    bare_debian_verdicts.append(f"bare {suite}: " + "; ".join(r.summary() for r in steps))
    problems = [r.problem() for r in steps if r.problem()]
    assert not problems, f"bare {suite}: " + "\n".join(problems)
    assert len(steps) == len(STEPS), f"bare {suite}: only {len(steps)} of {len(STEPS)} steps ran"
