"""Experiment 3 — multi-tenant isolation: a browser agent (A), a bash agent in a container (B) and a
noisy neighbour (C: CPU hog, fork bomb, allocation stress) at once, under each arm.

A multitenant study (`kind = "multitenant"` in `[experiments.exp3]` of experiments/agentcgroup.toml,
checked at load by studies/multitenant.py; procedures/multitenant/ runs it): one test per arm
(--agentcgroup-arms selects). A and B run alone first, then all three together. Printed per arm:
each tenant's latencies alone and with C, A's page loads, OOM kills, forks refused in C, the host
probe, and every claim of the arm with its values and verdict (a refuted one fails the test).
"""
import pytest

pytestmark = pytest.mark.experiment(name="exp3")


def test_exp3_multitenant(agentcgroup_arm, agentcgroup_study):
    outcome = agentcgroup_study(arm=agentcgroup_arm)
    outcome.assert_holds()
