"""The controller's side of a run (the pytest process itself, or xdist's controller when `-n N`):
what happens once per session, after every test has run, whichever process ran it.

* results: the run directory (metrics/store.py: `results/NNNN_<time>/`, or on resume the unfinished run
  it continues) is chosen once, here, and made with its run.json (start, pytest arguments, config,
  the checkout's commit, the machine) when the first experiment test asks for the run's store
  (`open_store`): serially this process's test, under xdist the first report of a worker that
  carries step records. A session without experiments leaves the results directory as it was.
  Only this process writes the run: an xdist worker, on this machine or another (an execnet
  gateway), never sees it. A worker's step records travel on its test reports (REPORT_RECORDS,
  the records each phase of a test wrote: a worker that dies keeps every test it finished) and are
  appended to RUN/metrics.jsonl as they arrive, as a serial run appends its own; its run tree
  (REPORT_RUN_TREE) and its machine (REPORT_HOST) travel the same way. A resume tells the workers
  which steps the continued run holds (WORKERINPUT_DONE) and consolidates that run when its
  store is opened; a test redone drops its earlier lines with its first new record. At the end
  summary.json is written, the run is marked finished (not after Ctrl-C) with the run tree and
  the machines that measured, and `results/latest` points at it.
* benchmark JSON: under xdist pytest-benchmark records nothing, so the entries that workers put on
  their test reports (benchjson.REPORT_ATTR) are written here in its schema. Serially
  pytest-benchmark writes the file and the hooks below add to it: params as test ids, and the
  environment snapshot in `machine_info["agentcgroup"]`.
* the regression gate (metrics/gate.py) against `--agentcgroup-baseline`, and
  `--agentcgroup-save-baseline`.
* claims comparing arms that separate tests measure (studies/kinds.py): checked here once every
  test has run (`check_claims`, after the run loop, before the session finishes), for trace x arm
  experiments (exp1, exp4) on the run's records (a resumed run's earlier ones included), for exp3
  on the figures each arm's test put on its report (FIGURES, a user property: it travels from
  xdist workers too). Each experiment's claims are one more test report,
  `<its module>::claims[<experiment>]`: failed when a claim is refuted or not measured (with every
  claim, its values and verdict), skipped when one is not checked, else passed; the terminal's
  counts, `-rA`, JUnit XML and the exit status take it like any test. They are printed in the
  terminal summary too. Each experiment test's report says its experiment and arm (REPORT_CASE),
  so an arm that did not run is named with its skip reason.

May import: metrics/ (store, benchjson, gate), studies/ (kinds, claims), the harness's environment and
pytest.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pytest

from ..metrics import benchjson, gate, store
from ..metrics.store import ResultsStore, begin_session, record_key
from ..studies import claims, kinds
from . import environment

WORKERINPUT_RUN = "agentcgroup_run"           # the run directory chosen (named in a worker's messages only)
WORKERINPUT_DONE = "agentcgroup_done"         # resume: [[test key], [step ids]] the continued run holds
REPORT_RECORDS = "agentcgroup_records"        # a worker's report: the step records written since its last one
REPORT_RUN_TREE = "agentcgroup_run_tree"      # a worker's report: its run tree, when it changed
REPORT_HOST = "agentcgroup_host"              # a worker's first report with records: its machine
REPORT_CASE = "agentcgroup_case"              # every experiment test's report: (experiment, arm)
FIGURES = "agentcgroup_figures"               # a user property: the claim figures one arm's test measured


@dataclass
class ControllerSettings:
    out: Path
    resume: bool = False
    baseline: str | None = None
    rules: list = field(default_factory=list)
    save_baseline: str | None = None
    config: str | None = None                  # the experiment config file, for run.json
    shard: str | None = None                   # "K/N" of --agentcgroup-shard
    corpus: Callable[[], dict] | None = None   # the corpus replayed, for run.json (session._corpus)


class MetricsController:
    def __init__(self, config: pytest.Config, settings: ControllerSettings):
        self.config, self.s = config, settings
        self.entries: list[dict] = []          # benchmark entries from worker reports
        self.run: Path | None = None           # the run directory, once chosen
        self.continues = False                 # the run is an unfinished earlier one (resume)
        self.begun = False                     # a resumed run was consolidated (begin_session)
        self.opened = False                    # an experiment asked for the run: it is made
        self.store: ResultsStore | None = None  # the run's metrics.jsonl, written by this process only
        self.redone: set[tuple] = set()        # tests whose records came in this session (xdist)
        self.done: list | None = None          # WORKERINPUT_DONE, once
        self.hosts: dict[str, dict] = {}       # hostname -> the machine (environment.machine) that measured
        self.summaries: list[dict] = []
        self.gate_lines: list[str] = []
        self.json_written: Path | None = None
        self.claim: int | None = None          # our flock on the run while we write it (store.claim)
        self.notes: list[str] = []             # said at the end: e.g. a live run not resumed
        self.baseline_error: str | None = None
        self.arms_seen: dict[str, dict[str, str]] = {}   # experiment -> arm -> "ran" | why it did not
        self.figures: dict[str, dict[str, dict]] = {}    # experiment -> arm -> metric -> value (FIGURES)
        self.modules: dict[str, str] = {}                # experiment -> the module of its tests (node id)
        self.claim_lines: list[str] = []
        self.verdicts: list = []                         # claims.Verdict of every claim checked here
        self.claims_failed = False
        self.claims_error: str | None = None             # why the claims could not be checked at all
        # {"controllers", "refused"} of each run tree (this process's: fixtures.agentcgroup_tree;
        # each worker's, the last its reports carried), for machine_info and complete.json
        self.run_trees: list[dict] = []
        self.worker_trees: dict[str, dict] = {}

    @property
    def distributed(self) -> bool:
        return self.config.pluginmanager.has_plugin("dsession")

    # -- the run directory -------------------------------------------------------------------------
    def choose_run(self, *, begin: bool = True) -> Path:
        """Once per session: the unfinished newest run on resume (consolidated now, unless
        `begin` is false), else a new run's path. Nothing is made for a new run."""
        if self.run is None:
            found, self.claim, live = store.resume_run(self.s.out) if self.s.resume else (None, None, None)
            if found is not None and store.read_run_file(found).get("shard") != self.s.shard:
                self.notes.append(f"resume: {found} is not shard {self.s.shard or '(none)'}'s run; this session "
                                  "wrote a new run")          # another shard's tests: not ours to continue
                store.release(self.claim)
                found, self.claim = None, None
            self.continues = found is not None
            self.run = found if found is not None else store.new_run(self.s.out)
            if live is not None:
                self.notes.append(f"resume: {live} is being written by another live session (it holds the "
                                  f"run's lock); it was not continued, this session wrote a new run: {self.run}")
            self._resolve_baseline()
        if begin:
            self._begin()
        return self.run

    def _begin(self) -> None:
        if self.continues and not self.begun:
            begin_session(self.run)          # a run a killed older version's workers left files in
            self.begun = True

    def _resolve_baseline(self) -> None:
        """A results directory or `latest` as the baseline means its newest run other than the one
        this session writes (resumed or new), as that run is when we choose it."""
        if self.s.baseline and Path(self.s.baseline).is_dir():
            try:
                self.s.baseline = str(store.resolve_run(self.s.baseline, exclude=self.run).resolve())
            except store.NoRun as exc:
                self.baseline_error = str(exc)

    def _make_new_run(self) -> Path:
        """Make the chosen new run's directory and hold it as live (store.claim: a resume in another
        session will not take it); another session took that number meanwhile: the next."""
        while True:
            try:
                self.claim = store.claim(self.run, new=True)
            except FileExistsError:
                self.run = store.new_run(self.s.out)
                continue
            store.write_run_file(self.run, self.run_facts())
            return self.run

    def run_facts(self) -> dict:
        """run.json: when and how the run was started, from which code, on which machine."""
        inv = self.config.invocation_params
        cfg = Path(inv.dir, self.s.config) if self.s.config else None
        try:
            digest = hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg else None
        except OSError:
            digest = None

        def shown(path: Path | None) -> str | None:      # relative to where pytest was started, when below it
            if path is None:
                return None
            path = Path(path).resolve()
            return str(path.relative_to(inv.dir)) if path.is_relative_to(inv.dir) else str(path)
        return {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "run": shown(self.run),
                "pytest_args": list(inv.args), "cwd": str(inv.dir), "config": shown(cfg), "config_sha256": digest,
                "checkout": environment.checkout_commit(), "host": environment.host(),
                "corpus": self.s.corpus() if self.s.corpus else None, **({"shard": self.s.shard} if self.s.shard else {})}

    def open_run(self) -> tuple[Path, bool]:
        """The first experiment test is about to write (serial: this process's; xdist: a worker's
        report with records): make its run directory and point `latest` at it. Returns (run, continues)."""
        run = self.choose_run()
        if not self.opened:
            if self.continues:
                run.mkdir(parents=True, exist_ok=True)     # held since choose_run (store.resume_run)
            else:
                run = self._make_new_run()
            store.point_latest(run)
            self.opened = True
        return run, self.continues

    def open_store(self) -> ResultsStore:
        """The run's results store, made with the run (open_run) on first use; this process is its
        only writer."""
        if self.store is None:
            run, continues = self.open_run()
            self.store = ResultsStore(run, resume=continues)
        return self.store

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """xdist: a worker is told the run's name (for its messages) and, on resume, which steps the
        continued run holds (read without writing: the run is consolidated when its store opens)."""
        run = self.choose_run(begin=False)
        if self.done is None:
            earlier = (store.merged_records(run, keep=store.read_records(run / store.METRICS_FILE))
                       if self.continues else [])
            steps: dict[tuple, list] = {}
            for r in earlier:
                steps.setdefault(record_key(r), []).append(r["step_id"])
            self.done = [[list(key), ids] for key, ids in steps.items()]
        node.workerinput[WORKERINPUT_RUN] = str(run)
        node.workerinput[WORKERINPUT_DONE] = self.done

    # -- while tests run -------------------------------------------------------------------------
    def pytest_runtest_logreport(self, report) -> None:
        case = getattr(report, REPORT_CASE, None)
        if case is not None:
            self.modules.setdefault(case[0], report.nodeid.split("::")[0])
            arms = self.arms_seen.setdefault(case[0], {})
            if report.skipped:
                reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
                arms.setdefault(case[1], "skipped: " + reason.removeprefix("Skipped: "))
            elif report.when == "call":
                arms[case[1]] = "ran"
                for key, value in report.user_properties:
                    if key == FIGURES:
                        self.figures.setdefault(case[0], {})[case[1]] = value
            elif report.failed and report.when == "setup":
                arms.setdefault(case[1], "errored in setup")
        entry = getattr(report, benchjson.REPORT_ATTR, None)
        if entry is not None and report.when == "call":
            self.entries.append(entry)
        worker = getattr(report, "worker_id", None) or "?"
        tree = getattr(report, REPORT_RUN_TREE, None)
        if tree is not None:
            self.worker_trees[worker] = tree
        machine = getattr(report, REPORT_HOST, None)
        if machine is not None:
            self.hosts.setdefault(machine["hostname"], machine)
        records = getattr(report, REPORT_RECORDS, None)
        if records is not None:
            self.take(records)

    def take(self, records: list[dict]) -> None:
        """A worker's step records, appended to the run's file as they arrive. A test's first record
        in this session drops what an earlier attempt of a resumed run left of it, as a serial
        resume does with its first new record."""
        results = self.open_store()
        for rec in records:
            key = record_key(rec)
            if key not in self.redone:
                self.redone.add(key)
                results.restart(key)
            results.append(rec)

    # -- pytest-benchmark hooks (serial runs: it writes the file, we add to it) -------------------
    def pytest_benchmark_update_machine_info(self, config, machine_info) -> None:
        machine_info["agentcgroup"] = {**environment.snapshot(seeds=self._seeds(), run_tree=self.run_tree()),
                                       "hosts": self.hosts}

    def run_tree(self) -> dict | None:
        """The run's cgroup controllers and refusals over this process's and the workers' trees."""
        return environment.merge_run_trees(self.run_trees + list(self.worker_trees.values()))

    def pytest_benchmark_update_json(self, config, benchmarks, output_json) -> None:
        for b in output_json["benchmarks"]:
            b["params"] = benchjson.plain_params(b.get("params"))

    def _seeds(self) -> list[int]:
        bs = getattr(self.config, "_benchmarksession", None)
        infos = [e["extra_info"] for e in self.entries] + [b.extra_info for b in getattr(bs, "benchmarks", [])]
        return [i["seed"] for i in infos if "seed" in i]

    # -- after the last test ---------------------------------------------------------------------
    def finish(self, session: pytest.Session) -> tuple[list[dict], list[dict]]:
        """Called by session.py's finish once the fixtures' resources are closed: the run's store
        closed (summary.json), the run marked and gated. Returns the run's (records, summaries)."""
        records: list[dict] = []
        if self.store is not None:
            self.summaries, records = self.store.close(), self.store.records
        if self.claims_error and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED     # claims never checked are no pass
        if self.distributed and self.config.getoption("benchmark_json", None) and self.entries:
            self._write_benchmark_json(Path(self.config.getoption("benchmark_json")))
        run = self.run
        if run is None or not self.opened:     # no experiment wrote: the results directory is left as it was
            store.release(self.claim)
            self.claim = None
            return records, self.summaries
        if session.exitstatus != pytest.ExitCode.INTERRUPTED:
            store.mark_finished(run, int(session.exitstatus), self.run_tree(), claims=self._claims_inputs(),
                                hosts=self.hosts)
        store.point_latest(run)
        store.release(self.claim)              # written: a later resume may take it (if unfinished)
        self.claim = None
        ran = bool(self.summaries)
        if ran and (self.s.baseline or self.s.save_baseline):
            self._gate(session, records)
        return records, self.summaries

    def run_records(self) -> list[dict]:
        """The run's step records as they stand after the last test (a resumed run's earlier ones
        included): its store's, whichever process replayed them."""
        return self.store.records if self.store is not None else []

    def check_claims(self, records: list[dict], experiments, session=None) -> None:
        """The claims of each experiment that had a test in this session and whose claims compare
        arms at the end of the session: one test report each (see the module's docstring). A
        sharded run checks none: it holds only part of the tests (`agentcgroup merge` checks them)."""
        unchecked = f"sharded run (shard {self.s.shard}), checked by `agentcgroup merge`" if self.s.shard else None
        for name, arms in self.arms_seen.items():
            exp = experiments.experiments.get(name)
            if exp is None:
                continue
            verdicts = kinds.session_claims(exp, arms, self.figures.get(name, {}), records, unchecked=unchecked)
            if not verdicts:
                continue
            self.verdicts += verdicts
            self.claim_lines += [f"{name}: {verdict}" for verdict in verdicts]
            if session is not None:
                session.testscollected += 1          # the terminal's progress counts it: [100%], not [133%]
            self._report_claims(name, verdicts)

    def _claims_inputs(self) -> dict | None:
        """complete.json of a sharded run: what `agentcgroup merge` checks the claims with besides
        the records (each arm's outcome or skip reason, exp3's figures)."""
        return {"arms": self.arms_seen, "figures": self.figures} if self.s.shard else None

    def claims_unchecked(self, why: str) -> None:
        """The claims could not be checked at all (the config did not load again): said at the end,
        and the session fails."""
        self.claims_error = why
        self.notes.append(why)

    def _report_claims(self, name: str, verdicts: list) -> None:
        """One test report for an experiment's session-end claims, as if a test had run them."""
        module = self.modules.get(name, name)
        failed = any(v.fails for v in verdicts)
        unchecked = [str(v) for v in verdicts if v.state == claims.NOT_CHECKED]
        title = f"{name}: claims comparing arms, checked at the end of the session ({claims.summary(verdicts)})"
        if failed:
            outcome, longrepr = "failed", title + ":\n  " + "\n  ".join(str(v) for v in verdicts)
        elif unchecked:
            outcome, longrepr = "skipped", (module, 0, f"Skipped: {title}: {len(unchecked)} not checked: "
                                                        + "; ".join(unchecked))
        else:
            outcome, longrepr = "passed", None
        report = pytest.TestReport(f"{module}::claims[{name}]", (module, None, f"claims[{name}]"), {"claims": 1},
                                   outcome, longrepr, "call")
        self.claims_failed |= failed
        self.config.hook.pytest_runtest_logreport(report=report)

    def _write_benchmark_json(self, path: Path) -> None:
        hook = self.config.hook
        machine_info = hook.pytest_benchmark_generate_machine_info(config=self.config)
        hook.pytest_benchmark_update_machine_info(config=self.config, machine_info=machine_info)
        commit_info = hook.pytest_benchmark_generate_commit_info(config=self.config)
        hook.pytest_benchmark_update_commit_info(config=self.config, commit_info=commit_info)
        benchjson.write(path, benchjson.document(self.entries, machine_info, commit_info))
        self.json_written = path

    def _gate(self, session: pytest.Session, records: list[dict]) -> None:
        """`records`: what RUN/metrics.jsonl now holds."""
        if self.s.save_baseline and session.exitstatus != pytest.ExitCode.OK:
            self.gate_lines.append(f"baseline NOT saved to {self.s.save_baseline}: the run failed "
                                   f"(exit {int(session.exitstatus)}); a baseline is made from a passing run")
        elif self.s.save_baseline:
            try:
                n = gate.save(records, self.s.save_baseline, note=f"saved from {os.path.relpath(self.run)}")
                self.gate_lines.append(f"baseline saved: {self.s.save_baseline} ({n} trace x arm)")
            except gate.GateError as exc:
                self.gate_lines.append(f"GATE ERROR: {exc}")
                session.exitstatus = pytest.ExitCode.USAGE_ERROR
                return
        if self.s.baseline and self.baseline_error:
            self.gate_lines.append(f"GATE ERROR: baseline {self.baseline_error}")
            session.exitstatus = pytest.ExitCode.USAGE_ERROR
            return
        if self.s.baseline:
            try:
                verdict = gate.compare(gate.load(self.s.baseline), gate.per_test(records), self.s.rules)
            except gate.GateError as exc:
                self.gate_lines.append(f"GATE ERROR: {exc}")
                session.exitstatus = pytest.ExitCode.USAGE_ERROR
                return
            self.gate_lines += gate.format_verdict(verdict, self.s.baseline)
            if verdict.failed:
                self.gate_lines.insert(0, f"REGRESSION: {len(verdict.regressions)} metric(s) worse than the "
                                          f"baseline beyond the gate's tolerance")
                if session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(trylast=True)        # after the run's summary table
    def pytest_terminal_summary(self, terminalreporter) -> None:
        for note in self.notes:
            terminalreporter.write_line(f"agentcgroup: {note}", yellow=True)
        if self.json_written:
            terminalreporter.write_line(f"agentcgroup: wrote benchmark JSON of {len(self.entries)} test(s) "
                                        f"from the xdist workers: {self.json_written}")
        if self.claim_lines:
            terminalreporter.write_sep("=", "agentcgroup claims (across arms, at the end of the session)")
            for line in self.claim_lines:
                terminalreporter.write_line(line, red=line.endswith(("-> refuted", "-> not measured")),
                                            yellow=": not checked:" in line)
            terminalreporter.write_line(claims.summary(self.verdicts)
                                        + ("; a refuted or unmeasured claim fails its experiment's claims[...] test"
                                           if self.claims_failed else ""),
                                        red=self.claims_failed)
        if self.gate_lines:
            terminalreporter.write_sep("=", "agentcgroup regression gate")
            failed = self.gate_lines[0].startswith(("REGRESSION", "GATE ERROR"))
            for line in self.gate_lines:
                terminalreporter.write_line(line, red=failed and not line.startswith(("new", "missing")))
