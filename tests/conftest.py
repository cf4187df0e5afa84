"""Shared fixtures for the plugin's own tests (the plain helpers are in tests/helpers.py: import
them from there, never from this file or from another test module)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, write_study
from pytest_agentcgroup.cgroups import CgroupUnavailable, RunTree, detect

pytest_plugins = ["pytester", "background"]

# The markers of pyproject.toml, applied here from what a test uses (modules whose every test needs
# one carry it as `pytestmark`; the odd test needing root or the registries some other way, a
# decorator): a fixture in the test's closure, a helper its body calls, a parameter's value.
_MARKS_BY_FIXTURE = {
    "tree": ("root",),                       # a real run tree: cgroups
    "agentcgroup_tree": ("root",),
    # dockerd (started as root when none answers); the project's image is built with debootstrap
    # from the Debian mirror when it is missing (CI removes it first: make clean-images)
    "agentcgroup_docker": ("docker", "root", "network"),
    "can_profile": ("root",),                # test_profile*.py: cgroups and the sandbox's tmpfs
}
_MARKS_BY_CALL = {"cgroups_or_skip": ("root",)}
_MARKS_BY_PARAM = {("hostile", "docker"): ("docker", "network")}     # tests/hostile: the docker executor


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        code = getattr(getattr(item, "function", None), "__code__", None)
        called = set(code.co_names) if code is not None else set()
        params = getattr(getattr(item, "callspec", None), "params", {})
        marks = {m for f in names & _MARKS_BY_FIXTURE.keys() for m in _MARKS_BY_FIXTURE[f]}
        marks |= {m for c in called & _MARKS_BY_CALL.keys() for m in _MARKS_BY_CALL[c]}
        marks |= {m for (k, v), ms in _MARKS_BY_PARAM.items() if params.get(k) == v for m in ms}
        for m in sorted(marks - {mark.name for mark in item.iter_markers()}):
            item.add_marker(m)


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here rather than in tests/kernels/conftest.py: pytest parses the command line before it
    # collects that directory, so only a conftest at the tests' root can add an option.
    parser.addoption("--agentcgroup-kernels", default="6.12",
                     help="kernel series tests/kernels/ boots with pure cgroup v2: comma-separated "
                          "(6.1, 6.12, 7.3) or `all`; default 6.12")


@pytest.fixture
def can_profile():
    """Root (cgroups, the sandbox's bounded workspace) and bubblewrap, or a skip naming what is
    missing: what `agentcgroup traces profile` needs under the sandbox executor."""
    cgroups_or_skip()
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) not installed: `make setup` installs it")
    if os.geteuid() != 0:
        pytest.skip("the sandbox bounds its workspace (tmpfs) only as root")


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """A tiny synthetic study (helpers.write_study) in tmp_path; returns its config."""
    return write_study(tmp_path)


@pytest.fixture
def project(pytester: pytest.Pytester) -> Path:
    """The synthetic study and an exp1 test module in pytester's directory (run it with
    helpers.run_study); returns the config."""
    config = write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    return config


@pytest.fixture
def tree():
    """A run tree of this test's own, removed after it (skips where cgroups cannot be made)."""
    try:
        t = RunTree(detect())
    except CgroupUnavailable as exc:
        pytest.skip(f"cgroups unavailable: {exc}")
    yield t
    t.close()


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    """One scratch folder per converter test module for the files its fuzz tests write."""
    return tmp_path_factory.mktemp("fuzz")
