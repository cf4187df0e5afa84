"""The density study (`kind = "density"`, the shipped exp5): K agents replayed at once under one host
memory budget, K stepped up (ramp.py), and AgentCgroup's own evaluation set-up (replication.py).
Settings and hypotheses: its `[experiments.<name>]` (checked at load by studies/density.py); each of
its two tests (studies/density.py PARTS) reads its own table and skips saying so without it. Its
arms (--agentcgroup-arms selects among them) run one after the other inside each test, so each test
checks the claims on its own metrics (largest_k_held; survival_pct, high_p95_alloc_ms), printing
every one with its values and verdict. The budget is one inner cgroup with a hard limit (v2
`memory.max`, v1 `memory.limit_in_bytes`) below the sum of the agents' peaks (agents.py).

May import: studies.density (its parts), procedures.outcome and this package's modules.
"""
from __future__ import annotations

import pytest

from ...studies.density import PARTS
from ..outcome import StudyOutcome
from . import ramp, replication

RUN = {"density": ramp.run, "replication": replication.run}


def run(request: pytest.FixtureRequest, study, exp, part: str | None = None, arm: str | None = None) -> StudyOutcome:
    """The test `part` of the study (one of PARTS); skips naming its table where the study has none."""
    if part not in PARTS:
        pytest.fail(f"{request.node.nodeid}: a density study has two tests, agentcgroup_study(\"density\") and "
                    f"agentcgroup_study(\"replication\"); got {part!r}", pytrace=False)
    if part not in exp.tables:
        pytest.skip(f"{study.path}: no [experiments.{exp.name}.{part}] table")
    return RUN[part](request, study, exp, exp.tables[part])
