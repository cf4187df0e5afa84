"""Plain helpers the plugin's own tests share: a tiny synthetic study (corpus + config) on disk,
metrics records, the cgroups skip, and the pytest subprocesses of a study with their leak checks.

Fixtures live in tests/conftest.py; this is an ordinary module, importable as `helpers` because
pytest (import mode prepend, tests/ has no __init__.py) puts tests/ on sys.path, as it does for
recording.py and converter_checks.py. No test module imports another test module."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_agentcgroup.cgroups import CgroupUnavailable, detect
from pytest_agentcgroup.cgroups.tree import PREFIX, live_run_roots
from pytest_agentcgroup.workspaces.lock import RegistryUnreachable

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
             "source": {"format": "synthetic", "note": "made by tests/helpers.py"}, "steps": steps}
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


def cgroups_or_skip():
    """The host's cgroup layout, or a skip naming what stops us from creating cgroups."""
    try:
        host = detect()
    except CgroupUnavailable as exc:
        pytest.skip(f"cgroups unavailable: {exc}")
    if not os.access(host.unified, os.W_OK):
        pytest.skip(f"cannot create cgroups under {host.unified} (not root, not delegated)")
    return host


@contextmanager
def registry_or_skip():
    """A workspace locked or built inside: the test skips, naming what it could not reach, when the
    network failed (RegistryUnreachable); any other WorkspaceError fails it with its message."""
    try:
        yield
    except RegistryUnreachable as exc:
        pytest.skip(f"{exc.registry} unreachable: {exc}")


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


# The run roots of pytests that tests SIGKILLed on purpose (tests/test_resume.py): they stay until a
# later run clears them, and under xdist a test running beside it must not count them as its leak.
# Names carry the maker's start time, so an entry never matches a later process's root. One file
# per user: another user's (root's) would not be ours to append to.
KILLED_ON_PURPOSE = Path(tempfile.gettempdir()) / f"agentcgroup-tests-killed-on-purpose-{os.getuid()}"


def killed_on_purpose(host, pid: int) -> None:
    """Note the run roots of `pid`, about to be SIGKILLed, before the kill (so no neighbour sees them unnoted)."""
    with KILLED_ON_PURPOSE.open("a") as f:
        f.writelines(f"{p.name}\n" for p in our_cgroups(host, pid))


def leaked(host) -> list[Path]:
    """Run roots whose maker has exited: what a finished run left behind (runs of other live
    processes, e.g. a parallel session, are not ours to judge, nor runs killed on purpose)."""
    spared = set(KILLED_ON_PURPOSE.read_text().split()) if KILLED_ON_PURPOSE.exists() else set()
    ours = our_cgroups(host)        # listed first: a root made after it is not judged, not flagged
    live = {p for d in (host.unified, *host.v1.values()) for p in live_run_roots(d)}   # maker's pid and start
    return [p for p in ours if p.name not in spared and p not in live and p.exists()]


def our_cgroups(host, pid: int | None = None) -> list[Path]:
    dirs = [host.unified, *host.v1.values()]
    return [p for d in dirs for p in d.iterdir()
            if p.name.startswith(PREFIX) and (pid is None or p.name.startswith(f"{PREFIX}{pid}-"))]


def run_study(pytester, *args):
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                         "--agentcgroup-out", "out", *args)


def start_study(pytester, *args):
    """The study of `project` in a pytest subprocess, left running (to be interrupted or killed)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--agentcgroup-config",
                             "study.toml", "--agentcgroup-out", "out", *args], cwd=pytester.path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            # a shell that started us in the background ignores SIGINT; undo that
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def git_workspace(root: Path) -> Path:
    """A small git repository at root/repo (one commit of a buggy calc.py): an agent's workspace."""
    repo = root / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    identity = ["-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "init"]):
        subprocess.run(["git", *identity, *args], cwd=repo, check=True)
    return repo
