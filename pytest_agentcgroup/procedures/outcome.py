"""What a study's test asserts: the outcome its procedure returns (StudyOutcome), so that the test
file is the marker, one call and the assertion (`outcome.assert_holds()`).

May import: the harness (experiment: how a test ends on claims), studies (claims).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from ..harness import experiment as harness_exp
from ..studies import claims as claimlang


@dataclass
class StudyOutcome:
    """A study test's verdicts (its claims, checked), what else went wrong (`problems`: each fails
    the test), and `unchecked`: why a check of its own could not be made here (a skip, when nothing
    failed)."""
    title: str
    verdicts: list[claimlang.Verdict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    unchecked: str | None = None

    def assert_holds(self) -> None:
        """Fails the test on a refuted (or unmeasured) claim or a problem, naming every claim with
        its values and verdict; skips it when a claim or check could not be made (never a pass)."""
        harness_exp.outcome(self.verdicts, self.title, self.problems)
        if self.unchecked is not None:
            pytest.skip(self.unchecked)
