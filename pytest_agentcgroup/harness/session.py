"""The session side: what each pytest process does once per session, and what travels between xdist
workers and the controller. The controller (this process serially, xdist's controller under
`-n N`) gets a MetricsController (controller.py); each process opens one results store when its
first experiment test needs it (a worker writes its own file in the run directory the controller
chose); a worker's reports carry its benchmark entries; at the end the store is closed and the
controller merges, marks and gates the run.

May import: config, traces.corpus (its manifest's name), metrics/, reports.table and the harness's settings, state, collect and controller.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from .. import config as cfgmod
from ..traces.corpus import MANIFEST
from ..metrics import benchjson, faithfulness, gate
from ..metrics.store import METRICS_FILE, ResultsStore, read_records
from ..reports.table import format_summary
from .collect import case_of
from .controller import (REPORT_CASE, REPORT_EXPERIMENT, WORKERINPUT_CONTINUES, WORKERINPUT_RUN, WORKEROUTPUT_RUN_TREE,
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


def results_store(config: pytest.Config) -> ResultsStore:
    """This process's results store, made when the first experiment test needs it: only then is
    the run directory made (store.py), so a session without experiments writes nothing."""
    state = config.stash[STATE]
    if state.store is None:
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None:
            # An xdist worker (known by its workerinput: a serial pytest started from a worker
            # inherits PYTEST_XDIST_WORKER). The controller chose the run; each worker writes its
            # own file (one writer per file) and the controller merges them. A continued run's
            # file was consolidated by the controller before the workers started; a worker only reads it.
            run, continues = Path(workerinput[WORKERINPUT_RUN]), workerinput[WORKERINPUT_CONTINUES]
            earlier = read_records(run / METRICS_FILE) if continues else None
            state.store = ResultsStore(run / workerinput["workerid"], resume=continues, earlier=earlier, claim_run=run)
        else:
            run, continues = config.stash[CONTROLLER].open_run()
            state.store = ResultsStore(run, resume=continues)
    return state.store


def mark_report(item: pytest.Item, call, report) -> None:
    """plugin.py's pytest_runtest_makereport: an experiment test's report says its experiment and
    arm (the controller checks claims across arms at the end); under xdist, a benchmark's entry
    travels to the controller on the call report."""
    case = case_of(item)
    if case is not None:
        setattr(report, REPORT_CASE, case)
    if not hasattr(item.config, "workerinput"):      # not an xdist worker
        return
    if "agentcgroup_case" in getattr(item, "fixturenames", ()):
        setattr(report, REPORT_EXPERIMENT, True)     # the controller points results/latest at the run
    fixture = getattr(item, "funcargs", {}).get("benchmark")
    if call.when == "call" and getattr(fixture, "_mode", None) and not fixture.has_error:
        seconds = item.stash.get(REPLAY_SECONDS, report.duration)
        setattr(report, benchjson.REPORT_ATTR, benchjson.entry(fixture, seconds))


def finish(session: pytest.Session, state: State) -> None:
    """plugin.py's sessionfinish, once the fixtures' resources are closed: close this process's
    store, and on the controller merge, mark, gate (controller.py)."""
    records = []
    if state.store is not None:
        state.summaries, records = state.store.close(), state.store.records
    if state.run_tree is not None and hasattr(session.config, "workeroutput"):
        session.config.workeroutput[WORKEROUTPUT_RUN_TREE] = state.run_tree     # to pytest_testnodedown
    controller = session.config.stash.get(CONTROLLER, None)
    if controller is not None:
        state.summaries = controller.finish(session, records, state.summaries)
        if controller.distributed and controller.run is not None and (controller.run / METRICS_FILE).is_file():
            records = read_records(controller.run / METRICS_FILE)      # the workers', merged
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
    controller.check_claims(controller.run_records(state.store.records if state.store is not None else []), conf,
                            session)


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
