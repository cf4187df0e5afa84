"""Pure cgroup v2 code paths, against a FAKE cgroupfs in a temp dir.

This kernel is hybrid (v1 controllers), so the v2 limit and counter files cannot be exercised for
real here. These tests check what our code writes and how it parses what a v2 kernel presents:
file names, formats and the layout detection. Everything kernel-side is simulated by plain files.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from pytest_agentcgroup.cgroups import CgroupUnavailable, detect
from pytest_agentcgroup.cgroups.arms import Arm, ArmPlacement
from pytest_agentcgroup.cgroups.host import CgroupHost
from pytest_agentcgroup.cgroups.node import MB, Cgroup

V2_MOUNTINFO = "30 23 0:26 / {root} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
HYBRID_MOUNTINFO = (
    "30 23 0:26 / {root}/unified rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    "31 23 0:27 / {root}/memory rw shared:5 - cgroup cgroup rw,memory\n"
    "32 23 0:28 / {root}/pids rw shared:6 - cgroup cgroup rw,pids\n")


def fake_v2(tmp_path: Path) -> CgroupHost:
    root = tmp_path / "cgroup"
    own = root / "user.slice" / "session.scope"
    own.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "mountinfo").write_text(V2_MOUNTINFO.format(root=root))
    (tmp_path / "proc_cgroup").write_text("0::/user.slice/session.scope\n")
    return detect(mountinfo=str(tmp_path / "mountinfo"), proc_cgroup=str(tmp_path / "proc_cgroup"))


def kernel_files(cg: Cgroup, *, peak=0, events="", usage=0):
    """What a v2 kernel would show in a fresh cgroup directory."""
    u = cg.unified
    (u / "memory.peak").write_text(f"{peak}\n")
    (u / "memory.events.local").write_text(events or "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n")
    (u / "cpu.stat").write_text(f"usage_usec {usage}\nuser_usec 0\nsystem_usec 0\n")
    (u / "cgroup.procs").write_text("")


def test_fake_cgroupfs_detects_pure_v2(tmp_path):
    host = fake_v2(tmp_path)
    assert host.mode == "v2"
    assert host.unified == tmp_path / "cgroup" / "user.slice" / "session.scope"
    assert "memory" in host.controllers


def test_fake_cgroupfs_detects_hybrid_and_own_v1_paths(tmp_path):
    (tmp_path / "mountinfo").write_text(HYBRID_MOUNTINFO.format(root="/sys/fs/cgroup"))
    (tmp_path / "proc_cgroup").write_text("8:pids:/\n4:memory:/process_api/abc\n0::/\n")
    host = detect(mountinfo=str(tmp_path / "mountinfo"), proc_cgroup=str(tmp_path / "proc_cgroup"))
    assert host.mode == "hybrid"
    assert host.v1["memory"] == Path("/sys/fs/cgroup/memory/process_api/abc")
    assert host.unified == Path("/sys/fs/cgroup/unified")


def test_fake_cgroupfs_v2_without_memory_controller_says_so(tmp_path):
    host = fake_v2(tmp_path)
    (host.unified / "cgroup.controllers").write_text("cpu pids\n")
    with pytest.raises(CgroupUnavailable, match="memory controller is not available"):
        detect(mountinfo=str(tmp_path / "mountinfo"), proc_cgroup=str(tmp_path / "proc_cgroup"))


def test_fake_cgroupfs_v2_limits_are_written_where_v2_reads_them(tmp_path):
    host = fake_v2(tmp_path)
    work = Cgroup.make(host, {"unified": host.unified}, "work", ("memory", "pids"))
    assert (work.unified / "cgroup.subtree_control").read_text() == "+memory +pids"
    step = work.child("s0", ("memory", "pids"))
    Arm("a", memory_max_mb=512, memory_high_mb=256, pids_max=64).apply(step)
    assert (step.unified / "memory.max").read_text() == str(512 * MB)
    assert (step.unified / "memory.high").read_text() == str(256 * MB)
    assert (step.unified / "pids.max").read_text() == "64"
    assert step.join_files() == [str(step.unified / "cgroup.procs")]


def test_fake_cgroupfs_v2_counters_come_from_local_events(tmp_path):
    host = fake_v2(tmp_path)
    work = Cgroup.make(host, {"unified": host.unified}, "work")
    kernel_files(work)
    placement = ArmPlacement(Arm("static-toolcall", memory_max_mb=64), work, ("memory",))

    class Step:
        step_id = 7
    placement.begin_step(Step)
    step = placement.step_cg
    kernel_files(step, peak=70 * MB, usage=12_500,
                 events="low 0\nhigh 3\nmax 41\noom 1\noom_kill 1\noom_group_kill 0\n")
    # the workload's own (local) events during the step: one more max event at its level
    (work.unified / "memory.events.local").write_text("low 0\nhigh 0\nmax 1\noom 0\noom_kill 0\noom_group_kill 0\n")
    c = step.counters()
    assert (c.peak_bytes, c.cpu_usec, c.high_events, c.max_events, c.oom_kills) == (70 * MB, 12_500, 3, 41, 1)
    assert work.counters().minus(placement._before).max_events == 1
