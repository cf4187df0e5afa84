"""The plugin end to end, in pytest subprocesses: parametrization and selection, benchmark JSON,
the results directory, exact OOM counting, budget failures, clean-up after every way a run ends,
and clear skips without privileges."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, leaked, our_cgroups, run_study, start_study, write_study


def test_every_trace_and_arm_is_a_test_with_stable_ids(pytester, project):
    result = run_study(pytester, "--collect-only", "-q")
    ids = sorted(line for line in result.outlines if "::" in line)
    assert ids == sorted(f"test_exp1.py::test_exp1[{arm}:oom-once]"
                         for arm in ("unlimited", "static-env", "static-toolcall", "static-high"))


def test_a_recorded_copy_and_its_original_get_ids_with_their_family():
    """Two traces of the corpus with one id in two families (a recorded copy and its 1 Hz original)
    keep their families in the test id, whichever of them a run selects: never pytest's _0/_1
    suffixes, and the same id in every run."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "pytest", "experiments/test_exp1_domain_mismatch.py", "--collect-only",
                          "-q", "-p", "no:cacheprovider", "--agentcgroup-arms", "unlimited", "--agentcgroup-subset",
                          ",".join(["claude-code/haiku/xonsh__xonsh-3255", "claude-code/local/xonsh__xonsh-3255",
                                   "claude-code/local/numba__numba-5721", "claude-code/local/AI4S2S__lilio-49",
                                   "claude-code/local/Azure__azure-cli-2844",
                                   "claude-code-recorded/haiku/xonsh__xonsh-3255", "smoke"])],
                         cwd=root, capture_output=True, text=True, timeout=120)
    ids = [line.split("[", 1)[1].rstrip("]") for line in out.stdout.splitlines() if "::test_exp1[" in line]
    assert "unlimited:claude-code-recorded/haiku/xonsh__xonsh-3255" in ids, out.stdout + out.stderr
    assert "unlimited:claude-code/haiku/xonsh__xonsh-3255" in ids
    # a run of one of them alone names it the same way; a trace without a copy keeps the short id
    assert "unlimited:claude-code/local/numba__numba-5721" in ids and "unlimited:claude-code/local/pydicom__pydicom-2065" in ids
    assert "unlimited:haiku/libp2p__py-libp2p-533" in ids
    assert not [i for i in ids if i[-2:] in ("_0", "_1")] and len(ids) == len(set(ids)) == 10


@pytest.mark.slow
def test_marker_expression_and_keyword_select_the_experiment(pytester, project):
    pytester.makepyfile(test_other='import pytest\n@pytest.mark.experiment(name="exp10")\ndef test_exp10():\n    pass\n')
    by_marker = run_study(pytester, "--collect-only", "-q", "-m", "experiment(name='exp1')")
    assert sum("test_exp1[" in line for line in by_marker.outlines) == 4
    assert not any("test_exp10" in line for line in by_marker.outlines)
    by_arm = run_study(pytester, "--collect-only", "-q", "-k", "static-toolcall")
    assert [line for line in by_arm.outlines if "::" in line] == ["test_exp1.py::test_exp1[static-toolcall:oom-once]"]


