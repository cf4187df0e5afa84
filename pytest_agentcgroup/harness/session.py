"""The session side: what each pytest process does once per session, and what travels between xdist
workers and the controller. The controller (this process serially, xdist's controller under
`-n N` or `--tx`) gets a MetricsController (controller.py), the only writer of the run directory.
Serially the store the experiment tests write to is the run's own (controller.open_store); an
xdist worker's is a WorkerStore, which writes no file: what it holds travels on the worker's test
reports to the controller, each phase's report carrying the step records written since the last
one, with the worker's run tree and, once, its machine; its benchmark entries too. At the end the
controller closes the run's store, marks and gates the run.

May import: config, traces.corpus (its manifest's name), metrics/, reports.table and the harness's settings, state,
collect, controller and environment.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from .. import config as cfgmod
from ..traces.corpus import MANIFEST
from ..metrics import benchjson, faithfulness, gate
from ..metrics.store import METRICS_FILE, ResultsStore, record_key, summaries
from ..reports.table import format_summary
from . import environment
from .collect import case_of
from .controller import (REPORT_CASE, REPORT_HOST, REPORT_RECORDS, REPORT_RUN_TREE, WORKERINPUT_DONE, WORKERINPUT_RUN,
                         ControllerSettings, MetricsController)
from .settings import check_numbers, setting, shard
from .state import CONTROLLER, REPLAY_SECONDS, STATE, State


def configure(config: pytest.Config) -> None:
    """plugin.py's pytest_configure: the session state, and on the controller its MetricsController."""
    config.stash[STATE] = State()
    check_numbers(config)                      # --agentcgroup-time-scale 0: a usage error now, not per test
    sharded = shard(config)                    # --agentcgroup-shard 3/2 too
    if hasattr(config, "workerinput"):         # an xdist worker: the controller does the rest
        return
    try:
        rules = gate.parse_rules(setting(config, "gate_rules"))
    except gate.GateError as exc:
        raise pytest.UsageError(f"--agentcgroup-gate-rules: {exc}") from None
    controller = MetricsController(config, ControllerSettings(
        out=Path(setting(config, "out")), resume=setting(config, "resume"), baseline=setting(config, "baseline"),
        rules=rules, save_baseline=setting(config, "save_baseline"), config=setting(config, "config"),
        shard="/".join(map(str, sharded)) if sharded else None, corpus=lambda: _corpus(config)))
    config.stash[CONTROLLER] = controller
    config.pluginmanager.register(controller, "agentcgroup-controller")
    if config.getoption("dist", "no") != "no" and not setting(config, "isolate"):
        config.issue_config_time_warning(pytest.PytestWarning(
            "agentcgroup: xdist workers share CPUs and memory, so latency measured by one includes the "
            "others' load; use --agentcgroup-isolate for a disjoint cpuset and memory share per worker"), stacklevel=2)


