"""pytest-agentcgroup: every trace × arm of an experiment is a test that replays the trace in real
per-step cgroups, checks the experiment's budgets, and reports its metrics through pytest-benchmark.

Settings (each is a command-line option, an ini key and, where it makes sense, a marker keyword;
`setting()` is the one place that decides which wins: option > marker > ini > config file > default):

    --agentcgroup-config FILE      agentcgroup_config       experiments/agentcgroup.toml
    --agentcgroup-out DIR          agentcgroup_out          results
    --agentcgroup-traces DIR       agentcgroup_traces       `traces` of the config file
    --agentcgroup-subset NAME      agentcgroup_subset       the experiment's subset      (marker: subset=)
    --agentcgroup-arms A,B         agentcgroup_arms         the experiment's arms        (marker: arms=)
    --agentcgroup-executor NAME    agentcgroup_executor     emulate (emulate | sandbox | docker)
    --agentcgroup-time-scale X     agentcgroup_time_scale   the experiment's time_scale
    --agentcgroup-step-timeout S   agentcgroup_step_timeout the experiment's step_timeout_s
    --agentcgroup-resume           agentcgroup_resume       off: skip tests already complete in the results
    --agentcgroup-isolate          agentcgroup_isolate      off: a disjoint cpuset + memory share per xdist worker
    --agentcgroup-baseline PATH    agentcgroup_baseline     none: the regression gate's baseline
    --agentcgroup-gate-rules R     agentcgroup_gate_rules   metrics/gate.py DEFAULT_RULES
    --agentcgroup-save-baseline P  agentcgroup_save_baseline  none: write this run's baseline to P
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from . import config as cfgmod
from .bpf.controller import Rules, missing_features, policy_for
from .bpf.loader import BPFBuildError, BPFUnavailable
from .cgroups import CgroupUnavailable, RunTree, detect
from .cgroups.arms import Arm, ArmPlacement
from .cgroups.container import cgroup_parent, steps_in_container
from .cgroups.isolate import WorkerIsolation
from .metrics import benchjson, budgets, gate
from .metrics.controller import (REPORT_EXPERIMENT, WORKERINPUT_CONTINUES, WORKERINPUT_RUN, ControllerSettings,
                                 MetricsController)
from .metrics.records import SUMMARY_METRICS, step_record, summarize
from .metrics.store import METRICS_FILE, ResultsStore, read_records, run_key
from .replay import ExecutorUnavailable, make_executor, replay
from .replay.docker_engine import DockerEngine
from .reports.table import format_summary
from .traces.corpus import Corpus
from .traces.ir import Trace, TraceError

# name -> (help, default, type, marker keyword or None)
SETTINGS = {
    "config": ("experiment configuration file (TOML: arms, experiments, budgets)", "experiments/agentcgroup.toml", str, None),
    "out": ("results directory: each run writes its own NNNN_<time>/ (metrics.jsonl, a line per step, and "
            "summary.json); `latest` points at the newest", "results", str, None),
    "traces": ("trace corpus directory (holding manifest.json); default: the config file's `traces`", None, str, None),
    "subset": ("manifest subset or comma-separated trace ids to replay, for every experiment", None, str, "subset"),
    "arms": ("comma-separated arm names to run, for every experiment", None, str, "arms"),
    "executor": ("how steps run: emulate (reproduce the recorded profile), sandbox (real command under bubblewrap) or docker (real command in a container)", None, str, None),
    "time_scale": ("multiply recorded durations by this factor when replaying", None, float, None),
    "step_timeout": ("per-step timeout in seconds", None, float, None),
    "resume": ("continue the newest run when it did not finish: skip every trace x arm (x seed x params) "
               "already complete in it, redo partial ones (a finished newest run: start a new run)", False, bool, None),
    "isolate": ("under xdist, give each worker a disjoint cpuset and an equal share of the memory", False, bool, None),
    "baseline": ("regression gate: compare this run with a baseline (file, run directory, or results "
                 "directory = its newest run); "
                 "a regression fails the run", None, str, None),
    "gate_rules": ("regression gate rules, METRIC=+N|+X%|+X%+N|exact, comma-separated", gate.DEFAULT_RULES, str, None),
    "save_baseline": ("write this run's results as a baseline file", None, str, None),
}
_PATH_SETTINGS = ("config", "out", "traces", "baseline", "save_baseline")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agentcgroup", "trace-driven cgroup experiments")
    for name, (help_, default, type_, _marker) in SETTINGS.items():
        flag = "--agentcgroup-" + name.replace("_", "-")
        extra = {"action": "store_const", "const": True} if type_ is bool else {}
        group.addoption(flag, dest=f"agentcgroup_{name}", default=None, help=f"{help_} (ini: agentcgroup_{name})", **extra)
        parser.addini(f"agentcgroup_{name}", help_, default=None)


def setting(config: pytest.Config, name: str, *, marker=None, experiment: cfgmod.Experiment | None = None):
    """The one precedence rule: command line > marker keyword > ini > config file > built-in default."""
    _help, default, type_, marker_kw = SETTINGS[name]
    value, base = config.getoption(f"agentcgroup_{name}"), Path.cwd()
    if value is None and marker is not None and marker_kw and marker_kw in marker.kwargs:
        value = marker.kwargs[marker_kw]
    if value is None:
        value, base = config.getini(f"agentcgroup_{name}"), config.rootpath
    if value in (None, "", []) and experiment is not None:
        value = {"subset": experiment.subset, "arms": ",".join(experiment.arms),
                 "executor": experiment.settings["executor"], "time_scale": experiment.settings["time_scale"],
                 "step_timeout": experiment.settings["step_timeout_s"]}.get(name)
    if value in (None, "", []):
        value, base = default, config.rootpath
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = ",".join(value)
    try:
        value = _boolean(value) if type_ is bool else type_(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"agentcgroup_{name}: expected {type_.__name__}, got {value!r}") from None
    if name in _PATH_SETTINGS:
        value = str((base / value).resolve())
    return value


def _boolean(value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "experiment(name, subset=None, arms=None): an agentcgroup experiment; its test is "
        "parametrized over the experiment's traces x arms (select with -m \"experiment(name='exp1')\")")
    config.stash[_STATE] = _State()
    if hasattr(config, "workerinput"):         # an xdist worker: the controller does the rest
        return
    try:
        rules = gate.parse_rules(setting(config, "gate_rules"))
    except gate.GateError as exc:
        raise pytest.UsageError(f"--agentcgroup-gate-rules: {exc}") from None
    controller = MetricsController(config, ControllerSettings(
        out=Path(setting(config, "out")), resume=setting(config, "resume"), baseline=setting(config, "baseline"),
        rules=rules, save_baseline=setting(config, "save_baseline")))
    config.stash[_CONTROLLER] = controller
    config.pluginmanager.register(controller, "agentcgroup-controller")
    if config.getoption("dist", "no") != "no" and not setting(config, "isolate"):
        config.issue_config_time_warning(pytest.PytestWarning(
            "agentcgroup: xdist workers share CPUs and memory, so latency measured by one includes the "
            "others' load; use --agentcgroup-isolate for a disjoint cpuset and memory share per worker"), stacklevel=2)


# ---------------------------------------------------------------------------------------------
# Session state

@dataclass
class _State:
    experiments: cfgmod.Config | None = None
    corpus: Corpus | None = None
    tree: RunTree | None = None
    isolation: WorkerIsolation | None = None
    store: ResultsStore | None = None
    summaries: list = field(default_factory=list)
    failures: dict = field(default_factory=dict)
    policies: dict = field(default_factory=dict)      # Arm -> its session's controller (policy arms only)
    policy_errors: dict = field(default_factory=dict)  # Arm -> why its eBPF program failed to build

    def load_config(self, config: pytest.Config) -> cfgmod.Config:
        if self.experiments is None:
            try:
                self.experiments = cfgmod.load(setting(config, "config"))
            except cfgmod.ConfigError as exc:
                pytest.fail(str(exc), pytrace=False)
        return self.experiments

    def load_corpus(self, config: pytest.Config) -> Corpus:
        if self.corpus is None:
            root = setting(config, "traces") or str(self.load_config(config).traces)
            try:
                self.corpus = Corpus.open(root)
            except TraceError as exc:
                pytest.fail(f"trace corpus: {exc}", pytrace=False)
        return self.corpus


_STATE = pytest.StashKey[_State]()
_CONTROLLER = pytest.StashKey[MetricsController]()
_REPLAY_SECONDS = pytest.StashKey[float]()


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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "agentcgroup_case" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("experiment")
    name = (marker.kwargs.get("name") or (marker.args[0] if marker.args else None)) if marker else None
    if not name:
        pytest.fail(f"{metafunc.definition.nodeid}: uses agentcgroup_case but has no "
                    "@pytest.mark.experiment(name=...) marker", pytrace=False)
    state = metafunc.config.stash[_STATE]
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


# ---------------------------------------------------------------------------------------------
# Fixtures: host -> run tree (session) -> workload cgroup (test) -> step cgroups / replay

@pytest.fixture(scope="session")
def agentcgroup_tree(request: pytest.FixtureRequest):
    """The run's cgroup root under this process's own cgroup; removed at the end of the session.
    Skips (naming what is missing) where cgroups cannot be created."""
    state = request.config.stash[_STATE]
    try:
        tree = state.tree = RunTree(detect())
    except CgroupUnavailable as exc:
        pytest.skip(f"cgroups unavailable: {exc}")
    isolation = None
    try:
        if setting(request.config, "isolate") and "PYTEST_XDIST_WORKER" in os.environ:
            try:
                isolation = state.isolation = WorkerIsolation(
                    tree, int(os.environ["PYTEST_XDIST_WORKER"][2:]), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
            except CgroupUnavailable as exc:
                pytest.skip(f"--agentcgroup-isolate: {exc}")
        yield tree
    finally:
        if isolation is not None:
            isolation.close()
            state.isolation = None
        tree.close()
        state.tree = None


@pytest.fixture
def workload_cgroup(request: pytest.FixtureRequest, agentcgroup_tree: RunTree):
    """This test's own cgroup (a child of the run root); killed and removed after the test."""
    cg = agentcgroup_tree.workload(request.node.name)
    try:
        yield cg
    finally:
        cg.remove()


