"""The plugin's fixtures: host -> run tree (session) -> workload cgroup (test) -> step cgroups /
replay, the Docker engine, and the policy arms' controllers. This module owns every teardown of
what they make (close_session; plugin.py's sessionfinish only calls it again after an interrupt).

May import everything below the pytest side (arms, traces/, proc, replay/, engines/, cgroups/, bpf/,
metrics/, studies/, config) and the harness's settings, state, collect, environment and session.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..arms import Arm, ArmError, Rules
from ..bpf.controller import missing_features, policy_for
from ..bpf.loader import BPFBuildError, BPFUnavailable
from ..cgroups import CgroupUnavailable, RunTree, detect
from ..cgroups.container import cgroup_parent, steps_in_container
from ..cgroups.isolate import WorkerIsolation
from ..cgroups.placement import ArmPlacement, apply_limits
from ..engines.docker import DockerEngine
from ..limits import step_limits
from ..metrics import reservation
from ..metrics.records import SUMMARY_METRICS, step_record, summarize
from ..replay import ExecutorUnavailable, make_executor, replay
from ..replay.executors.base import SeedFailed
from ..studies import budgets
from ..traces.classify import step_kind
from ..traces.ir import Trace, TraceError
from . import environment, faithful
from .collect import Case
from .session import results_store
from .settings import setting
from .state import CONTROLLER, REPLAY_SECONDS, STATE, State


@pytest.fixture(scope="session")
def agentcgroup_tree(request: pytest.FixtureRequest):
    """The run's cgroup root under this process's own cgroup; removed at the end of the session.
    Skips (naming what is missing) where cgroups cannot be created."""
    state = request.config.stash[STATE]
    try:
        tree = state.tree = RunTree(detect())
    except CgroupUnavailable as exc:
        pytest.skip(f"cgroups unavailable: {exc}")
    # what the results say the run's cgroups had; `refused` is the tree's own dict, so refusals
    # met later (a test's cgroup, a container's) are in it too
    state.run_tree = {"controllers": list(tree.controllers), "refused": tree.refused}
    controller = request.config.stash.get(CONTROLLER, None)
    if controller is not None:                # serial (a worker's reports carry it: session.mark_report)
        controller.run_trees.append(state.run_tree)
    worker = getattr(request.config, "workerinput", None)     # an xdist worker (never an inherited env var)
    try:
        if setting(request.config, "isolate") and worker is not None:
            try:
                state.isolation = WorkerIsolation(tree, int(worker["workerid"][2:]), int(worker["workercount"]))
            except CgroupUnavailable as exc:
                pytest.skip(f"--agentcgroup-isolate: {exc}")
        yield tree
    finally:
        close_session(state)


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
            apply_limits(arm, cg)
        return cg
    return make


@pytest.fixture(scope="session")
def agentcgroup_docker(request: pytest.FixtureRequest, agentcgroup_tree: RunTree):
    """The Docker engine (a running one, or a dockerd started now and stopped at the end of the
    session; under --agentcgroup-isolate started outside the worker's cpuset, which its containers'
    cgroups then nest in). Every container the session made is removed at its end. Skips naming
    what is missing."""
    isolation = request.config.stash[STATE].isolation
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
        return request.config.stash[STATE].load_corpus(request.config).load(agentcgroup_case.trace_id)
    except TraceError as exc:
        error = str(exc)
    # outside the except: the message once, not again as "During handling of the above exception"
    pytest.fail(f"trace {agentcgroup_case.trace_id}: {error}", pytrace=False)


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
    store = results_store(config)
    steps = {s.step_id: s for s in agentcgroup_trace.steps}
    # Decide whether this test runs at all before anything is started or any result dropped: a
    # complete result is kept, a policy arm this host cannot run skips (its earlier lines kept too).
    resume = setting(config, "resume")
    if resume and store.complete(case.key, len(steps)):
        pytest.skip(f"resume: {case} is already complete in {store.path}")
    if executor_name == "emulate":      # the emulator allocates a step's memory: it must fit this host
        _fits_host(config, case, agentcgroup_trace)
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
    # real commands: the task's workspace (built on first use), or a failure naming the missing one
    provided, lacking = faithful.workspace(config, case, agentcgroup_trace, executor, executor_name, marker=marker)
    restart_pending = resume             # a partial earlier attempt's lines go with the first new record
    machine = environment.record_fields(agentcgroup_tree.host.mode)
    source_recorded = any(s.recorded_outcome is not None for s in agentcgroup_trace.steps)

    def run() -> Outcome:
        faithful.missing(lacking)        # a task without its workspace: the test fails, nothing replayed
        records: list[dict] = []

        def on_step(result):
            nonlocal restart_pending
            if restart_pending:          # not before the first new record: a test that skips before
                restart_pending = False  # replaying (no cpu controller, no executor) keeps them
                store.restart(case.key)
            rec = {"experiment": case.experiment.name, "seed": case.seed, "params": case.params,
                   "trace_steps": len(steps),      # how many records make this test complete
                   **machine,                      # which host measured it: hostname, kernel, cgroup mode
                   **step_record(result, steps[result.step_id], config=case.arm.name,
                                 time_scale=executor.time_scale, executor=executor_name,
                                 source_recorded=source_recorded),
                   # GiB·s reserved / used (the usage the placement samples: sample_usage below)
                   **reservation.step_fields(result, steps[result.step_id], arm=case.arm,
                                             trace=agentcgroup_trace, time_scale=executor.time_scale),
                   **faithful.record_fields(provided, first=not records)}
            records.append(rec)
            store.append(rec)

        nest_in = steps_in_container(agentcgroup_tree, workload_cgroup, executor) if docker else None
        try:
            # the policy's timers at the pace the steps replay (1 for real commands): one time rule
            placement = agentcgroup_placement(case.arm, nest_in=nest_in, pool=True, time_scale=executor.time_scale,
                                              trace=agentcgroup_trace)
            placement.sample_usage(reservation.SAMPLE_PERIOD_S)
            replay(agentcgroup_trace, executor, placement, on_step=on_step)
        except SeedFailed as exc:               # the workspace is there but could not be copied in
            pytest.fail(str(exc), pytrace=False)
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
        if executor_name == "emulate":
            _replayed_a_profile(config, case, records)
        faithful.check(config, case, records, marker=marker)     # steps that ended otherwise than recorded
        return Outcome(case, records)
    return run


MEMINFO = "/proc/meminfo"


def host_memory_mb(meminfo: str = MEMINFO) -> float | None:
    """This host's memory, MemTotal of /proc/meminfo, in MiB (None where it cannot be read)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024      # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def beyond_host(trace: Trace, total_mb: float) -> tuple[int, str, float] | None:
    """(step index, field, MiB) of the first step whose memory, its peak or its curve's highest
    point (what the emulator allocates), is more than `total_mb`; None when every step fits."""
    for i, st in enumerate(trace.steps):
        p = st.profile
        for field_, mb in (("profile.peak_mb.value", p.peak_mb.value if p.peak_mb else None),
                           ("profile.curve.mb", max(p.curve.mb) if p.curve else None)):
            if mb is not None and mb > total_mb:
                return i, field_, mb
    return None


