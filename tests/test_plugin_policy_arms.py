"""The policy arms (`agentcgroup`, its `bpf-soft` control) as ordinary arms of an experiment, end to
end in pytest subprocesses: per-step throttles in the results, the throttle budget, the skip where
eBPF is missing, and no BPF program of the run left loaded after a pass, a failure or Ctrl-C
(checked with bpftool, counting only programs the run's own process holds: other sessions on the
host may have theirs loaded)."""
from __future__ import annotations

import json
import signal
import textwrap
import time

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, our_cgroups, run_study, start_study, write_study
from pytest_agentcgroup.bpf import features
from pytest_agentcgroup.bpf.controller import NEEDS
from pytest_agentcgroup.bpf.loader import our_programs

POLICY_ARMS = """
[arms.agentcgroup]
policy = "agentcgroup"
memory_high_mb = 128
memory_max_mb = 512
[arms.agentcgroup.rules]
hold_ms = 20
raise_step_mb = 64
raise_max_mb = 384
freeze_after = 100
kill_after = 0
priorities = { default = "low" }
cpu_weight = { low = 25 }

[arms.bpf-soft]
policy = "agentcgroup"
memory_high_mb = 128
memory_max_mb = 512
rules = { ebpf = false }

[experiments.exp1.budgets.agentcgroup]
oom_kills = "predicted"
throttles = "predicted"
policy_kills = 0

[experiments.exp1.budgets.bpf-soft]
oom_kills = "predicted"
mem_high_events = "predicted"
throttles = 0
"""

# the run's own process reports, as late as it can (after the session's teardown), its pid and
# which of our programs it still holds
REPORT_HELD = """
import json, os
def pytest_unconfigure(config):
    from pytest_agentcgroup.bpf.loader import our_programs
    with open("held.json", "w") as f:
        json.dump({"pid": os.getpid(), "held": our_programs(held_by={os.getpid()})}, f)
"""


def ebpf_or_skip():
    why = features.missing(*NEEDS)
    if why:
        pytest.skip(why)


@pytest.fixture
def policy_project(pytester):
    config = write_study(pytester.path)             # step 1 peaks at 300 MiB
    config.write_text(config.read_text() + POLICY_ARMS)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    pytester.makeconftest(REPORT_HELD)
    return config


def left_behind(pytester, host):
    """What the finished run left: programs it held at its very end, and its cgroups (only the
    run's own: other sessions on the host make and remove theirs meanwhile)."""
    report = json.loads((pytester.path / "held.json").read_text())
    return report["held"] + our_cgroups(host, report["pid"])


