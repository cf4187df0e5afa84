"""Parsing /proc/self/mountinfo and /proc/self/cgroup into a cgroup layout, from files written here.

These test parsing only: nothing here pretends to be a kernel (no limits or counters on plain
files). What a v2 kernel does with what we write is tested for real by tests/test_cgroups.py inside
a pure cgroup v2 VM.
"""
from __future__ import annotations

from pathlib import Path

from pytest_agentcgroup.cgroups import detect
from pytest_agentcgroup.cgroups.host import INIT_LEAF

V2_MOUNTINFO = "30 23 0:26 / {root} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n"
HYBRID_MOUNTINFO = (
    "30 23 0:26 / {root}/unified rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    "31 23 0:27 / {root}/memory rw shared:5 - cgroup cgroup rw,memory\n"
    "32 23 0:28 / {root}/pids rw shared:6 - cgroup cgroup rw,pids\n")


def _detect(tmp_path: Path, mountinfo: str, proc_cgroup: str):
    (tmp_path / "mountinfo").write_text(mountinfo)
    (tmp_path / "proc_cgroup").write_text(proc_cgroup)
    return detect(mountinfo=str(tmp_path / "mountinfo"), proc_cgroup=str(tmp_path / "proc_cgroup"))


def test_pure_v2_layout_and_own_cgroup(tmp_path):
    host = _detect(tmp_path, V2_MOUNTINFO.format(root="/sys/fs/cgroup"), "0::/user.slice/session-3.scope\n")
    assert (host.mode, host.v1) == ("v2", {})
    assert host.unified == Path("/sys/fs/cgroup/user.slice/session-3.scope")
    assert host.mount == Path("/sys/fs/cgroup") and not host.is_root


def test_pure_v2_root_cgroup_is_recognised(tmp_path):
    host = _detect(tmp_path, V2_MOUNTINFO.format(root="/sys/fs/cgroup"), "0::/\n")
    assert host.unified == Path("/sys/fs/cgroup") and host.is_root


def test_a_process_in_the_init_leaf_belongs_to_its_parent(tmp_path):
    # after delegate.py moved the session's processes, a later run (an xdist worker, a second
    # RunTree) must put its run root beside the leaf, not under it
    host = _detect(tmp_path, V2_MOUNTINFO.format(root="/sys/fs/cgroup"), f"0::/sess/{INIT_LEAF}\n")
    assert host.unified == Path("/sys/fs/cgroup/sess")


def test_hybrid_layout_and_own_v1_paths(tmp_path):
    host = _detect(tmp_path, HYBRID_MOUNTINFO.format(root="/sys/fs/cgroup"),
                   "8:pids:/\n4:memory:/process_api/abc\n0::/\n")
    assert host.mode == "hybrid"
    assert host.v1["memory"] == Path("/sys/fs/cgroup/memory/process_api/abc")
    assert host.v1["pids"] == Path("/sys/fs/cgroup/pids")
    assert host.unified == Path("/sys/fs/cgroup/unified")


def test_mount_point_with_a_space_is_unescaped(tmp_path):
    host = _detect(tmp_path, V2_MOUNTINFO.format(root="/mnt/cg\\040two"), "0::/a\n")
    assert host.unified == Path("/mnt/cg two/a")
