"""Collection: an experiment's test becomes one test per trace x arm (x matrix point: seeds,
ablations, sizes), each with a stable, readable id; a test using `agentcgroup_arm` one test per arm.
An experiment the config does not have, or whose arms the selection leaves out, is one skipped test
saying so (never a collection error: `-k exp1` with a config holding only exp1 runs).
`--agentcgroup-shard K/N` then keeps the tests of shard K: a test's shard is a hash of its node id
(`shard_of`), so each test is in exactly one of the N shards whatever else a run selects.

May import: config, traces/, arms, metrics (store: a case's results key), studies (kinds) and the
harness's settings and state.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field, replace

import pytest

from .. import config as cfgmod
from ..arms import Arm
from ..metrics.store import run_key
from ..studies import kinds
from ..traces.ir import TraceError
from .settings import setting, shard
from .state import STATE


@dataclass(frozen=True)
class Case:
    """One parametrized test: an experiment's trace under one arm (at one point of its matrix)."""
    experiment: cfgmod.Experiment
    trace_id: str
    arm: Arm
    variant: cfgmod.Variant = field(default_factory=cfgmod.Variant)
    with_seed: bool = False          # the matrix has seeds, so the id names the seed
    full_id: bool = False            # another trace of the corpus has the same id without its family

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
        return case_id(self.arm.name, self.trace_id, self.full_id) + self.variant.id(self.with_seed)


def short_id(trace_id: str) -> str:
    """A trace id without its family (`claude-code/local/x` -> `local/x`)."""
    return trace_id.split("/", 1)[1] if "/" in trace_id else trace_id


def case_id(arm: str, trace_id: str, full: bool = False) -> str:
    """Stable, readable test id: `<arm>:<trace id without its family>`, or with it (`full`) where
    the corpus has two traces of one id in two families (a recorded copy and its 1 Hz original):
    decided on the corpus, not the run, so a trace's id is the same whatever else a run selects."""
    return f"{arm}:{trace_id if full else short_id(trace_id)}"


def experiment_name(definition) -> str | None:
    """The name in a test's @pytest.mark.experiment(name=...) marker."""
    marker = definition.get_closest_marker("experiment")
    return (marker.kwargs.get("name") or (marker.args[0] if marker.args else None)) if marker else None


def case_of(item: pytest.Item) -> tuple[str, str] | None:
    """(experiment, arm) of a test made by generate_tests; None for any other test (or a skipped
    placeholder)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    case, arm = params.get("agentcgroup_case"), params.get("agentcgroup_arm")
    if isinstance(case, Case):
        return case.experiment.name, case.arm.name
    name = experiment_name(item)
    return (name, arm) if isinstance(arm, str) and name else None


def missing(conf: cfgmod.Config, name: str) -> str:
    """The skip reason of an experiment the config does not have."""
    return f"experiment {name} is not in {conf.path} (no [experiments.{name}] section)"


def selected_arms(config: pytest.Config, conf: cfgmod.Config, exp: cfgmod.Experiment,
                  marker=None) -> tuple[list[str], str | None]:
    """The arms of `exp` this session runs, and why it runs none (a skip reason). Without a
    selection: the experiment's `arms`. With one (--agentcgroup-arms, the marker's arms=, ini): the
    selected names the experiment can run (any arm of [arms]; exp2: its controllers). A name that is
    neither an arm nor any experiment's arm fails (a typo)."""
    chosen = setting(config, "arms", marker=marker)
    if chosen is None:
        return list(exp.arms), None
    names = [a.strip() for a in chosen.split(",") if a.strip()]
    known = dict.fromkeys([*conf.arms, *(a for e in conf.experiments.values() for a in e.arms)])
    for a in names:
        if a not in known:
            pytest.fail(f"arm {a!r} is not defined in {conf.path} (defined: {', '.join(known)})", pytrace=False)
    runnable = kinds.runnable_arms(exp, conf.arms)
    arms = [a for a in names if a in runnable]
    return arms, None if arms else (f"no arm of {exp.name} is selected (arms {chosen}; {exp.name} runs "
                                    f"{', '.join(runnable)})")