@pytest.mark.slow
def test_policy_arms_run_as_arms_and_record_what_the_policy_did(pytester, policy_project):
    host = cgroups_or_skip()
    ebpf_or_skip()
    result = run_study(pytester, "-k", "agentcgroup or bpf-soft", "--benchmark-json", "bench.json")
    result.assert_outcomes(passed=2)
    lines = [json.loads(x) for x in (pytester.path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()]
    big = {r["config"]: r for r in lines if r["step_id"] == 1}
    # above the 128 MiB soft limit: throttled in the kernel and granted room, not killed ...
    assert big["agentcgroup"]["throttles"] >= 1 and big["agentcgroup"]["oom_kills"] == 0
    assert big["agentcgroup"]["priority"] == "low" and big["agentcgroup"]["exit_code"] == 0
    # the low priority's cpu weight is on the step's record where the run has the cpu controller
    assert big["agentcgroup"]["cpu_weight"] == (25 if "cpu" in host.controllers or host.mode != "v2" and "cpu" in host.v1
                                                else None), big["agentcgroup"]
    # ... while the control arm, with the same limits and no eBPF, only counts the breach
    assert big["bpf-soft"]["throttles"] == 0 and big["bpf-soft"]["mem_high_events"] >= 1
    assert big["bpf-soft"]["priority"] is None and big["bpf-soft"]["oom_kills"] == 0
    assert all(r["throttles"] == 0 for r in lines if r["step_id"] != 1)
    doc = json.loads((pytester.path / "bench.json").read_text())
    bench = {b["extra_info"]["arm"]: b["extra_info"] for b in doc["benchmarks"]}
    assert bench["agentcgroup"]["metrics"]["throttles_total"]["value"] >= 1
    # the run's controllers and what was left out, with why, in the environment and complete.json
    run_tree = doc["machine_info"]["agentcgroup"]["run_tree"]
    assert {"memory", "pids"} <= set(run_tree["controllers"]), run_tree
    complete = json.loads((pytester.path / "out" / "latest" / "complete.json").read_text())
    assert complete["run_tree"] == run_tree
    # a weight the rules gave but the step's cgroup could not take says why; a set one says nothing
    if big["agentcgroup"]["cpu_weight"] is None:
        assert "cpu" in run_tree["refused"] and big["agentcgroup"]["cpu_weight_missing"], (run_tree, big["agentcgroup"])
    else:
        assert "cpu_weight_missing" not in big["agentcgroup"]
    result.stdout.fnmatch_lines(["*agentcgroup summary*", "*throttled*policy kills*"])
    assert left_behind(pytester, host) == []


def test_a_throttle_budget_that_does_not_hold_fails_and_unloads(pytester, policy_project):
    host = cgroups_or_skip()
    ebpf_or_skip()
    text = policy_project.read_text().replace('throttles = "predicted"', "throttles = 0")
    policy_project.write_text(text)
    result = run_study(pytester, "-k", "agentcgroup")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*synthetic/oom-once step 1: throttles = *, budget <= 0 for the trace*"])
    assert left_behind(pytester, host) == []


def test_ctrl_c_during_the_policy_arm_unloads_its_program(pytester, policy_project):
    host = cgroups_or_skip()
    ebpf_or_skip()
    slow = policy_project.read_text().replace("time_scale = 1.0", "time_scale = 40.0")
    policy_project.write_text(slow)                 # 200 ms steps become 8 s: time to interrupt
    proc = start_study(pytester, "-k", "agentcgroup")
    deadline = time.monotonic() + 60
    while not our_programs(held_by={proc.pid}) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    if not our_programs(held_by={proc.pid}):
        proc.kill()
        raise AssertionError(f"the run never loaded its program: {proc.communicate()[0]}")
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert left_behind(pytester, host) == [], out   # unloaded by the run itself, before it exited


def test_without_ebpf_the_arm_skips_naming_the_feature(pytester, policy_project):
    """The host has eBPF; the feature probe is replaced (in the run's conftest) by one reporting the
    ring buffer missing, to check the skip message. The control arm needs no eBPF and still runs."""
    cgroups_or_skip()
    pytester.makeconftest(REPORT_HELD + textwrap.dedent("""
        from pytest_agentcgroup.bpf import features
        _real = features.probe()
        features.probe = lambda: {**_real, "ringbuf": (False, "BPF_MAP_TYPE_RINGBUF: EINVAL (test)")}
    """))
    result = run_study(pytester, "-k", "agentcgroup or bpf-soft", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*arm agentcgroup needs eBPF: ringbuf: BPF_MAP_TYPE_RINGBUF: EINVAL (test)*"])


@pytest.mark.slow
def test_resume_where_the_arm_cannot_run_keeps_its_earlier_results(pytester, policy_project):
    """A resumed run decides to skip before it drops anything: on a host (here: a probe made to
    say so) without eBPF the arm skips, and the lines an earlier run recorded for it stay."""
    cgroups_or_skip()
    ebpf_or_skip()
    run_study(pytester, "-k", "agentcgroup").assert_outcomes(passed=1)
    run = (pytester.path / "out" / "latest").resolve()
    metrics = run / "metrics.jsonl"
    # an interrupted earlier run: its last step's line never made it to the file, nor its end
    (run / "complete.json").unlink()
    earlier = metrics.read_text().splitlines()[:-1]
    metrics.write_text("\n".join(earlier) + "\n")
    pytester.makeconftest(REPORT_HELD + textwrap.dedent("""
        from pytest_agentcgroup.bpf import features
        _real = features.probe()
        features.probe = lambda: {**_real, "ringbuf": (False, "BPF_MAP_TYPE_RINGBUF: EINVAL (test)")}
    """))
    run_study(pytester, "-k", "agentcgroup", "--agentcgroup-resume").assert_outcomes(skipped=1)
    assert metrics.read_text().splitlines() == earlier
    assert (pytester.path / "out" / "latest").resolve() == run, "the resume continued the run, made no other"


TENANTS = '''
import threading
from pytest_agentcgroup.replay import make_executor, replay
from pytest_agentcgroup.traces.corpus import Corpus

def test_two_tenants(agentcgroup_placement, agentcgroup_tree):
    trace = Corpus.open("traces").load("synthetic/oom-once")
    a, b = agentcgroup_tree.workload("tenant-a"), agentcgroup_tree.workload("tenant-b")
    low = agentcgroup_placement("agentcgroup", a)                                 # by step kind: low
    high = agentcgroup_placement("agentcgroup", b, kind_of=lambda step: "tenant-b")
    out = {}
    def run(name, placement):
        out[name] = replay(trace, make_executor("emulate", time_scale=1.0, step_timeout_s=60), placement)
    threads = [threading.Thread(target=run, args=x) for x in (("a", low), ("b", high))]
    for t in threads: t.start()
    for t in threads: t.join()
    assert out["a"][1].counters["throttles"] >= 1 and out["a"][1].exit_code == 0
    assert out["b"][1].counters["priority"] == "high" and out["b"][1].counters["throttles"] == 0
'''


@pytest.mark.slow
def test_placements_built_by_a_test_share_the_arms_controller(pytester, policy_project):
    """The API other experiments use (several tenants under one arm, concurrently)."""
    host = cgroups_or_skip()
    ebpf_or_skip()
    policy_project.write_text(policy_project.read_text().replace(
        'priorities = { default = "low" }', 'priorities = { default = "low", tenant-b = "high" }'))
    pytester.makepyfile(test_tenants=TENANTS)
    result = run_study(pytester, "test_tenants.py")
    result.assert_outcomes(passed=1)
    assert left_behind(pytester, host) == []


# the plugin's bcc loader reads the programs from a directory where reclaim_throttle does not compile
BROKEN_PROGRAM = """
from pathlib import Path
import pytest_agentcgroup.bpf.loader as loader
broken = Path(__file__).parent / "broken-bpf"
broken.mkdir(exist_ok=True)
(broken / "reclaim_throttle.bpf.c").write_text("int agcg_thr_reclaim(void *ctx) { return not_declared_here; }\\n")
loader.BPF_DIR = broken
"""


def test_a_policy_program_that_does_not_compile_fails_the_arm_never_skips(pytester, policy_project):
    """A missing kernel feature skips; our own program failing to build is an error of every test
    of the arm, naming the program and what clang said (compiled once, not per test)."""
    cgroups_or_skip()
    ebpf_or_skip()
    pytester.makeconftest(REPORT_HELD + BROKEN_PROGRAM)
    with open(pytester.path / "study.toml", "a") as f:       # a second trace x arm of the same arm
        f.write('\n[experiments.exp1.matrix]\nseeds = [0, 1]\n')
    result = run_study(pytester, "--agentcgroup-arms", "agentcgroup", "-rs")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*arm agentcgroup: cannot compile reclaim_throttle.bpf.c*",
                                 "*use of undeclared identifier 'not_declared_here'*"])
    assert "skipped" not in result.stdout.str().splitlines()[-1]


def test_without_kernel_headers_the_arm_skips_naming_them_and_the_fix(pytester, policy_project, monkeypatch):
    """No mock: bcc reads the kernel headers from BCC_KERNEL_SOURCE when set, and here it names a
    directory that does not exist, as on a host where `make setup` never linked them. The policy
    arm must skip naming that directory and `make setup` (it used to fail as a compile error)."""
    cgroups_or_skip()
    monkeypatch.setenv("BCC_KERNEL_SOURCE", str(pytester.path / "no-headers"))
    result = run_study(pytester, "-k", "agentcgroup or bpf-soft", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([f"*arm agentcgroup needs eBPF: kernel_headers: kernel headers "
                                 f"{pytester.path / 'no-headers'} missing*make setup*"])
