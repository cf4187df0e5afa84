"""The agentcgroup arm's controller on real cgroups: throttle -> resume, escalation to freeze and
kill, soft-limit raise for high-priority steps, and the bpf_soft control arm (no eBPF)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pytest_agentcgroup.bpf import features
from pytest_agentcgroup.arms import Rules
from pytest_agentcgroup.bpf.controller import NEEDS, Controller
from pytest_agentcgroup import proc as spawn

pytestmark = pytest.mark.root   # loads eBPF programs (and makes cgroups)

MB = 1 << 20

# allocate `rounds` bursts over the limit, each backed by a MADV_FREE cushion (no OOM kill)
ALLOC = """
import mmap, sys
MB = 1 << 20
for r in range(int(sys.argv[1])):
    c = mmap.mmap(-1, 32 * MB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(0, 32 * MB, 4096): c[i] = 1
    c.madvise(mmap.MADV_FREE)
    b = mmap.mmap(-1, 48 * MB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for i in range(0, 48 * MB, 4096): b[i] = 1
    b.close(); c.close()
"""


@pytest.fixture
def run_tree(request):
    """The shared `tree` fixture, once the BPF features these tests need are known to be here."""
    why = features.missing(*NEEDS)
    if why:
        pytest.skip(why)
    yield request.getfixturevalue("tree")
    from pytest_agentcgroup.bpf.loader import our_programs
    assert our_programs(held_by={os.getpid()}) == []


def start(cg, rounds):
    return spawn.start([sys.executable, "-c", ALLOC, str(rounds)], join=cg.join_files())


def drive(ctl, procs, timeout_s=120):
    # a hang guard, not a claim: in the emulated pure-v2 guest (tests/kernels) code runs ~10x slower,
    # and a throttled, resumed burst took 30-60 s there on a loaded host
    deadline = time.monotonic() + timeout_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        ctl.poll(timeout_ms=10)
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.slow
def test_low_priority_step_is_throttled_then_resumed(run_tree):
    rules = Rules.from_dict({"memory_max_mb": 64, "memory_high_mb": 48, "hold_ms": 50, "freeze_after": 100,
                             "priorities": {"test": "low", "default": "normal"}})
    with Controller(rules) as ctl:
        low, other = run_tree.workload("low", inner=False), run_tree.workload("other", inner=False)
        ctl.add_step(low, "test")
        ctl.add_step(other, "edit")
        p, q = start(low, 3), start(other, 1)
        drive(ctl, [p, q])
        assert p.returncode == 0 and q.returncode == 0
        what = [(a.cgroup_id, a.what) for a in ctl.actions]
        # every resume re-arms, and a burst still allocating reclaims again: >= 1 throttle per burst
        assert what.count((low.id, "throttle")) >= 3
        assert what.count((low.id, "resume")) == what.count((low.id, "throttle"))
        assert (other.id, "throttle") not in what


def test_escalates_to_freeze_then_kill(run_tree):
    rules = Rules.from_dict({"memory_max_mb": 64, "hold_ms": 20, "freeze_after": 2, "freeze_hold_ms": 100,
                             "kill_after": 2, "priorities": {"default": "low"}})
    with Controller(rules) as ctl:
        cg = run_tree.workload("bad", inner=False)
        ctl.add_step(cg)
        p = start(cg, 50)
        drive(ctl, [p])
        kinds = [a.what for a in ctl.actions]
        assert kinds[:5] == ["throttle", "resume", "throttle", "freeze", "thaw"], kinds
        assert kinds[-1] == "kill" and p.returncode == -9


@pytest.mark.slow
def test_hold_time_follows_the_replay_time_scale(run_tree):
    """One time rule: hold_ms is recorded time. A step replayed at time_scale 0.1 is held ~1/10 as
    long as one at 1.0, measured between the controller's own throttle and resume (same run)."""
    rules = Rules.from_dict({"memory_max_mb": 64, "memory_high_mb": 48, "hold_ms": 300, "freeze_after": 100,
                             "priorities": {"default": "low"}})
    with Controller(rules) as ctl:
        real, fast = run_tree.workload("real", inner=False), run_tree.workload("fast", inner=False)
        ctl.add_step(real, time_scale=1.0)
        ctl.add_step(fast, time_scale=0.1)
        procs = [start(real, 2), start(fast, 2)]
        drive(ctl, procs)
        assert all(p.returncode == 0 for p in procs)
        holds = {}
        for cg in (real, fast):
            acts = [a for a in ctl.actions if a.cgroup_id == cg.id and a.what in ("throttle", "resume")]
            pairs = zip(acts[::2], acts[1::2])
            holds[cg] = sorted((r.ts_ns - t.ts_ns) / 1e6 for t, r in pairs if (t.what, r.what) == ("throttle", "resume"))
        assert holds[real] and holds[fast], holds
        mid = {k: v[len(v) // 2] for k, v in holds.items()}
        print(f"hold_ms 300: median {mid[real]:.1f} ms at time_scale 1 ({len(holds[real])} holds), "
              f"{mid[fast]:.1f} ms at 0.1 ({len(holds[fast])} holds)")
        assert mid[real] >= 290, f"a 300 ms hold at time_scale 1 lasted {mid[real]:.1f} ms"
        assert mid[fast] < 100, f"a 300 ms hold at time_scale 0.1 lasted {mid[fast]:.1f} ms (30 ms expected)"
        assert mid[real] / mid[fast] > 5, f"holds {mid[real]:.1f} ms vs {mid[fast]:.1f} ms: not ~10x apart"


def test_high_priority_step_gets_more_room(run_tree):
    rules = Rules.from_dict({"memory_max_mb": 64, "memory_high_mb": 48, "raise_step_mb": 8, "raise_max_mb": 16,
                             "priorities": {"default": "high"}})
    with Controller(rules) as ctl:
        cg = run_tree.workload("hi", inner=False)
        ctl.add_step(cg)
        p = start(cg, 3)
        drive(ctl, [p])
        assert p.returncode == 0
        assert [a.detail for a in ctl.actions if a.what == "raise"] == ["soft limit -> 56 MB", "soft limit -> 64 MB"]


def test_bpf_soft_control_arm_sets_same_limits_without_ebpf(run_tree):
    raw = {"memory_max_mb": 64, "memory_high_mb": 48, "priorities": {"default": "low"}}
    with Controller(Rules.from_dict({**raw, "ebpf": False})) as ctl:
        assert ctl.throttle is None
        cg = run_tree.workload("soft", inner=False)
        ctl.add_step(cg)
        if cg.host.mode == "hybrid":
            assert int((cg.paths["memory"] / "memory.soft_limit_in_bytes").read_text()) == 48 * MB
        p = start(cg, 2)
        drive(ctl, [p])
        assert p.returncode == 0 and ctl.actions == []
        from pytest_agentcgroup.bpf.loader import our_programs
        assert our_programs(held_by={os.getpid()}) == []


def test_a_policy_arms_pids_max_reaches_each_step(tree):
    from pytest_agentcgroup.arms import Arm
    from pytest_agentcgroup.cgroups.placement import ArmPlacement
    from pytest_agentcgroup.traces.classify import step_kind
    from pytest_agentcgroup.traces.ir import Step
    arm = Arm.from_dict("soft-pids", {"policy": "agentcgroup", "memory_high_mb": 48, "pids_max": 7,
                                      "rules": {"ebpf": False}})
    with Controller(Rules.from_arm(arm)) as ctl:
        placement = ArmPlacement(arm, tree.workload("pids"), tree.controllers, policy=ctl, kind_of=step_kind)
        placement.begin_step(Step(0, "bash", {"command": "true"}))
        cg = placement.step_cg
        pids = cg.unified if cg.host.mode == "v2" else cg.paths["pids"]
        assert (pids / "pids.max").read_text().strip() == "7"
        placement.end_step(None)


# plain anonymous memory, nothing reclaimable: at a hard limit only an OOM kill (or a park) is left
GROW = """
import sys
held = []
for _ in range(int(sys.argv[1]) // 8):
    b = bytearray(8 << 20); b[::4096] = b"\\x01" * len(range(0, 8 << 20, 4096)); held.append(b)
"""


def grow(cg, mb):
    return spawn.start([sys.executable, "-c", GROW, str(mb)], join=cg.join_files())


def test_low_step_above_its_soft_limit_is_throttled_and_granted_room_not_killed(run_tree):
    rules = Rules.from_dict({"memory_high_mb": 48, "memory_max_mb": 160, "hold_ms": 20, "raise_step_mb": 32,
                             "raise_max_mb": 112, "freeze_after": 100, "priorities": {"default": "low"}})
    with Controller(rules) as ctl, ctl.running():
        cg = run_tree.workload("grows", inner=False)
        ctl.add_step(cg, "test")
        if cg.host.mode == "hybrid":            # v1: the soft limit is a tripwire with the OOM killer off
            mem = cg.paths["memory"]
            assert int((mem / "memory.limit_in_bytes").read_text()) == 48 * MB
            assert "oom_kill_disable 1" in (mem / "memory.oom_control").read_text()
        p = grow(cg, 120)
        assert p.wait(30) == 0
        done = ctl.remove_step(cg)
        assert cg.counters().oom_kills == 0
    assert done["priority"] == "low" and done["throttles"] >= 2 and done["raises"] >= 2, done
    raises = [a.detail for a in ctl.actions if a.what == "raise"]
    assert raises[:2] == ["soft limit -> 80 MB", "soft limit -> 112 MB"], raises
    # the grant log the reservation envelope is integrated from: one entry per raise, in time order
    assert len(done["grants"]) == done["raises"] and [mb for _, mb in done["grants"][:2]] == [80, 112], done
    assert [t for t, _ in done["grants"]] == sorted(t for t, _ in done["grants"]), done


def test_past_the_ceiling_the_kernel_kills_it(run_tree):
    rules = Rules.from_dict({"memory_high_mb": 48, "memory_max_mb": 96, "hold_ms": 20, "raise_step_mb": 32,
                             "raise_max_mb": 256, "freeze_after": 100, "priorities": {"default": "low"}})
    with Controller(rules) as ctl, ctl.running():
        cg = run_tree.workload("too-big", inner=False)
        ctl.add_step(cg, "test")
        p = grow(cg, 400)
        assert p.wait(30) == -9
        assert cg.counters().oom_kills == 1          # the kernel's OOM kill at the ceiling
        assert ctl.remove_step(cg)["policy_kills"] == 0


def test_close_leaves_no_step_parked_or_stopped(run_tree):
    rules = Rules.from_dict({"memory_high_mb": 48, "memory_max_mb": 256, "hold_ms": 60000,
                             "priorities": {"default": "low"}})
    ctl = Controller(rules)
    try:
        cg = run_tree.workload("parked", inner=False)
        ctl.add_step(cg, "test")
        p = grow(cg, 120)
        deadline = time.monotonic() + 10
        while not ctl.actions and time.monotonic() < deadline:
            ctl.poll(20)                             # throttled; its resume is a minute away
        assert [a.what for a in ctl.actions] == ["throttle"]
        assert p.poll() is None
    finally:
        ctl.close()                                  # lifts the tripwire / v2 memory.high, SIGCONTs, unloads
    if cg.host.mode == "v2":                         # memory.high 48 MiB would park a 120 MiB step
        assert (cg.unified / "memory.high").read_text().strip() == "max"
    assert p.wait(30) == 0


def test_normal_step_is_only_observed_and_released_with_no_soft_limit(run_tree):
    """A normal step above the soft limit: the controller takes no action on it. On v1 the soft
    limit throttles nothing, so it just finishes; on v2 the kernel itself throttles it at
    memory.high (no swap: its anonymous memory cannot be reclaimed) until the controller releases it."""
    rules = Rules.from_dict({"memory_high_mb": 48, "memory_max_mb": 256, "hold_ms": 20, "raise_step_mb": 64,
                             "raise_max_mb": 192, "priorities": {"default": "normal"}})
    ctl = Controller(rules)
    try:
        cg = run_tree.workload("observed", inner=False)
        ctl.add_step(cg, "search")
        p = grow(cg, 120)
        if cg.host.mode == "v2":
            deadline = time.monotonic() + 20
            while cg.counters().high_events == 0 and time.monotonic() < deadline:
                ctl.poll(20)
            for _ in range(50):                       # one more second under the policy
                ctl.poll(20)
            assert cg.counters().high_events > 0, "the kernel never throttled the step at memory.high"
            assert p.poll() is None, "a 120 MiB step finished under memory.high 48 MiB without swap"
            assert (cg.unified / "memory.high").read_text().strip() == str(48 * MB)   # no grant: observed only
        else:
            deadline = time.monotonic() + 30
            while p.poll() is None and time.monotonic() < deadline:
                ctl.poll(20)
            assert p.poll() == 0
        assert ctl.actions == []
    finally:
        ctl.close()
    if cg.host.mode == "v2":
        assert (cg.unified / "memory.high").read_text().strip() == "max"
    assert p.wait(30) == 0
    assert cg.counters().oom_kills == 0


def test_placement_runs_a_trace_under_the_policy_and_reports_what_it_did(run_tree):
    from pytest_agentcgroup.arms import Arm, ArmError
    from pytest_agentcgroup.cgroups.placement import ArmPlacement
    from pytest_agentcgroup.bpf.controller import policy_for
    from pytest_agentcgroup.replay import make_executor, replay
    from pytest_agentcgroup.traces.classify import step_kind
    from pytest_agentcgroup.traces.ir import parse_trace
    from helpers import synthetic_step
    trace = parse_trace({"schema": "agentcgroup-trace/1", "trace_id": "synthetic/burst",
                             "source": {"format": "synthetic"},
                             "steps": [synthetic_step(0, 20, 100, cmd="pytest -x"),
                                       synthetic_step(1, 150, 200, cmd="pytest tests"),
                                       # a normal step is only observed: kept under the soft limit, which
                                       # on v2 throttles it in-kernel (the test above shows that)
                                       synthetic_step(2, 32, 200, cmd="grep -r x .")]})
    arm = Arm.from_dict("agentcgroup", {"policy": "agentcgroup", "memory_high_mb": 64, "memory_max_mb": 256,
                                        "rules": {"hold_ms": 20, "raise_step_mb": 64, "raise_max_mb": 192,
                                                  "priorities": {"test": "low"}}})
    with pytest.raises(ArmError, match="needs its controller"):
        ArmPlacement(arm, run_tree.workload("none"), run_tree.controllers)
    ctl = policy_for(arm)
    try:
        with pytest.raises(ArmError, match="needs each step's kind"):     # cgroups/ does not classify steps
            ArmPlacement(arm, run_tree.workload("kindless"), run_tree.controllers, policy=ctl)
        with ctl.running():
            results = replay(trace, make_executor("emulate", time_scale=1.0, step_timeout_s=60),
                             ArmPlacement(arm, run_tree.workload("w"), run_tree.controllers, policy=ctl,
                                          kind_of=step_kind))
    finally:
        ctl.close()
    got = [(r.counters["kind"], r.counters["priority"], r.counters["throttles"] > 0, r.exit_code) for r in results]
    assert got == [("test", "low", False, 0), ("test", "low", True, 0), ("search", "normal", False, 0)], \
        [r.counters for r in results]
    assert results[2].counters["raises"] == 0 and results[2].counters["high_events"] == 0, results[2].counters


class _RecordingThrottle:
    """Stands in for bpf/reclaim_throttle.bpf.c in the fake-cgroupfs test below: that test is about
    the cgroup v2 files the controller writes, which this hybrid host cannot show for real."""
    def __init__(self):
        self.marks, self.rearms = {}, 0

    def mark(self, cg_id, mode):
        self.marks[cg_id] = mode

    def rearm(self, cg_id):
        self.rearms += 1

    def unmark(self, cg_id):
        self.marks.pop(cg_id, None)

    def poll(self, timeout_ms=0):
        return []

    def close(self):
        pass


def test_v2_policy_grants_raise_memory_high_no_tripwire(tree):
    from types import SimpleNamespace
    if tree.host.mode != "v2":
        pytest.skip(f"needs pure cgroup v2 (memory.high, no v1 tripwire); this host is {tree.host.mode} "
                    "(the kernel VM runs it)")
    ctl = Controller(Rules.from_dict({"ebpf": False, "memory_high_mb": 48, "memory_max_mb": 128, "hold_ms": 0,
                                      "raise_step_mb": 16, "raise_max_mb": 24,
                                      "priorities": {"test": "low", "edit": "high"}}))
    ctl.throttle = _RecordingThrottle()
    low, high = (tree.workload(n, inner=False) for n in ("low", "high"))
    sleeper = subprocess.Popen(["sleep", "30"])            # the "stopped" process SIGCONT goes to
    try:
        ctl.add_step(low, "test")
        ctl.add_step(high, "edit")
        assert ctl.throttle.marks == {low.id: "stop", high.id: "notify"}
        for cg in (low, high):
            assert (cg.unified / "memory.max").read_text().strip() == str(128 * MB)
            assert (cg.unified / "memory.high").read_text().strip() == str(48 * MB)
            assert not (cg.unified / "memory.oom_control").exists()      # v2 needs no tripwire
        ev = lambda cg: SimpleNamespace(cgroup_id=cg.id, pid=sleeper.pid, trigger_ns=0, action_ns=1000)  # noqa: E731
        for _ in range(3):
            ctl.handle(ev(low))
            ctl.tick()                                      # hold 0: resumed with a grant at once
            ctl.handle(ev(high))
        assert (low.unified / "memory.high").read_text().strip() == str(72 * MB)   # 48 + 16, capped at 48 + 24
        assert (high.unified / "memory.high").read_text().strip() == str(72 * MB)
        done = ctl.remove_step(low)
        grants = done.pop("grants")       # [ms since add_step, MiB]: the envelope metrics/reservation.py integrates
        assert done == {"kind": "test", "priority": "low", "throttles": 3, "freezes": 1, "raises": 2, "policy_kills": 0,
                        "cpu_weight": None}
        assert [mb for _, mb in grants] == [64, 72] and all(t >= 0 for t, _ in grants)
        assert (low.unified / "memory.high").read_text().strip() == "max"     # released: nothing parks it
        assert (low.unified / "memory.max").read_text().strip() == str(128 * MB)   # the ceiling stays
    finally:
        sleeper.kill()
        sleeper.wait()
