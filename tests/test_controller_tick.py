"""The policy controller's event loop survives a resume that falls due after its step's cgroup was
removed (found by Experiment 5: Cgroup.id stats the directory, tick() raised FileNotFoundError in
the loop's thread, the thread ended, and every throttled step stayed stopped)."""
from __future__ import annotations

from pytest_agentcgroup.arms import Rules
from pytest_agentcgroup.bpf.controller import Controller, _Step


class GoneCgroup:
    """A step cgroup whose directory has been removed: reading its id fails, as on a real host."""

    @property
    def id(self):
        raise FileNotFoundError(2, "No such file or directory", "/sys/fs/cgroup/unified/gone")


def test_a_due_resume_of_a_removed_step_is_dropped_without_touching_its_cgroup():
    ctl = Controller(Rules(ebpf=False))            # no eBPF needed: tick() is plain Python
    step = _Step(GoneCgroup(), "test", "low", None, cgid=4242)
    ctl._schedule(0, step)                         # due at once; the step is no longer governed
    ctl.tick()                                     # raised FileNotFoundError before the fix
    assert ctl._due == [] and ctl.actions == []
