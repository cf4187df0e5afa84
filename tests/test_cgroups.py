"""Real cgroups on this host: layout detection, the run tree, join-before-exec, kernel counters,
teardown and the stale sweep. Skips with the reason when cgroups cannot be created here."""
from __future__ import annotations

import os
import sys

from pytest_agentcgroup.cgroups import RunTree
from pytest_agentcgroup.cgroups.arms import Arm, ArmPlacement
from pytest_agentcgroup.cgroups.node import MB
from pytest_agentcgroup.cgroups.tree import PREFIX, sweep_stale
from pytest_agentcgroup.replay.spawn import run

ALLOC = "import sys\nb = bytearray(int(sys.argv[1]) * 1048576)\nb[::4096] = b'x' * (len(b) // 4096)"


def alloc(cg, mb: int):
    return run([sys.executable, "-c", ALLOC, str(mb)], join=cg.join_files(), timeout_s=30)


def test_run_root_lives_under_this_process_cgroup(tree):
    host = tree.host
    own = {"unified": host.unified, **host.v1}
    for key, path in tree.root.paths.items():
        assert path.parent == own[key], f"{key}: {path} is not directly under {own[key]}"
        assert path.name.startswith(PREFIX + str(os.getpid()) + "-")


def test_step_process_is_in_its_cgroups_before_exec(tree, tmp_path):
    cg = tree.workload("joins").child("s0", tree.controllers)
    out = tmp_path / "cgroup.txt"
    # `cat` is the exec'd program itself: what it reads is where it was from its first instruction
    with open(out, "w") as fh:
        res = run(["cat", "/proc/self/cgroup"], join=cg.join_files(), timeout_s=10, stdout=fh)
    assert res.exit_code == 0
    where = {}
    for line in out.read_text().splitlines():
        _, ctrls, rel = line.split(":", 2)
        where[ctrls or "unified"] = rel
    assert where["unified"].endswith("/joins/s0"), where
    if tree.host.mode == "hybrid":
        assert where["memory"].endswith("/joins/s0"), where


def test_oom_kill_counted_once_in_the_step_cgroup(tree):
    work = tree.workload("oom")
    arm = Arm("static-toolcall", memory_max_mb=64)
    placement = ArmPlacement(arm, work, tree.controllers)

    class Step:
        step_id = 0
    files = placement.begin_step(Step)
    res = run([sys.executable, "-c", ALLOC, "200"], join=files, timeout_s=30)
    counters = placement.end_step(Step)
    assert res.signal == 9, res
    assert counters["oom_kills"] == 1
    assert counters["max_events"] >= 1
    assert 60 * MB <= counters["peak_bytes"] <= 65 * MB


def test_trace_scope_limit_is_counted_at_the_workload(tree):
    work = tree.workload("env")
    placement = ArmPlacement(Arm("static-env", scope="trace", memory_max_mb=64), work, tree.controllers)

    class Step:
        step_id = 3
    res = run([sys.executable, "-c", ALLOC, "200"], join=placement.begin_step(Step), timeout_s=30)
    counters = placement.end_step(Step)
    assert res.signal == 9
    assert counters["oom_kills"] == 1            # the victim's cgroup (the step) counts the kill
    assert counters["max_events"] >= 1           # the limit that was hit is the workload's


def test_soft_limit_counts_a_breach_and_kills_nothing(tree):
    work = tree.workload("soft")
    placement = ArmPlacement(Arm("static-high", memory_high_mb=64), work, tree.controllers)

    class Step:
        step_id = 0
    res = run([sys.executable, "-c", ALLOC, "150"], join=placement.begin_step(Step), timeout_s=30)
    counters = placement.end_step(Step)
    assert res.exit_code == 0
    assert counters["high_events"] >= 1
    assert counters["oom_kills"] == 0


def test_no_breach_below_the_soft_limit(tree):
    work = tree.workload("soft-below")
    placement = ArmPlacement(Arm("static-high", memory_high_mb=256), work, tree.controllers)

    class Step:
        step_id = 0
    run([sys.executable, "-c", ALLOC, "32"], join=placement.begin_step(Step), timeout_s=30)
    assert placement.end_step(Step)["high_events"] == 0


def test_teardown_kills_stragglers_and_removes_everything(tree):
    cg = tree.workload("stragglers").child("s0", tree.controllers)
    # the step leaves a daemon behind: removal must still succeed
    run(["/bin/sh", "-c", "setsid sleep 300 & exit 0"], join=cg.join_files(), timeout_s=10)
    assert cg.pids(), "the daemon should still be running in the step cgroup"
    cg.remove()
    assert all(not p.exists() for p in cg.paths.values())


def test_stale_run_roots_are_swept(tree):
    host = tree.host
    # A run root named for a process that no longer exists (pid 1's start time never matches 0).
    stale = {"unified": host.unified / f"{PREFIX}1-0", **{k: v / f"{PREFIX}1-0" for k, v in host.v1.items()
                                                          if k in tree.controllers}}
    for p in stale.values():
        p.mkdir()
        (p / "leftover").mkdir()
    removed = sweep_stale(host)
    assert set(removed) >= set(stale.values())
    assert all(not p.exists() for p in stale.values())
    assert tree.root.unified.exists(), "the live run's own root must survive the sweep"


def test_two_run_trees_in_one_process_do_not_collide(tree):
    # the plugin's session tree and an experiment's own tree live side by side
    other = RunTree(tree.host)
    try:
        assert other.root.unified != tree.root.unified
        assert other.root.unified.name.startswith(f"{PREFIX}{os.getpid()}-")
        assert tree.root.unified.exists(), "making a second tree must not sweep the first"
    finally:
        other.close()
    assert tree.root.unified.exists()