@pytest.fixture
def step_cgroups(workload_cgroup, agentcgroup_tree: RunTree):
    """Factory: `step_cgroups(name, arm=None, inner=False)` makes a child of the workload cgroup, with
    the arm's limits when given: a leaf that processes join, or with inner=True a node for cgroups
    of its own. The workload's removal removes them too."""
    def make(name: str, arm: Arm | None = None, *, inner: bool = False):
        cg = workload_cgroup.child(name, agentcgroup_tree.controllers, inner=inner)
        if arm is not None:
            arm.apply(cg)
        return cg
    return make


@pytest.fixture(scope="session")
def agentcgroup_docker(request: pytest.FixtureRequest, agentcgroup_tree: RunTree):
    """The Docker engine (a running one, or a dockerd started now and stopped at the end of the
    session; under --agentcgroup-isolate started outside the worker's cpuset, which its containers'
    cgroups then nest in). Every container the session made is removed at its end. Skips naming
    what is missing."""
    isolation = request.config.stash[_STATE].isolation
    try:
        engine = DockerEngine.acquire(join=isolation.outside if isolation else ())
    except ExecutorUnavailable as exc:
        pytest.skip(f"docker: {exc}")
    try:
        yield engine
    finally:
        engine.release()


@pytest.fixture
def agentcgroup_trace(request: pytest.FixtureRequest, agentcgroup_case: Case) -> Trace:
    try:
        return request.config.stash[_STATE].load_corpus(request.config).load(agentcgroup_case.trace_id)
    except TraceError as exc:
        pytest.fail(f"trace {agentcgroup_case.trace_id}: {exc}", pytrace=False)