@pytest.mark.slow
def test_run_writes_results_and_benchmark_json_and_counts_the_oom_once(pytester, project, monkeypatch):
    host = cgroups_or_skip()
    # Under `-n N` this runs in an xdist worker, whose PYTEST_XDIST_WORKER the pytest below inherits;
    # pytest-benchmark reads that variable, takes itself for a worker and writes no --benchmark-json.
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    result = run_study(pytester, "--benchmark-json", "bench.json")
    result.assert_outcomes(passed=4)
    bench = json.loads((pytester.path / "bench.json").read_text())
    by_arm = {b["extra_info"]["arm"]: b for b in bench["benchmarks"]}
    assert set(by_arm) == {"unlimited", "static-env", "static-toolcall", "static-high"}
    assert by_arm["static-toolcall"]["extra_info"]["oom_kills"] == 1
    assert by_arm["unlimited"]["extra_info"]["oom_kills"] == 0
    oom = by_arm["static-toolcall"]["extra_info"]["metrics"]["oom_kills"]
    assert oom["unit"] == "count" and oom["better"] == "lower" and oom["provenance"] == "derived"  # the steps' sum
    assert oom["source"].startswith("sum of oom_kills")
    assert by_arm["static-toolcall"]["name"] == "test_exp1[static-toolcall:oom-once]"

    lines = [json.loads(x) for x in (pytester.path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 4 * 4
    design = {"trace_id", "step_id", "tool", "cmd", "latency_ms", "cpu_ms", "max_rss_mb", "mem_high_events",
              "config", "mem_max_events", "oom_kills", "exit_code", "profile_source"}
    assert design <= set(lines[0])
    killed = [(r["config"], r["step_id"]) for r in lines if r["oom_kills"]]
    assert sorted(killed) == [("static-env", 1), ("static-toolcall", 1)]
    assert all(r["signal"] == 9 for r in lines if r["oom_kills"]), "the kernel count and the exit signal disagree"
    summary = {s["config"]: s for s in json.loads((pytester.path / "out" / "latest" / "summary.json").read_text())}
    assert summary["static-toolcall"]["oom_kills"] == 1 and summary["unlimited"]["oom_kills"] == 0
    assert summary["static-high"]["mem_high_events_total"] >= 1 and summary["static-high"]["oom_kills"] == 0
    for key in ("config", "traces", "total_steps", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms",
                "mem_high_events_total", "oom_kills"):
        assert key in summary["unlimited"]
    # each record says what its limit reserved and what the step used; the summary and the
    # benchmark JSON carry the sums (time_scale 1 here: recorded-equivalent s = replay s)
    for r in lines:
        if r["config"] == "static-toolcall":
            assert r["reserved_basis"] == "hard limit" and r["usage_samples"] >= 1, r
            held = r["replayed_duration_ms"] / 1000          # the trace's duration (time_scale 1)
            assert r["time_basis"] == "recorded" and r["step_time_s"] == pytest.approx(held), r
            assert r["reserved_gib_s"] == pytest.approx(128 * held / 1024, rel=1e-3, abs=1e-5), r
    big = next(r for r in lines if r["config"] == "unlimited" and r["step_id"] == 1)      # 300 MiB for 200 ms
    assert big["reserved_basis"] == "trace peak" and 0.25 * 300 * 0.2 / 1024 <= big["used_gib_s"] <= big["reserved_gib_s"], big
    reserved = by_arm["static-toolcall"]["extra_info"]["metrics"]["reserved_gib_s"]
    assert reserved["unit"] == "GiB·s" and reserved["provenance"] == "derived" and reserved["value"] > 0
    assert summary["unlimited"]["reserved_gib_s"] > 0 and 0 < summary["unlimited"]["utilization"] <= 1
    result.stdout.fnmatch_lines(["*agentcgroup summary*", "*static-toolcall*1*"])
    assert leaked(host) == []


def test_a_broken_budget_fails_naming_trace_step_counter_and_budget(pytester, project):
    cgroups_or_skip()
    text = (pytester.path / "study.toml").read_text()
    # claim no OOM kill under the per-step limit, which the 300 MiB step breaks
    text += '[experiments.exp1.budgets.static-env]\noom_kills = 0\n'
    (pytester.path / "study.toml").write_text(text)
    result = run_study(pytester, "-k", "static-env")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*exp1 under arm static-env: 1 budget violation*",
                                 "*synthetic/oom-once step 1: oom_kills = 1, budget <= 0 for the trace*"])
    assert "Traceback" not in result.stdout.str()


def test_a_trace_with_nothing_to_replay_fails_naming_it_and_where_profiles_come_from(pytester):
    """A user's own trajectory converted and selected as it is (mini-swe-agent: no step carries a
    profile), replayed under the emulate executor: nothing is replayed, so its test fails naming
    the trace's file and the ways to profiles, whatever its budget says. A copy with one profiled
    step is a partial replay and passes."""
    from dataclasses import replace
    from pytest_agentcgroup import cli
    from pytest_agentcgroup.traces.ir import Measure, Profile, read_traces, write_trace
    host = cgroups_or_skip()
    src = Path(__file__).parent / "data" / "mini-swe-agent" / "django__django-16255.traj.json"
    assert cli.main(["traces", "convert", str(src), "-o", str(pytester.path / "converted")]) == 0
    (path,) = (pytester.path / "converted").rglob("*.json")
    (mine,) = read_traces(path)
    assert all(s.profile.provenance() == "none" for s in mine.steps)
    one = replace(mine.steps[0], profile=Profile(peak_mb=Measure(8.0, "synthetic")))
    write_trace(replace(mine, trace_id="mine/one-profiled", steps=(one, *mine.steps[1:])), path.with_name("one.json"))
    assert cli.main(["traces", "select", str(pytester.path / "converted"), "-o", str(pytester.path / "mine")]) == 0
    (pytester.path / "study.toml").write_text('traces = "mine"\n[arms.unlimited]\n[experiments.exp1]\nsubset = "full"\n'
                                              '[experiments.exp1.budgets.unlimited]\noom_kills = 0\n')
    pytester.makepyfile(test_exp1=EXP_MODULE)
    result = run_study(pytester, "-rf")
    result.assert_outcomes(passed=1, failed=1)
    file = pytester.path / "mine" / "traces" / "mini-swe-agent_django__django-16255.json"
    result.stdout.fnmatch_lines([
        f"{file}: trace mini-swe-agent/django__django-16255 has nothing to replay under the emulate executor: none "
        f"of its {len(mine.steps)} executed step(s) has a profile (profile_source none), so exp1 under arm unlimited "
        "measured nothing. Give its steps profiles with `agentcgroup traces profile` in the task's workspace, or "
        "run its real commands with --agentcgroup-executor sandbox",
        "*FAILED test_exp1.py::test_exp1[[]unlimited:django__django-16255[]]*"])
    assert "Traceback" not in result.stdout.str()
    assert leaked(host) == []


