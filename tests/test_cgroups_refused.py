"""A controller the kernel refuses alone is left out, not the run: cgroup.subtree_control takes
each write all or nothing, so the optional controllers (node.OPTIONAL: cpu) are written one at a
time after the required ones (memory, pids). Real cgroupfs, real refusals: on this host and in
the kernel VM (tests/kernels/), where the threaded-subtree case runs.

No Debian kernel here refuses cpu alone (RT group scheduling is off in 6.1, 6.12 and 7.3, so the
EINVAL with realtime tasks below cannot be had), so the tests make the kernel refuse a controller
the two ways any kernel does: one not delegated to the cgroup (ENOENT) and a domain controller
(memory) in the root of a threaded subtree (EOPNOTSUPP) — with cpu accepted beside it."""
from __future__ import annotations

import errno
from pathlib import Path

import pytest

from pytest_agentcgroup.cgroups import CgroupUnavailable, RunTree
from pytest_agentcgroup.cgroups.host import CgroupHost
from pytest_agentcgroup.cgroups.node import enable_subtree

#: every v2 controller a kernel may have (cgroup.controllers lists the ones this cgroup may enable)
V2_CONTROLLERS = ("cpuset", "cpu", "io", "memory", "hugetlb", "pids", "rdma", "misc")


def _words(path: Path) -> list[str]:
    return path.read_text().split()


def test_a_controller_not_given_to_the_cgroup_is_refused_alone_the_others_enabled(tree):
    # a v2 cgroup below the run root: in the VM it has the run's controllers and not the others
    # (io, hugetlb…); on a hybrid host the unified tree has none at all, so nothing is required
    cg = tree.root.unified / "refused-enoent"
    cg.mkdir()
    try:
        have = _words(cg / "cgroup.controllers")
        absent = [c for c in V2_CONTROLLERS if c not in have]
        assert absent, f"{cg} has every controller: nothing to be refused"
        refused = enable_subtree(cg / "cgroup.subtree_control", have + absent[:1], optional=absent[:1])
        assert list(refused) == absent[:1]
        assert "ENOENT" in refused[absent[0]] and str(cg) in refused[absent[0]]
        assert sorted(_words(cg / "cgroup.subtree_control")) == sorted(have)
        # the same controller required: the kernel's error is the caller's, and nothing more is enabled
        with pytest.raises(OSError) as exc:
            enable_subtree(cg / "cgroup.subtree_control", absent[:1], optional=())
        assert exc.value.errno == errno.ENOENT
        assert sorted(_words(cg / "cgroup.subtree_control")) == sorted(have)
    finally:
        (cg / "cgroup.subtree_control").write_text(" ".join(f"-{c}" for c in _words(cg / "cgroup.subtree_control")))
        cg.rmdir()


def test_v2_a_thread_root_refuses_memory_alone_and_keeps_pids_and_cpu(tree):
    # A cgroup whose child is threaded becomes a thread root: the kernel refuses a domain controller
    # (memory) in its subtree_control with EOPNOTSUPP and accepts the threaded ones (pids, cpu).
    if tree.host.mode != "v2":
        pytest.skip(f"needs pure cgroup v2 (this host is {tree.host.mode}: its unified tree has no "
                    "controllers to refuse one of); the kernel VM runs it")
    if not {"memory", "pids", "cpu"} <= set(tree.controllers):
        pytest.skip(f"the run has controllers {tree.controllers}, not memory, pids and cpu")
    top = tree.workload("thread-root", inner=False).unified       # a leaf: enables nothing, holds nothing
    (top / "t").mkdir()
    try:
        (top / "t" / "cgroup.type").write_text("threaded")
        assert (top / "cgroup.type").read_text().strip() == "domain threaded"
        # the premise: one write naming memory with the others enables none of them
        with pytest.raises(OSError) as exc:
            (top / "cgroup.subtree_control").write_text("+pids +cpu +memory")
        assert exc.value.errno == errno.EOPNOTSUPP
        assert _words(top / "cgroup.subtree_control") == []
        # memory in the optional role here: written alone, it alone is left out
        refused = enable_subtree(top / "cgroup.subtree_control", ("pids", "memory", "cpu"),
                                 optional=("memory", "cpu"))
        assert list(refused) == ["memory"] and "EOPNOTSUPP" in refused["memory"]
        assert sorted(_words(top / "cgroup.subtree_control")) == ["cpu", "pids"]
        assert {"cpu", "pids"} <= set(_words(top / "t" / "cgroup.controllers"))
    finally:
        on = _words(top / "cgroup.subtree_control")
        if on:
            (top / "cgroup.subtree_control").write_text(" ".join(f"-{c}" for c in on))
        (top / "t").rmdir()


def test_run_tree_says_why_an_optional_controller_is_missing(tree):
    # whatever this host gives: cpu is either one of the run's controllers or refused with a reason
    assert ("cpu" in tree.controllers) != ("cpu" in tree.refused), (tree.controllers, tree.refused)
    for name, why in tree.refused.items():
        assert name in why, why


def test_v2_a_run_under_a_cgroup_without_cpu_runs_on_memory_and_pids_and_says_why(tree):
    # A run whose own cgroup was given memory and pids only (as a user's systemd session delegates):
    # the run tree is made without cpu, its steps have no cpu.weight, and the reason names the cgroup.
    if tree.host.mode != "v2":
        pytest.skip(f"needs pure cgroup v2 (this host is {tree.host.mode}); the kernel VM runs it")
    parent = tree.root.child("no-cpu", ("memory", "pids"), inner=True)
    base = parent.unified / "base"
    base.mkdir()
    inner = RunTree(CgroupHost("v2", base, {}, tree.host.mount))
    try:
        assert inner.controllers == ("memory", "pids")
        assert "cpu not delegated to " + str(base) in inner.refused["cpu"]
        assert sorted(_words(base / "cgroup.subtree_control")) == ["memory", "pids"]
        step = inner.workload("w").child("s0", inner.controllers)
        assert (step.unified / "memory.max").exists() and not (step.unified / "cpu.weight").exists()
        with pytest.raises(CgroupUnavailable, match="cpu controller is not enabled"):
            step.set_cpu_weight(200)
    finally:
        inner.close()
    assert _words(base / "cgroup.subtree_control") == []      # the last run gave them back


def test_a_policy_steps_cpu_weight_not_taken_is_recorded_with_why(tree):
    # The rules give low steps a cpu weight; this step's cgroup has no cpu controller (v2: its
    # parent's subtree_control lacks cpu; hybrid: no v1 cpu directory): the memory policy runs,
    # and what the controller reports for the record says why the weight is missing.
    from pytest_agentcgroup.arms import Rules
    from pytest_agentcgroup.bpf.controller import Controller
    parent = tree.root.child("no-cpu", ("memory", "pids"), inner=True)
    step = parent.child("s0", ("memory", "pids"), inner=False)
    rules = Rules.from_dict({"ebpf": False, "memory_high_mb": 48, "priorities": {"default": "low"},
                             "cpu_weight": {"low": 25}})
    with Controller(rules) as ctl:
        ctl.add_step(step, "test")
        done = ctl.remove_step(step)
    assert done["cpu_weight"] is None
    assert "cpu controller is not enabled" in done["cpu_weight_missing"], done
    assert str(step.paths.get("unified")) in done["cpu_weight_missing"] or tree.host.mode != "v2"