@dataclass
class Outcome:
    """What one replay of a trace under an arm produced."""
    case: Case
    records: list[dict]

    @property
    def summary(self) -> dict:
        return summarize(self.records, self.case.arm.name)

    def violations(self, budget: dict | None = None) -> list[budgets.Violation]:
        budget = self.case.experiment.budgets.get(self.case.arm.name, {}) if budget is None else budget
        return budgets.check(self.records, budget, self.case.arm)

    def assert_within_budget(self, budget: dict | None = None) -> None:
        """Fail naming trace, step, counter and budget for every violation of the experiment's
        budget for this arm (or of `budget`)."""
        bad = self.violations(budget)
        if bad:
            lines = "\n  ".join(str(v) for v in bad)
            pytest.fail(f"{self.case.experiment.name} under arm {self.case.arm.name}: "
                        f"{len(bad)} budget violation(s):\n  {lines}", pytrace=False)


@pytest.fixture
def agentcgroup_replayer(request: pytest.FixtureRequest, agentcgroup_case: Case, agentcgroup_trace: Trace,
                         workload_cgroup, agentcgroup_tree: RunTree, agentcgroup_placement):
    """A callable replaying this test's trace under its arm, step by step, in `workload_cgroup`.
    Each step's record is appended (and flushed) to metrics.jsonl as soon as the step ends."""
    config, case = request.config, agentcgroup_case
    marker = request.node.get_closest_marker("experiment")
    time_scale = setting(config, "time_scale", marker=marker, experiment=case.experiment)
    executor_name = setting(config, "executor", marker=marker, experiment=case.experiment)
    store = _store(config)
    steps = {s.step_id: s for s in agentcgroup_trace.steps}
    # Decide whether this test runs at all before anything is started or any result dropped: a
    # complete result is kept, a policy arm this host cannot run skips (its earlier lines kept too).
    resume = setting(config, "resume")
    if resume and store.complete(case.key, len(steps)):
        pytest.skip(f"resume: {case} is already complete in {store.path}")
    _arm_policy(config, case.arm)
    docker = {}
    if executor_name == "docker":
        docker = {"engine": request.getfixturevalue("agentcgroup_docker"),
                  "cgroup_parent": cgroup_parent(agentcgroup_tree, workload_cgroup)}
    try:
        executor = make_executor(executor_name, time_scale=time_scale, **docker,
                                 step_timeout_s=setting(config, "step_timeout", marker=marker, experiment=case.experiment))
        if docker:          # the image (built once when missing) before replay: a failed build skips
            executor.image = executor.image or executor.image_for(agentcgroup_trace)
    except ExecutorUnavailable as exc:
        pytest.skip(str(exc))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if resume:
        store.restart(case.key)          # a partial earlier attempt: its lines go, the trace is redone

    def run() -> Outcome:
        records: list[dict] = []

        def on_step(result):
            rec = {"experiment": case.experiment.name, "seed": case.seed, "params": case.params,
                   **step_record(result, steps[result.step_id], config=case.arm.name,
                                 time_scale=time_scale, executor=executor_name)}
            records.append(rec)
            store.append(rec)

        nest_in = steps_in_container(agentcgroup_tree, workload_cgroup, executor) if docker else None
        try:
            replay(agentcgroup_trace, executor, agentcgroup_placement(case.arm, nest_in=nest_in, pool=True),
                   on_step=on_step)
        except ExecutorUnavailable as exc:      # raised by executor.start(), before any step ran
            pytest.skip(str(exc))
        except Exception as exc:                # the executor crashed: the test fails, its records are kept
            done = {r["step_id"] for r in records}
            at = next((s.step_id for s in agentcgroup_trace.steps if s.step_id not in done), None)
            exc.add_note(f"agentcgroup: the {executor_name} executor crashed replaying {case.trace_id} under arm "
                         f"{case.arm.name}" + (f" at step {at}" if at is not None else " after its last step")
                         + f"; {len(records)} step record(s) kept in {store.path}")
            raise
        bad = budgets.harness_failures(records, executor_name)
        if bad:                                 # whatever the arm's budget says: nothing passes silently
            lines = "\n  ".join(bad)
            pytest.fail(f"{case.experiment.name} under arm {case.arm.name}: {len(bad)} step(s) did not run "
                        f"as replayed ({executor_name} executor; records kept in {store.path}):\n  {lines}",
                        pytrace=False)
        return Outcome(case, records)
    return run


