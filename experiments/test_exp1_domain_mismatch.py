"""Experiment 1 — domain mismatch.

Each shipped smoke trace replays under the six arms of experiments/agentcgroup.toml. The budgets
there state the hypothesis: no OOM kill without limits; under a static per-step limit exactly the
steps whose recorded peak exceeds the limit are killed (counted by the kernel, once each); a soft
limit counts those same steps as breaches and kills nothing; the dynamic `agentcgroup` arm
throttles exactly the low-priority steps above its soft limit in the kernel and kills none below
its ceiling, and its `bpf-soft` control (same limits, no eBPF) throttles nothing.
"""
import pytest

pytestmark = pytest.mark.experiment(name="exp1")


def test_exp1(agentcgroup_run):
    outcome = agentcgroup_run()
    assert outcome.records, "the replay produced no step records"
    outcome.assert_within_budget()
