"""Experiment 2 — timescale mismatch: how fast do controllers react to the same memory burst?

A timescale study (`kind = "timescale"` in `[experiments.exp2]` of experiments/agentcgroup.toml,
checked at load by studies/timescale.py; procedures/timescale/ runs it). Each controller (the
experiment's arms: poll_<N>ms, psi, ebpf_ringbuf, ebpf_kernel, ebpf_delayed_<N>us; select some with
--agentcgroup-arms) stops a worker whose burst crosses a hard limit; one observer,
bpf/task_stop.bpf.c, measures every one from the worker's first memcg reclaim to its stop, both
kernel clock. The table is printed; every claim with its values and verdict, and a refuted one
fails the test.
"""
import pytest

pytestmark = pytest.mark.experiment(name="exp2")


def test_exp2_reaction_time(agentcgroup_study):
    outcome = agentcgroup_study()
    outcome.assert_holds()