# ---------------------------------------------------------------------------------------------
# Policy arms (`policy = "agentcgroup"`: the agentcgroup arm and its bpf-soft control): one controller
# per arm for the whole session (the eBPF program is compiled once), its event loop running in a
# thread while a test places steps with it; closed at the end of the session, also on failure and
# Ctrl-C, so no program of ours stays loaded.

@pytest.fixture(scope="session")
def agentcgroup_policies(request: pytest.FixtureRequest, agentcgroup_tree: RunTree):
    """Arm -> the session's controller of that policy arm (made on first use). Keyed by the arm
    itself, not its name: a sweep's ablation of an arm is another arm with the same name."""
    state = request.config.stash[_STATE]
    try:
        yield state.policies
    finally:
        _close_policies(state)


def _close_policies(state: _State) -> None:
    while state.policies:
        _, ctl = state.policies.popitem()
        ctl.close()


def _arm_policy(config: pytest.Config, arm: Arm):
    """The session's controller of a policy arm (None for a static arm); skips naming the missing
    kernel feature where the arm needs eBPF and the host has none."""
    if arm.policy is None:
        return None
    policies = config.stash[_STATE].policies
    errors = config.stash[_STATE].policy_errors
    if arm in errors:                          # compiled once per session: later tests fail the same way
        pytest.fail(errors[arm], pytrace=False)
    if arm not in policies:
        why = missing_features(Rules.from_arm(arm))
        if why:
            pytest.skip(f"arm {arm.name} needs eBPF: {why}")
        try:
            policies[arm] = policy_for(arm)
        except BPFUnavailable as exc:          # a missing kernel feature or privilege: not ours to fix
            pytest.skip(f"arm {arm.name} needs eBPF: {exc}")
        except BPFBuildError as exc:           # our program is broken: that is a failure, never a skip
            errors[arm] = f"arm {arm.name}: {exc}"
            pytest.fail(errors[arm], pytrace=False)
    return policies[arm]