def _fits_host(config: pytest.Config, case: Case, trace: Trace) -> None:
    """Fail the test at its setup, before anything runs or is recorded (the run's earlier records are
    kept), when a step of its trace needs more memory than this host has and no hard limit of the arm
    stops it below that: the emulator would try to allocate it and end in a failure that names
    neither the step nor the figure."""
    total = host_memory_mb()
    if not total or case.arm.memory_max_mb is not None and case.arm.memory_max_mb <= total:
        return                  # the arm's hard limit (on the step or its trace) stops it first: an OOM kill
    big = beyond_host(trace, total)
    if big is None:
        return
    index, field_, mb = big
    file = config.stash[STATE].load_corpus(config).files.get(case.trace_id, case.trace_id)
    step_id = trace.steps[index].step_id
    pytest.fail(f"{file}, step {index}{f' (step_id {step_id})' if step_id != index else ''}, field '{field_}': "
                f"the step needs {mb:g} MiB, more than this host's memory (MemTotal {total:.0f} MiB in {MEMINFO}); "
                f"trace {case.trace_id} is not replayed under arm {case.arm.name} (emulate executor)", pytrace=False)


def _replayed_a_profile(config: pytest.Config, case: Case, records: list[dict]) -> None:
    """Fail the test when no executed step had a profile to replay (emulate): the emulator ran
    empty steps, and every budget would pass on nothing. Some unprofiled steps are a partial replay
    (each record's profile_source says none), not a failure."""
    ran = [r for r in records if r.get("executed")]
    if any(r.get("profile_source") not in (None, "none") for r in ran):
        return
    file = config.stash[STATE].load_corpus(config).files.get(case.trace_id, case.trace_id)
    pytest.fail(f"{file}: trace {case.trace_id} has nothing to replay under the emulate executor: none of its "
                f"{len(ran)} executed step(s) has a profile (profile_source none), so {case.experiment.name} "
                f"under arm {case.arm.name} measured nothing. Give its steps profiles with `agentcgroup traces "
                f"profile` in the task's workspace, or run its real commands with --agentcgroup-executor sandbox",
                pytrace=False)


# ---------------------------------------------------------------------------------------------
# Policy arms (`policy = "agentcgroup"`: the agentcgroup arm and its bpf-soft control): one controller
# per arm for the whole session (the eBPF program is compiled once), its event loop running in a
# thread while a test places steps with it; closed at the end of the session, also on failure and
# Ctrl-C, so no program of ours stays loaded.

