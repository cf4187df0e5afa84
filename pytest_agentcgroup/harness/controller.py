"""The controller's side of a run (the pytest process itself, or xdist's controller when `-n N`):
what happens once per session, after every test has run, whichever process ran it.

* results: the run directory (metrics/store.py: `results/NNNN_<time>/`, or on resume the unfinished run
  it continues) is chosen and made once, here, with its run.json (start, pytest arguments, config,
  the checkout's commit, the machine). Serially it is made when the first experiment test
  asks for its store (`open_run`), so a session without experiments leaves the results directory as
  it was. Under xdist the workers need the path when they start, before anyone knows whether a test
  will run: the controller makes the new run's directory then (`reserve_run`: two sessions cannot
  take the same number) and hands it to every worker (`workerinput`); when no experiment test ran
  it removes it again. A resume consolidates the unfinished run it continues (store.begin_session)
  only once a worker has collected tests to run, before any is scheduled
  (`pytest_xdist_node_collection_finished`): `-k` selecting nothing leaves that run as it was. At
  the end the workers' `RUN/<worker>/metrics.jsonl` are merged into `RUN/metrics.jsonl` +
  `RUN/summary.json`, the run is marked finished (not after Ctrl-C) and `results/latest` points at it.
* benchmark JSON: under xdist pytest-benchmark records nothing, so the entries that workers put on
  their test reports (benchjson.REPORT_ATTR) are written here in its schema. Serially
  pytest-benchmark writes the file and the hooks below add to it: params as test ids, and the
  environment snapshot in `machine_info["agentcgroup"]`.
* the regression gate (metrics/gate.py) against `--agentcgroup-baseline`, and
  `--agentcgroup-save-baseline`.
* claims comparing arms that separate tests measure (studies/kinds.py): checked here once every
  test has run (`check_claims`, after the run loop, before the session finishes), for trace x arm
  experiments (exp1, exp4) on the run's records (a resumed run's earlier ones included, the xdist
  workers' files read), for exp3 on the figures each arm's test put on its report (FIGURES, a user
  property: it travels from xdist workers too). Each experiment's claims are one more test report,
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
from ..metrics.store import begin_session, merge_workers, worker_dirs
from ..studies import claims, kinds
from . import environment

WORKERINPUT_RUN = "agentcgroup_run"           # the run directory, chosen by the controller
WORKERINPUT_CONTINUES = "agentcgroup_continues"
REPORT_EXPERIMENT = "agentcgroup_experiment"  # a worker's report of an experiment test carries it
REPORT_CASE = "agentcgroup_case"              # every experiment test's report: (experiment, arm)
FIGURES = "agentcgroup_figures"               # a user property: the claim figures one arm's test measured
WORKEROUTPUT_RUN_TREE = "agentcgroup_run_tree"  # a worker's run tree: its controllers, those refused


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
        self.earlier: list[dict] = []          # resume: what the continued run held before
        self.run: Path | None = None           # the run directory, once chosen
        self.continues = False                 # the run is an unfinished earlier one (resume)
        self.begun = False                     # a resumed run was consolidated (begin_session)
        self.opened = False                    # serial: an experiment asked for the run
        self.reserved: list[Path] = []         # xdist: directories made before any test ran
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
        # the workers': pytest_testnodedown), for machine_info and complete.json
        self.run_trees: list[dict] = []

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
            self.earlier = begin_session(self.run)
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

    def reserve_run(self) -> Path:
        """xdist, before the workers start: choose the run and make a new run's directory (and
        the results directory, if missing), remembering what was made so that `finish` can remove
        it when no experiment test ran. A resumed run is not consolidated yet."""
        if self.run is None:
            self.choose_run(begin=False)
            if not self.continues:
                out = Path(self.s.out)
                missing = [d for d in (out, *out.parents) if not d.exists()]
                self.reserved = [self._make_new_run(), *missing]
        return self.run

    def open_run(self) -> tuple[Path, bool]:
        """Serial: the first experiment test is about to write; make its run directory and point
        `latest` at it. Returns (run, continues)."""
        run = self.choose_run()
        if not self.opened:
            if self.continues:
                run.mkdir(parents=True, exist_ok=True)     # held since choose_run (store.resume_run)
            else:
                run = self._make_new_run()
            store.point_latest(run)
            self.opened = True
        return run, self.continues

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        """xdist: every worker gets the one run directory chosen and made here."""
        node.workerinput[WORKERINPUT_RUN] = str(self.reserve_run())
        node.workerinput[WORKERINPUT_CONTINUES] = self.continues

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        """xdist: a worker will run tests (the controller schedules them after this hook): a
        resumed run is consolidated now, before any of them reads it."""
        if ids:
            self._begin()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error) -> None:
        tree = getattr(node, "workeroutput", {}).get(WORKEROUTPUT_RUN_TREE)
        if tree is not None:
            self.run_trees.append(tree)

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
        if getattr(report, REPORT_EXPERIMENT, False) and not self.opened and self.run is not None \
                and self.run.is_dir():
            store.point_latest(self.run)          # a worker made the run: readers find it now
            self.opened = True

    # -- pytest-benchmark hooks (serial runs: it writes the file, we add to it) -------------------
    def pytest_benchmark_update_machine_info(self, config, machine_info) -> None:
        machine_info["agentcgroup"] = environment.snapshot(seeds=self._seeds(),
                                                           run_tree=environment.merge_run_trees(self.run_trees))

    def pytest_benchmark_update_json(self, config, benchmarks, output_json) -> None:
        for b in output_json["benchmarks"]:
            b["params"] = benchjson.plain_params(b.get("params"))

    def _seeds(self) -> list[int]:
        bs = getattr(self.config, "_benchmarksession", None)
        infos = [e["extra_info"] for e in self.entries] + [b.extra_info for b in getattr(bs, "benchmarks", [])]
        return [i["seed"] for i in infos if "seed" in i]

    # -- after the last test ---------------------------------------------------------------------
    def finish(self, session: pytest.Session, records: list[dict], summaries: list[dict]) -> list[dict]:
        """Called by session.py's finish once the serial store is closed (`records` are its
        file's records, `summaries` their summaries; both empty under xdist). Returns the run's summaries."""
        self.summaries = summaries
        if self.claims_error and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED     # claims never checked are no pass
        if self.distributed and self.config.getoption("benchmark_json", None) and self.entries:
            self._write_benchmark_json(Path(self.config.getoption("benchmark_json")))
        run = self.run
        used = run is not None and (self.opened or (bool(worker_dirs(run)) and (self.begun or not self.continues)))
        if not used:                           # no experiment wrote: the results directory is left as it was
            self._give_back()                  # before the lock goes: no resume may take it meanwhile
            store.release(self.claim)
            self.claim = None
            return self.summaries
        if self.distributed:
            records, self.summaries = merge_workers(run, keep=self.earlier)
        if session.exitstatus != pytest.ExitCode.INTERRUPTED:
            store.mark_finished(run, int(session.exitstatus), environment.merge_run_trees(self.run_trees),
                                claims=self._claims_inputs())
        store.point_latest(run)
        store.release(self.claim)              # written: a later resume may take it (if unfinished)
        self.claim = None
        ran = bool(self.summaries)
        if ran and (self.s.baseline or self.s.save_baseline):
            self._gate(session, records)
        return self.summaries

    def run_records(self, serial: list[dict]) -> list[dict]:
        """The run's step records as they stand after the last test: serially this process's
        store's (`serial`); under xdist the workers' files merged with a resumed run's earlier
        records, read without writing (finish merges them into the run's file)."""
        if not self.distributed:
            return serial
        return store.merged_records(self.run, keep=self.earlier) if self.run is not None and self.run.is_dir() else []

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

    def _give_back(self) -> None:
        """Remove what reserve_run made, if it is still empty (no worker wrote)."""
        for d in self.reserved:
            if d == self.run:
                (d / store.RUN_FILE).unlink(missing_ok=True)
            try:
                d.rmdir()
            except OSError:
                break
        self.reserved = []

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