@pytest.fixture
def agentcgroup_placement(request: pytest.FixtureRequest, workload_cgroup, agentcgroup_tree: RunTree,
                          agentcgroup_policies):
    """Factory: `agentcgroup_placement(arm=None, workload=None, *, kind_of=None, nest_in=None,
    pool=False)` -> an ArmPlacement (the replayer's Placement) of `arm` (an Arm or an arm name of
    the config; default: this test's arm) in `workload` (default: this test's cgroup). A policy
    arm's controller runs until the end of the test. `kind_of(step)` names what the policy's
    priorities are keyed by (default: the step's kind, traces/classify.py step_kind); `nest_in()`
    the cgroup steps are made under instead of the workload (a container's: cgroups/container.py
    steps_in_container); `pool` makes step cgroups between steps, off their path (cgroups/pool.py)."""
    running = []

    def make(arm: Arm | str | None = None, workload=None, *, kind_of=None, nest_in=None, pool=False) -> ArmPlacement:
        if arm is None:
            arm = request.getfixturevalue("agentcgroup_case").arm
        elif isinstance(arm, str):
            conf = request.config.stash[_STATE].load_config(request.config)
            if arm not in conf.arms:
                pytest.fail(f"arm {arm!r} is not defined in {conf.path} (defined: {', '.join(conf.arms)})", pytrace=False)
            arm = conf.arms[arm]
        policy = _arm_policy(request.config, arm)
        if policy is not None and policy not in running:
            policy.start()
            running.append(policy)
        return ArmPlacement(arm, workload if workload is not None else workload_cgroup,
                            agentcgroup_tree.controllers, policy=policy, kind_of=kind_of, nest_in=nest_in, pool=pool)
    try:
        yield make
    finally:
        for policy in running:
            policy.stop()