@pytest.fixture(scope="session")
def agentcgroup_policies(request: pytest.FixtureRequest, agentcgroup_tree: RunTree):
    """Arm -> the session's controller of that policy arm (made on first use). Keyed by the arm
    itself, not its name: a sweep's ablation of an arm is another arm with the same name."""
    state = request.config.stash[STATE]
    try:
        yield state.policies
    finally:
        close_policies(state)


def close_policies(state: State) -> None:
    while state.policies:
        _, ctl = state.policies.popitem()
        ctl.close()


def close_session(state: State) -> None:
    """The one teardown of what the session fixtures made: the policies' controllers, the worker's
    isolation, the run tree. Idempotent: the fixtures' finalizers call it, and plugin.py's
    sessionfinish calls it again for a session interrupted before fixture teardown. Each is taken
    off the state before it is closed, and closed whatever the others raised: an error is raised
    (and reported) once, never retried at the end of the session."""
    try:
        close_policies(state)
    finally:
        isolation, state.isolation = state.isolation, None
        try:
            if isolation is not None:
                isolation.close()
        finally:
            tree, state.tree = state.tree, None
            if tree is not None:
                tree.close()


def _arm_policy(config: pytest.Config, arm: Arm):
    """The session's controller of a policy arm (None for a static arm); skips naming the missing
    kernel feature where the arm needs eBPF and the host has none."""
    if arm.policy is None:
        return None
    policies = config.stash[STATE].policies
    errors = config.stash[STATE].policy_errors
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
    pool=False, time_scale=1.0)` -> an ArmPlacement (the replayer's Placement) of `arm` (an Arm or an arm name of
    the config; default: this test's arm) in `workload` (default: this test's cgroup). A policy
    arm's controller runs until the end of the test. `kind_of(step)` names what the policy's
    priorities are keyed by (default: the step's kind, traces/classify.py step_kind); `nest_in()`
    the cgroup steps are made under instead of the workload (a container's: cgroups/container.py
    steps_in_container); `pool` makes step cgroups between steps, off their path (cgroups/pool.py);
    `time_scale` the pace the steps replay at, which a policy's timers follow (executor.time_scale);
    `trace` the trace replayed, whose steps an arm with limits per step (limit_from vpa, window,
    predict: limits/) computes them for. An arm with CPU settings skips where the run has no cpu controller."""
    running = []

    def make(arm: Arm | str | None = None, workload=None, *, kind_of=None, nest_in=None, pool=False,
             time_scale: float = 1.0, trace: Trace | None = None) -> ArmPlacement:
        if arm is None:
            arm = request.getfixturevalue("agentcgroup_case").arm
        elif isinstance(arm, str):
            conf = request.config.stash[STATE].load_config(request.config)
            if arm not in conf.arms:
                pytest.fail(f"arm {arm!r} is not defined in {conf.path} (defined: {', '.join(conf.arms)})", pytrace=False)
            arm = conf.arms[arm]
        target = workload if workload is not None else workload_cgroup
        # the run may have cpu and this test's cgroup not (the kernel refused +cpu there: tree.workload)
        refused = {**agentcgroup_tree.refused, **getattr(target, "refused", {})}
        if arm.needs_cpu and ("cpu" not in agentcgroup_tree.controllers or "cpu" in getattr(target, "refused", {})):
            why = refused.get("cpu", f"controllers: {', '.join(agentcgroup_tree.controllers)}")
            pytest.skip(f"arm {arm.name} sets CPU weights or caps, and this host gives the run no cpu controller "
                        f"({why}; cgroup {agentcgroup_tree.host.unified})")
        if arm.limit_from not in (None, "step_peak") and trace is None and "agentcgroup_case" not in request.fixturenames:
            pytest.fail(f"arm {arm.name} sets limit_from = {arm.limit_from!r}: each step's limit comes from its trace, "
                        "and this test places steps of no trace it names", pytrace=False)
        try:
            limits = None if arm.limit_from in (None, "step_peak") else \
                step_limits(arm, trace if trace is not None else request.getfixturevalue("agentcgroup_trace"))
        except ArmError as exc:             # a model file that cannot be used: the config's, not the host's
            pytest.fail(str(exc), pytrace=False)
        policy = _arm_policy(request.config, arm)
        if policy is not None and policy not in running:
            policy.start()
            running.append(policy)
        return ArmPlacement(arm, target, agentcgroup_tree.controllers, policy=policy, kind_of=kind_of or step_kind,
                            nest_in=nest_in, pool=pool, time_scale=time_scale, limits=limits)
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
        request.node.stash[REPLAY_SECONDS] = time.perf_counter() - start    # xdist: benchmark times nothing
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
