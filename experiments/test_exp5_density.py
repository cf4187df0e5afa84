"""Experiment 5 — density: K agents replayed at once under one host memory budget, K stepped up.

A density study (`kind = "density"` in `[experiments.exp5]` of experiments/agentcgroup.toml, checked
at load by studies/density.py; procedures/density/ runs it); without that section both tests skip
saying so. `test_exp5_density`: per arm, every agent alone, then K = 1, 2, ... at once: traces
completed, OOM kills, slowdowns, the largest K held. `test_exp5_agentcgroup_replication`:
AgentCgroup's own set-up (1 high + 2 low agents, footprints at 50x) under no policy, memory.high
only and memory.high + BPF, beside their published figures. Each checks the claims on its metrics.
"""
import pytest

pytestmark = pytest.mark.experiment(name="exp5")


def test_exp5_density(agentcgroup_study):
    outcome = agentcgroup_study("density")
    outcome.assert_holds()


def test_exp5_agentcgroup_replication(agentcgroup_study):
    outcome = agentcgroup_study("replication")
    outcome.assert_holds()
