"""exp2's gate statistic (studies/timescale.py): the lower confidence bound of the share of bursts
whose worker ran on. Checked against closed forms and against its promise: a controller that holds
in >= 99 % of bursts is refuted in at most 1 - confidence of runs (the exact binomial sum)."""
from __future__ import annotations

import math

import pytest

from pytest_agentcgroup.studies.timescale import lower_bound


def test_closed_forms():
    assert lower_bound(0, 100, 0.999) == 0.0
    # every burst ran on: P(X >= n) = p^n = 1 - confidence
    assert lower_bound(100, 100, 0.999) == pytest.approx(0.001 ** (1 / 100), rel=1e-9)
    # one burst: P(X >= 1) = 1 - (1 - p)^n = 1 - confidence
    assert lower_bound(1, 100, 0.999) == pytest.approx(1 - 0.999 ** (1 / 100), rel=1e-9)


def test_the_bound_grows_with_what_was_seen_and_with_fewer_bursts():
    bounds = [lower_bound(k, 100, 0.999) for k in range(101)]
    assert bounds == sorted(bounds) and len(set(bounds)) == 101
    assert lower_bound(5, 50, 0.999) > lower_bound(5, 100, 0.999)
    assert lower_bound(5, 100, 0.99) > lower_bound(5, 100, 0.999)


@pytest.mark.parametrize("n", [100, 300])
@pytest.mark.parametrize("confidence", [0.99, 0.999])
def test_a_controller_that_meets_99_pct_is_refuted_at_most_1_minus_confidence_of_runs(n, confidence):
    # the claim `ran_on_lower_pct <= 1` is refuted when the bound exceeds 1 %; at a true share of
    # exactly 1 % (the worst case that still meets it) the chance of that is a binomial tail
    refuted_from = next(k for k in range(n + 1) if lower_bound(k, n, confidence) > 0.01)
    p_false = sum(math.comb(n, i) * 0.01 ** i * 0.99 ** (n - i) for i in range(refuted_from, n + 1))
    assert p_false <= 1 - confidence
    # and a controller that lets a fifth of its bursts run on is refuted (100 bursts: 20 seen)
    assert lower_bound(n // 5, n, confidence) > 0.01