def test_bad_config_is_one_clear_message(pytester, project):
    (pytester.path / "study.toml").write_text((pytester.path / "study.toml").read_text().replace(
        "memory_max_mb = 128", "memory_max_mb = -5", 1))
    result = run_study(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED       # a collection error stops the run
    result.stdout.fnmatch_lines(["*study.toml: arms.static-env.memory_max_mb: expected a positive number, got -5*"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_failing_run_leaves_no_cgroup(pytester, project):
    host = cgroups_or_skip()
    pytester.makepyfile(test_exp1=EXP_MODULE + "\n    assert False, 'deliberate'\n")
    result = run_study(pytester, "-k", "unlimited")
    result.assert_outcomes(failed=1)
    assert leaked(host) == []


def _wait_for_cgroup(host, pid, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if our_cgroups(host, pid):
            return
        time.sleep(0.05)
    raise AssertionError("the run never created its cgroups")


@pytest.fixture
def slow_project(pytester):
    write_study(pytester.path, peaks=(20, 20, 20))
    text = (pytester.path / "study.toml").read_text().replace("time_scale = 1.0", "time_scale = 40.0")
    (pytester.path / "study.toml").write_text(text)        # 200 ms steps become 8 s: time to interrupt
    pytester.makepyfile(test_exp1=EXP_MODULE)


def test_ctrl_c_leaves_no_cgroup(pytester, slow_project):
    host = cgroups_or_skip()
    proc = start_study(pytester, "-k", "unlimited")
    _wait_for_cgroup(host, proc.pid)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert our_cgroups(host, proc.pid) == [], out
    # every step that finished before the interrupt is on disk
    assert (pytester.path / "out" / "latest" / "metrics.jsonl").exists()


def test_kill_9_leftovers_are_removed_by_the_next_run(pytester, slow_project):
    host = cgroups_or_skip()
    proc = start_study(pytester, "-k", "unlimited")
    _wait_for_cgroup(host, proc.pid)
    time.sleep(0.5)
    proc.kill()
    proc.communicate(timeout=30)
    assert our_cgroups(host, proc.pid), "kill -9 cannot clean up: the run root must still be there"
    text = (pytester.path / "study.toml").read_text().replace("time_scale = 40.0", "time_scale = 0.01")
    (pytester.path / "study.toml").write_text(text)
    rerun = start_study(pytester, "-k", "unlimited")
    out, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, out
    assert our_cgroups(host, proc.pid) == [], "the new run did not sweep the killed run's cgroups"
    assert our_cgroups(host, rerun.pid) == [], out


@pytest.mark.root
def test_without_root_the_run_skips_with_the_reason():
    if os.geteuid() != 0:
        pytest.skip("this test drops root privileges, so it must start as root")
    for tool in ("/usr/bin/setpriv", "/usr/bin/python3"):
        if not Path(tool).exists():
            pytest.skip(f"{tool} is needed to run the study as nobody")
    # nobody cannot read the venv's interpreter under /root; Debian's python3 (same 3.11 ABI) runs
    # the same pure-Python packages from the venv's site-packages. pytest's tmp dirs are root-only,
    # so the study goes into a world-readable directory of its own.
    site = next(Path(sys.prefix).glob("lib/python3*/site-packages"))
    repo = Path(__file__).resolve().parents[1]
    work = Path(tempfile.mkdtemp(prefix="agentcgroup-nonroot-"))
    try:
        write_study(work)
        (work / "test_exp1.py").write_text(EXP_MODULE)
        for p in [work, *work.rglob("*")]:
            os.chmod(p, 0o777 if p.is_dir() else 0o666)
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{repo}:{site}", "HOME": str(work)}
        proc = subprocess.run(["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               "/usr/bin/python3", "-m", "pytest",
                               "-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                               "--agentcgroup-out", "out", "-rs"],
                              cwd=work, env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "4 skipped" in out, out
    assert "cgroups unavailable: cannot create cgroups under" in out and "needs root" in out, out
    assert "Traceback" not in out


@pytest.mark.slow
def test_settings_precedence_option_over_marker_over_ini(pytester, project):
    # ini names a subset that does not exist: collection must say so, naming the value
    pytester.makeini("[pytest]\nagentcgroup_subset = no-such-subset\n")
    result = run_study(pytester, "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*'no-such-subset' is neither a subset*"])
    # the marker keyword beats the ini
    pytester.makepyfile(test_exp1=EXP_MODULE.replace('name="exp1")', 'name="exp1", arms="unlimited", subset="smoke")'))
    result = run_study(pytester, "--collect-only", "-q")
    assert [line for line in result.outlines if "::" in line] == ["test_exp1.py::test_exp1[unlimited:oom-once]"]
    # the command line beats the marker
    result = run_study(pytester, "--collect-only", "-q", "--agentcgroup-arms", "static-high,static-env")
    assert [line for line in result.outlines if "::" in line] == [
        "test_exp1.py::test_exp1[static-high:oom-once]", "test_exp1.py::test_exp1[static-env:oom-once]"]
