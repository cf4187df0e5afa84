"""The step pool: cgroups and parked shells made between steps behave like a fresh spawn (joined
before exec, environment, directory, missing program, timeout) and leave nothing behind."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from pytest_agentcgroup.arms import Arm

from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.cgroups.node import MB
from pytest_agentcgroup.replay import EmulateExecutor, replay
from pytest_agentcgroup.replay.executors import Launch
from pytest_agentcgroup.proc import Parked, SpawnError, run
from pytest_agentcgroup.traces.ir import Measure, Profile, Step, Trace


def test_parked_shell_is_in_its_cgroups_before_exec_with_env_and_cwd(tree, tmp_path):
    cg = tree.workload("parked").child("p0", tree.controllers)
    out = tmp_path / "out"
    parked = Parked(cg.join_files())
    res = run(["/bin/sh", "-c", f'cat /proc/self/cgroup > {out}; echo "$FOO|$HOME|$(pwd)" >> {out}'],
              join=parked, cwd=str(tmp_path), env={"FOO": "a b'c", "PATH": "/usr/bin:/bin"}, timeout_s=10)
    assert res.exit_code == 0
    *cgroups, last = out.read_text().splitlines()
    where = {line.split(":", 2)[1] or "unified": line.split(":", 2)[2] for line in cgroups}
    assert where["unified"].endswith("/parked/p0") and (tree.host.mode != "hybrid" or where["memory"].endswith("/parked/p0"))
    assert last == f"a b'c||{tmp_path}"             # given env only (HOME unset), given cwd
    cg.remove()


def test_parked_missing_program_is_a_spawn_error_and_leaves_no_process():
    parked = Parked()
    with pytest.raises(SpawnError, match="no-such-program"):
        run(["/nonexistent/no-such-program"], join=parked, timeout_s=5)
    assert parked.proc.returncode is not None


def test_a_long_lived_parked_child_polls_like_popen():
    """exp5's base memory: a parked child started and left running, polled until it is resident."""
    parked = Parked()
    parked.start(["sleep", "30"], None, None)
    child = parked.proc
    assert child.poll() is None
    child.kill()
    deadline = time.monotonic() + 5
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.poll() == -signal.SIGKILL and child.wait() == -signal.SIGKILL


def test_parked_timeout_kills_the_step(tree):
    cg = tree.workload("ptimeout").child("p0", tree.controllers)
    res = run(["sleep", "30"], join=Parked(cg.join_files()), timeout_s=0.3, kill=cg.kill)
    assert res.timed_out and res.signal == 9 and res.wall_ms < 5000
    cg.remove()


def test_pooled_placement_measures_each_step_and_leaves_nothing(tree):
    work = tree.workload("pooled")

    def emu(i, peak):
        return Step(i, "bash", {"command": "x"}, duration_ms=Measure(100, "synthetic"),
                    profile=Profile(peak_mb=Measure(peak, "synthetic"), ramp_ms=Measure(50, "synthetic")))
    trace = Trace("test/pooled", {"format": "test"}, (emu(0, 30), emu(1, 200), Step(2, "noop"), emu(3, 30)))
    placement = ArmPlacement(Arm("static-toolcall", memory_max_mb=128), work, tree.controllers, pool=True)
    results = replay(trace, EmulateExecutor(time_scale=1.0), placement)
    assert [r.counters["oom_kills"] for r in results] == [0, 1, 0, 0]      # the arm's limit, per step
    assert 15 * MB <= results[0].counters["peak_bytes"] <= 64 * MB
    assert results[3].exit_code == 0                                        # a fresh cgroup after the kill
    assert work.pids() == [] and not [p for p in work.unified.iterdir() if p.is_dir()]   # close() removed all
    work.remove()


def test_pooled_placement_is_tidied_after_a_step_that_could_not_start(tree):
    class MissingProgram:                   # every bash step names a program that does not exist
        name = "missing"

        def start(self, trace): pass

        def stop(self): pass

        def launch(self, step):
            return Launch(["/nonexistent/no-such-program"], "/", 5.0) if step.tool == "bash" else None

    tidied = []

    class Counted(ArmPlacement):
        def tidy(self):
            tidied.append(1)
            super().tidy()

    work = tree.workload("pool-error")
    trace = Trace("test/pool-error", {"format": "test"}, (Step(0, "bash", {"command": "x"}), Step(1, "noop"),
                                                          Step(2, "bash", {"command": "y"})))
    results = replay(trace, MissingProgram(), Counted(Arm("static-toolcall", pids_max=16), work, tree.controllers, pool=True))
    assert [bool(r.error) for r in results] == [True, False, True], results
    assert len(tidied) == 2                 # after each step that used the pool, started or not
    assert work.pids() == [] and not [p for p in work.unified.iterdir() if p.is_dir()]
    work.remove()


def test_pooled_placement_discards_the_parked_shell_when_the_policy_refuses_a_step(tree):
    class Refusing:                         # a policy whose add_step fails (as a full BPF map would)
        def add_step(self, cg, kind=None, *, time_scale=1.0):
            raise RuntimeError("refused")

        def remove_step(self, cg):
            return {}

    work = tree.workload("pool-refused")
    placement = ArmPlacement(Arm("static-toolcall"), work, tree.controllers, pool=True, policy=Refusing(),
                             kind_of=lambda step: None)
    taken, take = [], placement.pool.take
    placement.pool.take = lambda: taken.append(take()) or taken[-1]
    with pytest.raises(RuntimeError, match="refused"):
        placement.begin_step(Step(0, "bash", {"command": "x"}))
    (_, parked), = taken
    assert parked.proc.returncode is not None          # killed and reaped at once, not at the next tidy
    placement.close()
    assert work.pids() == [] and not [p for p in work.unified.iterdir() if p.is_dir()]
    work.remove()


