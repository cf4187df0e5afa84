"""Shared fixtures for the plugin's own tests: a tiny synthetic study (corpus + config) on disk."""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from pytest_agentcgroup.cgroups import CgroupUnavailable, RunTree, detect

pytest_plugins = ["pytester", "background"]


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here rather than in tests/kernels/conftest.py: pytest parses the command line before it
    # collects that directory, so only a conftest at the tests' root can add an option.
    parser.addoption("--agentcgroup-kernels", default="6.12",
                     help="kernel series tests/kernels/ boots with pure cgroup v2: comma-separated "
                          "(6.1, 6.12, 7.3) or `all`; default 6.12")

REPO = Path(__file__).resolve().parents[1]


def synthetic_step(step_id: int, peak_mb: float | None, duration_ms: float, tool: str = "bash", cmd: str = "true"):
    step = {"step_id": step_id, "tool": tool, "args": {"command": cmd} if tool == "bash" else {},
            "duration_ms": {"value": duration_ms, "provenance": "synthetic"}}
    if peak_mb is not None:
        step["profile"] = {"peak_mb": {"value": peak_mb, "provenance": "synthetic"},
                           "ramp_ms": {"value": duration_ms / 2, "provenance": "synthetic"}}
    return step


def write_study(root: Path, *, limit_mb: int = 128, high_mb: int = 128, peaks=(20, 300, 30)) -> Path:
    """A corpus with one synthetic trace whose step 1 (300 MiB) exceeds the per-step limit, and a
    config with the four arms. Returns the config path."""
    traces = root / "traces"
    traces.mkdir(parents=True)
    steps = [synthetic_step(i, p, 200) for i, p in enumerate(peaks)]
    steps.append(synthetic_step(len(steps), None, 0, tool="noop"))
    trace = {"schema": "agentcgroup-trace/1", "trace_id": "synthetic/oom-once",
             "source": {"format": "synthetic", "note": "made by tests/conftest.py"}, "steps": steps}
    (traces / "oom-once.json").write_text(json.dumps(trace))
    (traces / "manifest.json").write_text(json.dumps({
        "schema": "agentcgroup-manifest/1",
        "subsets": {"smoke": ["synthetic/oom-once"]},
        "traces": [{"trace_id": "synthetic/oom-once", "file": "oom-once.json"}]}))
    config = root / "study.toml"
    config.write_text(textwrap.dedent(f"""
        traces = "traces"
        [defaults]
        time_scale = 1.0
        [arms.unlimited]
        [arms.static-env]
        scope = "trace"
        memory_max_mb = {limit_mb}
        [arms.static-toolcall]
        memory_max_mb = {limit_mb}
        [arms.static-high]
        memory_high_mb = {high_mb}
        [experiments.exp1]
        subset = "smoke"
        [experiments.exp1.budgets.unlimited]
        oom_kills = 0
        [experiments.exp1.budgets.static-toolcall]
        oom_kills = "predicted"
        [experiments.exp1.budgets.static-high]
        oom_kills = 0
        mem_high_events = "predicted"
    """))
    return config


EXP_MODULE = '''
import pytest
pytestmark = pytest.mark.experiment(name="exp1")

def test_exp1(agentcgroup_run):
    outcome = agentcgroup_run()
    outcome.assert_within_budget()
'''


@pytest.fixture
def study(tmp_path: Path) -> Path:
    return write_study(tmp_path)


def cgroups_or_skip():
    """The host's cgroup layout, or a skip naming what stops us from creating cgroups."""
    try:
        host = detect()
    except CgroupUnavailable as exc:
        pytest.skip(f"cgroups unavailable: {exc}")
    if not os.access(host.unified, os.W_OK):
        pytest.skip(f"cannot create cgroups under {host.unified} (not root, not delegated)")
    return host


@pytest.fixture
def tree():
    """A run tree of this test's own, removed after it (skips where cgroups cannot be made)."""
    try:
        t = RunTree(detect())
    except CgroupUnavailable as exc:
        pytest.skip(f"cgroups unavailable: {exc}")
    yield t
    t.close()


def step_rec(trace_id: str = "t/a", config: str = "unlimited", step_id: int = 0, **fields) -> dict:
    """A metrics.jsonl record as metrics/records.py writes it, with `fields` overriding."""
    return {"experiment": "exp1", "trace_id": trace_id, "step_id": step_id, "tool": "bash", "cmd": "true",
            "config": config, "executor": "emulate", "executed": True, "latency_ms": 10.0, "cpu_ms": 1.0,
            "max_rss_mb": 5.0, "mem_high_events": 0, "mem_max_events": 0, "oom_kills": 0, "exit_code": 0,
            "signal": None, "timed_out": False, "profile_source": "synthetic", "replayed_duration_ms": 10.0,
            "replayed_peak_mb": 5.0, **fields}


def write_results(directory: Path, records: list[dict]) -> Path:
    """A results directory holding `records` as metrics.jsonl."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return directory


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory):
    """One scratch folder per converter test module for the files its fuzz tests write."""
    return tmp_path_factory.mktemp("fuzz")