@pytest.fixture
def agentcgroup_run(request: pytest.FixtureRequest, agentcgroup_replayer, agentcgroup_case: Case, benchmark):
    """Replay once through pytest-benchmark (`pedantic`, one round) and put the metrics — each with
    unit, direction and provenance — into `benchmark.extra_info`, so `--benchmark-json` exports
    every trace × arm. Returns the Outcome."""
    def run() -> Outcome:
        box = []
        benchmark.group = agentcgroup_case.experiment.name
        start = time.perf_counter()
        benchmark.pedantic(lambda: box.append(agentcgroup_replayer()), rounds=1, iterations=1, warmup_rounds=0)
        request.node.stash[_REPLAY_SECONDS] = time.perf_counter() - start    # xdist: benchmark times nothing
        outcome = box[0]
        s = outcome.summary
        benchmark.extra_info.update({
            "experiment": agentcgroup_case.experiment.name, "arm": agentcgroup_case.arm.name,
            "trace_id": agentcgroup_case.trace_id, "limits": agentcgroup_case.arm.limits,
            "seed": agentcgroup_case.seed, "params": agentcgroup_case.params,
            "metrics": {k: SUMMARY_METRICS[k].describe(v) for k, v in s.items() if k in SUMMARY_METRICS},
            "steps": s["total_steps"], "oom_kills": s["oom_kills"],
        })
        return outcome
    return run


def _store(config: pytest.Config) -> ResultsStore:
    """This process's results store, made when the first experiment test needs it: only then is
    the run directory made (store.py), so a session without experiments writes nothing."""
    state = config.stash[_STATE]
    if state.store is None:
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        if worker:
            # The controller chose the run (workerinput); each worker writes its own file (one
            # writer per file) and the controller merges them. A continued run's file was
            # consolidated by the controller before the workers started; a worker only reads it.
            run, continues = Path(config.workerinput[WORKERINPUT_RUN]), config.workerinput[WORKERINPUT_CONTINUES]
            earlier = read_records(run / METRICS_FILE) if continues else None
            state.store = ResultsStore(run / worker, resume=continues, earlier=earlier, claim_run=run)
        else:
            run, continues = config.stash[_CONTROLLER].open_run()
            state.store = ResultsStore(run, resume=continues)
    return state.store


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """Under xdist, a benchmark's entry travels to the controller on the call report."""
    report = yield
    if "PYTEST_XDIST_WORKER" in os.environ and "agentcgroup_case" in getattr(item, "fixturenames", ()):
        setattr(report, REPORT_EXPERIMENT, True)     # the controller points results/latest at the run
    fixture = getattr(item, "funcargs", {}).get("benchmark")
    if call.when == "call" and "PYTEST_XDIST_WORKER" in os.environ and getattr(fixture, "_mode", None) \
            and not fixture.has_error:
        seconds = item.stash.get(_REPLAY_SECONDS, report.duration)
        setattr(report, benchjson.REPORT_ATTR, benchjson.entry(fixture, seconds))
    return report


@pytest.hookimpl(trylast=True)    # after pytest's own session teardown of fixtures
def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    _close_policies(state)           # a session interrupted before fixture teardown
    if state.tree is not None:
        state.tree.close()
        state.tree = None
    if state.isolation is not None:
        state.isolation.close()
        state.isolation = None
    records = []
    if state.store is not None:
        state.summaries, records = state.store.close(), state.store.records
    controller = session.config.stash.get(_CONTROLLER, None)
    if controller is not None:
        state.summaries = controller.finish(session, records, state.summaries)


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None or not state.summaries:
        return
    terminalreporter.write_sep("=", "agentcgroup summary")
    for line in format_summary(state.summaries).splitlines():
        terminalreporter.write_line(line)
    controller = config.stash.get(_CONTROLLER, None)
    run = controller.run if controller is not None else None
    terminalreporter.write_line(f"results: {run or setting(config, 'out')} (metrics.jsonl, summary.json)")