def test_parked_shell_that_cannot_join_fails_its_step_with_the_reason(tmp_path):
    missing = tmp_path / "gone" / "cgroup.procs"          # a cgroup removed while the shell was parked
    parked = Parked([str(missing)])
    assert parked.proc.returncode == 125                  # Parked waited for the shell: it has already failed
    with pytest.raises(SpawnError, match=r"'/bin/true': the parked shell could not join its cgroups \(.*gone/cgroup.procs\)"):
        run(["/bin/true"], join=parked, timeout_s=5)


class Argv:
    """An executor whose every step runs `argv`."""
    name = "argv"

    def __init__(self, argv):
        self.argv = argv

    def start(self, trace): pass

    def stop(self): pass

    def launch(self, step):
        return Launch(self.argv, "/", 30.0)


FORKS = """import os, sys, time
n = 0
for _ in range(40):
    try:
        pid = os.fork()
    except BlockingIOError:            # EAGAIN: a pids limit refused the fork
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    n += 1
t = time.process_time() + 0.2
while time.process_time() < t:         # CPU the step's counters must show
    pass
open(sys.argv[1], "w").write(f"{n} {open('/proc/self/cgroup').read()}")
"""


@pytest.mark.parametrize("pool", [False, True], ids=["fresh", "pooled"])
def test_a_step_without_pids_or_cpu_limits_is_still_bounded_and_measured(tree, tmp_path, pool):
    # hybrid: such a step has no v1 pids or cpu cgroup of its own; it must join its parent's, so
    # that a pids bound above it holds, and its CPU is still counted in its own counters
    work = tree.workload("bounded-" + ("pooled" if pool else "fresh"))
    work.set_pids_max(8)
    out = tmp_path / "out"
    trace = Trace("test/bounded", {"format": "test"}, (Step(0, "bash", {"command": "x"}),))
    placement = ArmPlacement(Arm("static-toolcall", memory_max_mb=256), work, tree.controllers, pool=pool)
    (r,) = replay(trace, Argv([sys.executable, "-c", FORKS, str(out)]), placement)
    assert r.exit_code == 0, r
    forked, cgroups = out.read_text().split(" ", 1)
    assert int(forked) < 8                       # the workload's pids.max refused the rest
    assert r.counters["pids_max_events"] + work.counters().pids_max_events >= 1, r.counters
    assert r.counters["cpu_usec"] >= 150_000, r.counters
    where = {}
    for line in cgroups.splitlines():
        _, names, path = line.split(":", 2)
        where.update({name: path for name in (names.split(",") if names else ["unified"])})
    for key in work.paths:                       # every hierarchy: the workload or a step cgroup below it
        assert f"/{work.unified.name}" in where[key], (key, where)
    if tree.host.mode == "hybrid":               # no pids or cpu limit: the workload's own v1 directories
        assert all(where[k].endswith(f"/{work.unified.name}") for k in ("pids", "cpu") if k in work.paths), where
    assert all(p.is_dir() for p in work.paths.values())        # a shared directory is the parent's: kept
    assert not [d for p in work.paths.values() for d in p.iterdir() if d.is_dir()]   # no step cgroup left
    work.remove()


def test_removing_a_busy_cgroup_kills_and_removes_all_of_it(tree):
    # the removal's fast path (one rmdir per directory) must fall back to kill and drain when the
    # kernel refuses it: a child cgroup with a daemon in it below a step's cgroup
    step = tree.workload("busy").child("s0", tree.controllers, inner=True)
    leaf = step.child("daemon", tree.controllers)
    run(["/bin/sh", "-c", "setsid sleep 300 & exit 0"], join=leaf.join_files(), timeout_s=10)
    assert leaf.pids()
    step.remove()
    assert not [p for p in (*step.paths.values(), *leaf.paths.values()) if p.exists()]


def test_parked_step_gets_default_signals_and_none_of_our_descriptors(tree, tmp_path):
    # as a fresh spawn: SIGPIPE not ignored (Python ignores it; an ignored signal survives exec),
    # and a descriptor we hold, inheritable or not, is not the step's
    cg = tree.workload("parked-fds").child("p0", tree.controllers)
    keep_r, keep_w = os.pipe()
    os.set_inheritable(keep_w, True)
    try:
        out = tmp_path / "out"
        res = run(["/bin/sh", "-c", f'grep SigIgn /proc/self/status > {out}; exec ls -l /proc/self/fd >> {out}'],
                  join=Parked(cg.join_files()), timeout_s=10)
        ours = f"pipe:[{os.fstat(keep_w).st_ino}]"
    finally:
        os.close(keep_r)
        os.close(keep_w)
    assert res.exit_code == 0
    ignored, fds = out.read_text().split("\n", 1)
    assert not int(ignored.split()[1], 16) >> (signal.SIGPIPE - 1) & 1, ignored
    assert ours not in fds and "pipe:" not in fds, fds  # no output asked for: /dev/null, as a fresh spawn's
    cg.remove()
