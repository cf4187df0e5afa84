"""The `agentcgroup_study` fixture: the one call of a study's test. It reads the test's experiment
(its `experiment(name=...)` marker) from the config, and runs the procedure of the experiment's
`kind` (PROCEDURES), which returns a StudyOutcome for the test to assert:

    pytestmark = pytest.mark.experiment(name="exp2")

    def test_exp2_reaction_time(agentcgroup_study):
        agentcgroup_study().assert_holds()

A kind with several tests names the one (`agentcgroup_study("replication")`, density's PARTS); a
kind with one test per arm is handed the test's arm (`agentcgroup_study(arm=agentcgroup_arm)`).
An experiment the config does not have skips saying so; one of kind replay (a trace x arm
experiment) has no procedure here: its test uses `agentcgroup_run`.

May import: the harness (experiment, collect), studies.kinds, and procedures' kinds and outcome.
"""
from __future__ import annotations

import pytest

from ..harness import experiment as harness_exp
from ..harness.collect import experiment_name
from ..studies import kinds
from . import density, fidelity, multitenant, timescale
from .outcome import StudyOutcome

#: kind -> its procedure: run(request, study, exp, part=None, arm=None) -> StudyOutcome
PROCEDURES = {"timescale": timescale.run, "multitenant": multitenant.run, "density": density.run,
              "fidelity": fidelity.run}


@pytest.fixture
def agentcgroup_study(request: pytest.FixtureRequest):
    """Factory: `agentcgroup_study(part=None, *, arm=None)` runs the test's experiment by its kind's
    procedure and returns its StudyOutcome (`.assert_holds()`)."""
    def run(part: str | None = None, *, arm: str | None = None) -> StudyOutcome:
        name = experiment_name(request.node)
        if not name:
            pytest.fail(f"{request.node.nodeid}: uses agentcgroup_study but has no "
                        "@pytest.mark.experiment(name=...) marker", pytrace=False)
        study, exp = harness_exp.experiment(request.config, name)        # skips when the config has none
        procedure = PROCEDURES.get(exp.kind)
        if procedure is None:
            pytest.fail(f"{study.path}: experiments.{name}.kind is {exp.kind!r}, which has no study procedure "
                        f"({', '.join(PROCEDURES)} have); a {kinds.REPLAY} experiment's test uses agentcgroup_run",
                        pytrace=False)
        return procedure(request, study, exp, part=part, arm=arm)
    return run
