"""Collection: an experiment's test becomes one test per trace x arm (x matrix point: seeds,
ablations, sizes), each with a stable, readable id.

May import: config, traces/, cgroups.arms, metrics.store (a case's results key) and the harness's
settings and state.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from .. import config as cfgmod
from ..cgroups.arms import Arm
from ..metrics.store import run_key
from ..traces.ir import TraceError
from .settings import setting
from .state import STATE


@dataclass(frozen=True)
class Case:
    """One parametrized test: an experiment's trace under one arm (at one point of its matrix)."""
    experiment: cfgmod.Experiment
    trace_id: str
    arm: Arm
    variant: cfgmod.Variant = field(default_factory=cfgmod.Variant)
    with_seed: bool = False          # the matrix has seeds, so the id names the seed

    @property
    def seed(self) -> int:
        return self.variant.seed

    @property
    def params(self) -> dict:
        return self.variant.params

    @property
    def key(self) -> tuple:
        """The results store's key of this test's records."""
        return run_key(self.experiment.name, self.arm.name, self.trace_id, self.seed, self.params)

    def __str__(self) -> str:
        return case_id(self.arm.name, self.trace_id) + self.variant.id(self.with_seed)


def case_id(arm: str, trace_id: str) -> str:
    """Stable, readable test id: `<arm>:<trace id without its format prefix>`."""
    short = trace_id.split("/", 1)[1] if "/" in trace_id else trace_id
    return f"{arm}:{short}"


def generate_tests(metafunc: pytest.Metafunc) -> None:
    """plugin.py's pytest_generate_tests: a test using `agentcgroup_case` gets one case per trace x arm
    (x matrix point) of its experiment."""
    if "agentcgroup_case" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("experiment")
    name = (marker.kwargs.get("name") or (marker.args[0] if marker.args else None)) if marker else None
    if not name:
        pytest.fail(f"{metafunc.definition.nodeid}: uses agentcgroup_case but has no "
                    "@pytest.mark.experiment(name=...) marker", pytrace=False)
    state = metafunc.config.stash[STATE]
    conf = state.load_config(metafunc.config)
    if name not in conf.experiments:
        pytest.fail(f"{conf.path}: no [experiments.{name}] (needed by {metafunc.definition.nodeid})", pytrace=False)
    exp = conf.experiments[name]
    corpus = state.load_corpus(metafunc.config)
    try:
        trace_ids = corpus.ids(setting(metafunc.config, "subset", marker=marker, experiment=exp))
    except TraceError as exc:
        pytest.fail(f"--agentcgroup-subset: {exc}", pytrace=False)
    arm_names = [a.strip() for a in setting(metafunc.config, "arms", marker=marker, experiment=exp).split(",") if a.strip()]
    for a in arm_names:
        if a not in conf.arms:
            pytest.fail(f"arm {a!r} is not defined in {conf.path} (defined: {', '.join(conf.arms)})", pytrace=False)
    with_seed = any(v.seed for v in exp.matrix)       # seeds are distinct: more than one means a non-zero one
    cases = []
    for variant, vexp, varms in exp.variants(conf.arms):       # the matrix: seeds x ablations x sizes
        vtraces = trace_ids
        if vexp.subset != exp.subset:
            try:
                vtraces = corpus.ids(setting(metafunc.config, "subset", marker=marker, experiment=vexp))
            except TraceError as exc:
                pytest.fail(f"{conf.path}: experiments.{name}.matrix: {exc}", pytrace=False)
        cases += [Case(vexp, t, varms[a], variant, with_seed) for a in arm_names for t in vtraces]
    metafunc.parametrize("agentcgroup_case", cases, ids=[str(c) for c in cases], scope="function")