def _skipped(metafunc: pytest.Metafunc, argname: str, reason: str) -> None:
    metafunc.parametrize(argname, [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="not-run")],
                         scope="function")


def generate_tests(metafunc: pytest.Metafunc) -> None:
    """plugin.py's pytest_generate_tests: a test using `agentcgroup_case` gets one case per trace x arm
    (x matrix point) of its experiment; one using `agentcgroup_arm` one test per arm (its name)."""
    argname = next((a for a in ("agentcgroup_case", "agentcgroup_arm") if a in metafunc.fixturenames), None)
    if argname is None:
        return
    marker = metafunc.definition.get_closest_marker("experiment")
    name = experiment_name(metafunc.definition)
    if not name:
        pytest.fail(f"{metafunc.definition.nodeid}: uses {argname} but has no "
                    "@pytest.mark.experiment(name=...) marker", pytrace=False)
    state = metafunc.config.stash[STATE]
    conf = state.load_config(metafunc.config)
    if name not in conf.experiments:
        return _skipped(metafunc, argname, missing(conf, name))
    exp = conf.experiments[name]
    arm_names, why = selected_arms(metafunc.config, conf, exp, marker)
    if why:
        return _skipped(metafunc, argname, why)
    if argname == "agentcgroup_arm":
        return metafunc.parametrize(argname, arm_names, ids=arm_names, scope="function")
    corpus = state.load_corpus(metafunc.config)
    try:
        trace_ids = corpus.ids(setting(metafunc.config, "subset", marker=marker, experiment=exp))
    except TraceError as exc:
        pytest.fail(f"--agentcgroup-subset: {exc}", pytrace=False)
    with_seed = any(v.seed for v in exp.matrix)       # seeds are distinct: more than one means a non-zero one
    cases = []
    variants = exp.variants(conf.arms)
    for variant, vexp, varms in variants:       # the matrix: seeds x ablations x sizes
        vtraces = trace_ids
        if vexp.subset != exp.subset:
            try:
                vtraces = corpus.ids(setting(metafunc.config, "subset", marker=marker, experiment=vexp))
            except TraceError as exc:
                pytest.fail(f"{conf.path}: experiments.{name}.matrix: {exc}", pytrace=False)
        for a in arm_names:
            if swept(variants, a):
                cases += [Case(vexp, t, varms[a], variant, with_seed) for t in vtraces]
            elif variant is first_of_seed(variants, variant.seed):
                # no point changes what this arm runs: it runs once per seed, named by no point
                cases += [Case(vexp, t, varms[a], cfgmod.Variant(seed=variant.seed), with_seed) for t in vtraces]
    families = Counter(short_id(t) for t in corpus.files)
    cases = [replace(c, full_id=True) if families[short_id(c.trace_id)] > 1 else c for c in cases]
    metafunc.parametrize("agentcgroup_case", cases, ids=[str(c) for c in cases], scope="function")


def swept(variants: list, arm: str) -> bool:
    """True when some point of the matrix changes what `arm` runs: it overrides the experiment (its
    subset, executor, time scale...) or the arm itself. An arm no point changes (unlimited, oracle,
    an arm whose limits come from the trace) would measure the same thing at every point."""
    return any(set(v.overrides) - {"arms"} or arm in v.overrides.get("arms", {}) for v, _, _ in variants)


def first_of_seed(variants: list, seed: int):
    """The first point of the matrix with `seed`."""
    return next(v for v, _, _ in variants if v.seed == seed)


def shard_of(nodeid: str, n: int) -> int:
    """The shard (1..n) of a test: the first 32 bits of its node id's sha256, modulo n. Not
    Python's hash() (salted per process) nor the collection order (which a selection changes)."""
    return int(hashlib.sha256(nodeid.encode("utf-8")).hexdigest()[:8], 16) % n + 1


def select_shard(config: pytest.Config, items: list[pytest.Item]) -> None:
    """plugin.py's pytest_collection_modifyitems: with --agentcgroup-shard K/N, every test of
    another shard is deselected (reported as deselected, as `-k` does)."""
    chosen = shard(config)
    if chosen is None:
        return
    k, n = chosen
    keep = [item for item in items if shard_of(item.nodeid, n) == k]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if shard_of(item.nodeid, n) != k])
        items[:] = keep