def _corpus(config: pytest.Config) -> dict:
    """run.json's corpus: the trace directory and its manifest's sha256 (the shards that
    `agentcgroup merge` joins must have replayed one corpus). Empty when the config does not load."""
    root = setting(config, "traces")
    if root is None:
        try:
            root = str(config.stash[STATE].experiments.traces if config.stash[STATE].experiments is not None
                       else cfgmod.load(setting(config, "config")).traces)
        except cfgmod.ConfigError:
            return {}
    try:
        digest = hashlib.sha256((Path(root) / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        digest = None
    return {"traces": root, "manifest_sha256": digest}


class WorkerStore:
    """An xdist worker's side of the run's store: the records its tests write, kept to travel on
    its test reports (`unsent`), never written to a file; `complete`/`restart` answer as the run's
    store would, from the steps the continued run holds (WORKERINPUT_DONE)."""

    def __init__(self, workerinput: dict):
        # named in messages only: the file is the controller's, perhaps on another machine
        self.path = Path(workerinput[WORKERINPUT_RUN]) / METRICS_FILE
        self._done = {tuple(key): set(ids) for key, ids in workerinput.get(WORKERINPUT_DONE) or []}
        self.records: list[dict] = []
        self._sent = 0

    def complete(self, key: tuple, steps: int) -> bool:
        return len(self._done.get(key, ())) >= steps > 0

    def restart(self, key: tuple) -> None:
        """The controller drops the earlier attempt's lines with the test's first new record."""
        self._done.pop(key, None)

    def append(self, record: dict) -> None:
        self.records.append(record)
        self._done.setdefault(record_key(record), set()).add(record["step_id"])

    def unsent(self) -> list[dict]:
        """The records written since the last call: what the next report carries."""
        new, self._sent = self.records[self._sent:], len(self.records)
        return new

    def summaries(self) -> list[dict]:
        return summaries(self.records)


def results_store(config: pytest.Config) -> ResultsStore | WorkerStore:
    """The store this process's experiment tests write to, made when the first of them needs it:
    only then is the run directory made (controller.open_store), so a session without
    experiments writes nothing. An xdist worker (known by its workerinput: a serial pytest
    started from a worker inherits PYTEST_XDIST_WORKER) gets a WorkerStore."""
    state = config.stash[STATE]
    if state.store is None:
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None:
            state.store = WorkerStore(workerinput)
        else:
            controller = config.stash[CONTROLLER]
            controller.hosts.setdefault(environment.node(), environment.machine())
            state.store = controller.open_store()
    return state.store


def mark_report(item: pytest.Item, call, report) -> None:
    """plugin.py's pytest_runtest_makereport: an experiment test's report says its experiment and
    arm (the controller checks claims across arms at the end); under xdist, what the worker wrote
    since its last report travels to the controller on this one: step records, the run tree when
    it changed, the machine with the first records, a benchmark's entry on the call report."""
    case = case_of(item)
    if case is not None:
        setattr(report, REPORT_CASE, case)
    if not hasattr(item.config, "workerinput"):      # not an xdist worker
        return
    state = item.config.stash[STATE]
    if isinstance(state.store, WorkerStore):
        if not state.host_sent:
            setattr(report, REPORT_HOST, environment.machine())
            state.host_sent = True
        setattr(report, REPORT_RECORDS, state.store.unsent())
    if state.run_tree is not None and state.run_tree != state.run_tree_sent:
        setattr(report, REPORT_RUN_TREE, state.run_tree)
        state.run_tree_sent = {"controllers": list(state.run_tree["controllers"]),
                               "refused": dict(state.run_tree["refused"])}
    fixture = getattr(item, "funcargs", {}).get("benchmark")
    if call.when == "call" and getattr(fixture, "_mode", None) and not fixture.has_error:
        seconds = item.stash.get(REPLAY_SECONDS, report.duration)
        setattr(report, benchjson.REPORT_ATTR, benchjson.entry(fixture, seconds))


def finish(session: pytest.Session, state: State) -> None:
    """plugin.py's sessionfinish, once the fixtures' resources are closed: on the controller the
    run's store is closed and the run marked and gated (controller.py)."""
    records = []
    controller = session.config.stash.get(CONTROLLER, None)
    if controller is not None:
        records, state.summaries = controller.finish(session)
    elif state.store is not None:                    # a worker: its own tests' share, for its summary
        state.summaries, records = state.store.summaries(), state.store.records
    state.faithful = faithfulness.summary_lines(records)


def check_claims(session: pytest.Session) -> None:
    """plugin.py's pytest_runtestloop, after the last test: on the controller, the claims that
    compare arms across tests, each experiment's as one more test report (controller.py)."""
    controller = session.config.stash.get(CONTROLLER, None)
    state = session.config.stash.get(STATE, None)
    if controller is None or state is None or not controller.arms_seen:     # only after experiment tests
        return
    try:
        conf = _experiments(session, state)
    except cfgmod.ConfigError as exc:        # e.g. the file changed while the tests ran: said, and a failure
        controller.claims_unchecked(f"claims not checked: {exc}")
        return
    controller.check_claims(controller.run_records(), conf, session)


def _experiments(session: pytest.Session, state: State) -> cfgmod.Config:
    """The config whose claims the controller checks (loaded here under xdist, where the controller
    does not collect). ConfigError when it cannot be loaded."""
    if state.experiments is None:
        state.experiments = cfgmod.load(setting(session.config, "config"))
    return state.experiments


def terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """plugin.py's pytest_terminal_summary: the run's summary table and where its results are."""
    state = config.stash.get(STATE, None)
    if state is None:
        return
    sharded = setting(config, "shard")
    if sharded:
        terminalreporter.write_line(f"agentcgroup: shard {sharded.strip()} (--agentcgroup-shard): the other shards' tests "
                                    "are deselected; `agentcgroup merge` joins the shards' runs into one")
    if not state.summaries:
        return
    terminalreporter.write_sep("=", "agentcgroup summary")
    for line in format_summary(state.summaries).splitlines():
        terminalreporter.write_line(line)
    controller = config.stash.get(CONTROLLER, None)
    run = controller.run if controller is not None else None
    terminalreporter.write_line(f"results: {run or setting(config, 'out')} (metrics.jsonl, summary.json)")
    if state.faithful:
        terminalreporter.write_sep("=", "agentcgroup faithfulness (real commands against what each trace recorded)")
        for line in state.faithful:
            terminalreporter.write_line(line, yellow="first divergence" in line)
