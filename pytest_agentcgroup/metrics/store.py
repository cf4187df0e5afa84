"""The results directory: one directory per run, never overwritten, and inside each run
metrics.jsonl (a line per step, flushed as each step ends, so a killed run keeps every step it
finished) and summary.json (one object per experiment × config × seed × params).

    results/                       the results directory (--agentcgroup-out)
      0001_20261123T190000/        a run: NNNN_<UTC start>, numbered as pytest-benchmark numbers saves
        metrics.jsonl  summary.json  complete.json
      0002_20261123T193000/        the next run (gw0/, gw1/ while its xdist workers write)
      latest -> 0002_20261123T193000

A run directory is made only when the run's first experiment test is about to write: a session
that runs no experiment never makes, changes or removes anything here. `complete.json` is written
when the session ends (not when it was killed or interrupted): a run without it is unfinished, and
`--agentcgroup-resume` continues the newest run when it is unfinished, else starts a new one.
`resolve_run` turns what a reader is given (a run directory, the results directory, `latest`)
into one run directory; a directory that holds metrics.jsonl itself (a run, or results written
before runs had directories) is taken as it is.

One writer per file: a serial run writes `RUN/metrics.jsonl`; each xdist worker writes
`RUN/<worker>/metrics.jsonl` and the controller merges them into `RUN/metrics.jsonl` at the end
(`merge_workers`), so a run directory looks the same however the run was split.

A test's results are identified by its `run_key`: experiment, arm (`config`), trace, seed and
matrix params. When a run is continued (resume), `begin_session` first consolidates it (its file
plus what workers of a killed parallel run left) into its one file. With `resume=True` the store
keeps what the earlier attempt wrote: `complete(key, n)` says whether a test's steps are all there
already, and `restart(key)` drops a test's partial lines before it is replayed again, so the final
file holds every step once.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from .records import summarize

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
COMPLETE_FILE = "complete.json"       # written when a run's session ended: the run is finished
LATEST = "latest"                     # symlink to the newest run directory
WORKER_PREFIX = "gw"                  # xdist worker ids: gw0, gw1, ...
_RUN_NAME = re.compile(r"^(\d{4,})_\d{8}T\d{6}Z?$")


class NoRun(ValueError):
    """A path that is neither a run directory nor a results directory holding runs."""


def runs(results: Path) -> list[Path]:
    """The run directories of a results directory, oldest (lowest number) first."""
    try:
        found = [p for p in Path(results).iterdir() if _RUN_NAME.match(p.name) and p.is_dir() and not p.is_symlink()]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(found, key=lambda p: int(_RUN_NAME.match(p.name)[1]))


def finished(run: Path) -> bool:
    return (run / COMPLETE_FILE).is_file()


def new_run(results: Path) -> Path:
    """The path of the next run (number after the newest, this moment in UTC); nothing is made."""
    have = runs(results)
    number = int(_RUN_NAME.match(have[-1].name)[1]) + 1 if have else 1
    return Path(results) / f"{number:04d}_{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"


def unfinished_run(results: Path) -> Path | None:
    """The run a resume continues: the newest run, when it did not finish."""
    have = runs(results)
    return have[-1] if have and not finished(have[-1]) else None


def holds_results(d: Path) -> bool:
    """DIR is itself a run: its own metrics.jsonl, or xdist workers' gw*/metrics.jsonl."""
    return (d / METRICS_FILE).is_file() or any((w / METRICS_FILE).is_file() for w in worker_dirs(d))


def resolve_run(path: str | Path) -> Path:
    """The run directory meant by `path`: a run directory itself (or `latest`, which resolves to
    one), else the newest run of a results directory. Raises NoRun naming the path."""
    d = Path(path)
    if not d.is_dir():
        raise NoRun(f"{d}: no such results directory")
    if holds_results(d):
        return d
    have = runs(d)
    if have:
        return have[-1]
    raise NoRun(f"{d}: no {METRICS_FILE} (nor gw*/{METRICS_FILE} from xdist workers) and no run "
                "directories (NNNN_<time>/) — not a results directory")


def point_latest(run: Path) -> None:
    """results/latest -> this run (relative, replaced atomically, so a reader never sees none)."""
    link = run.parent / LATEST
    tmp = run.parent / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(run.name, tmp)
    os.replace(tmp, link)


def mark_finished(run: Path, exitstatus: int) -> None:
    _write_atomic(run / COMPLETE_FILE, json.dumps({
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"), "exitstatus": exitstatus}) + "\n")


def run_key(experiment: str | None, arm: str, trace_id: str, seed: int = 0, params: dict | None = None) -> tuple:
    """A test's identity in results and baselines: (experiment, arm, trace, seed, params as sorted
    JSON, so that the tuple is hashable and equal params compare equal)."""
    return (experiment, arm, trace_id, seed, json.dumps(params or {}, sort_keys=True))


def record_key(record: dict) -> tuple:
    """Which test wrote a step record (its arm is `config`). A missing seed is 0."""
    return run_key(record.get("experiment"), record["config"], record["trace_id"], record.get("seed", 0),
                   record.get("params"))


def read_records(path: Path) -> list[dict]:
    """The records of one metrics.jsonl. A line cut short by a killed run (not valid JSON) is
    dropped: its step is redone by a resumed run."""
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "trace_id" in rec and "config" in rec:
            out.append(rec)
    return out


def worker_dirs(out: Path) -> list[Path]:
    return sorted((p for p in out.glob(f"{WORKER_PREFIX}*") if p.is_dir() and p.name[2:].isdigit()),
                  key=lambda p: int(p.name[2:]))


def summaries(records: list[dict]) -> list[dict]:
    """summary.json: one object per experiment × config × seed × params, in first-seen order."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        exp, cfg, _trace, seed, params = record_key(r)
        groups[(exp, cfg, seed, params)].append(r)
    return [{"experiment": exp, **summarize(recs, cfg), "seed": seed, "params": json.loads(params)}
            for (exp, cfg, seed, params), recs in groups.items()]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _dump(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def write_results(out: Path, records: list[dict]) -> list[dict]:
    """Replace DIR/metrics.jsonl and DIR/summary.json with these records; returns the summaries."""
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / METRICS_FILE, _dump(records))
    sums = summaries(records)
    _write_atomic(out / SUMMARY_FILE, json.dumps(sums, indent=1) + "\n")
    return sums


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return -1


def _remove_worker_dirs(out: Path) -> None:
    for d in worker_dirs(out):
        shutil.rmtree(d, ignore_errors=True)


def merge_workers(out: Path, *, keep: list[dict] | None = None) -> tuple[list[dict], list[dict]]:
    """Controller side: DIR/metrics.jsonl := `keep` (earlier results, on resume) minus every test a
    worker redid, plus every worker's records; the worker directories are removed. Returns the
    merged records and their summaries (summary.json is written too).

    Which version of a test wins is decided by age: a worker's records are newer than DIR's file
    (the controller writes that file before its workers start, and only merges after they stop),
    so they replace its version of the test. A worker file OLDER than DIR's file is stale: a later
    run rewrote DIR's file after that worker stopped (a serial run after a killed parallel one,
    left by a version that did not yet remove worker directories at start); it is dropped, not
    merged. Equal times (coarse file clocks) count as newer: the worker wins."""
    written = _mtime_ns(out / METRICS_FILE)
    fresh = [r for d in worker_dirs(out) if _mtime_ns(d / METRICS_FILE) >= written
             for r in read_records(d / METRICS_FILE)]
    redone = {record_key(r) for r in fresh}
    merged = [r for r in (keep or []) if record_key(r) not in redone] + fresh
    sums = write_results(out, merged)
    _remove_worker_dirs(out)
    return merged, sums


def begin_session(run: Path) -> list[dict]:
    """The controller's set-up of a run it continues (resume), before any of its tests runs, serial
    or parallel: RUN's file := what the earlier attempt left (its own lines merged with the files
    of workers of a parallel run killed before its controller could merge them); returns those
    records, which tests read to know what is complete. A new run needs no set-up: its directory
    is new."""
    if not worker_dirs(run):             # nothing to consolidate: the run is read, not rewritten
        return read_records(run / METRICS_FILE)
    return merge_workers(run, keep=read_records(run / METRICS_FILE))[0]


class ResultsStore:
    """One writer's metrics.jsonl.

    resume, serial (`earlier` None): the store continues RUN's file, which `begin_session` has
    consolidated; its lines are kept and what they complete is skipped. resume, xdist worker:
    `earlier` holds RUN's records (read, never rewritten, by a worker) and the worker's own file
    starts empty. Without resume the store is a new run's: its directory is new."""

    def __init__(self, out: str | Path, *, resume: bool = False, earlier: list[dict] | None = None):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / METRICS_FILE
        continues = resume and earlier is None
        self.records: list[dict] = read_records(self.path) if continues else []
        if continues:
            earlier = self.records
        # Indexes built once, so that each resumed test's complete()/restart() is a lookup:
        # test -> step ids already recorded by earlier runs; the tests that have lines in our file.
        self._done: dict[tuple, set] = defaultdict(set)
        for r in earlier or []:
            self._done[record_key(r)].add(r["step_id"])
        self._in_file: set[tuple] = set(self._done) if continues else set()
        self._fh = open(self.path, "a" if continues else "w", encoding="utf-8")

    def complete(self, key: tuple, steps: int) -> bool:
        """All `steps` steps of this test are already recorded (by an earlier run)."""
        return len(self._done.get(key, ())) >= steps > 0

    def restart(self, key: tuple) -> None:
        """Forget this test's lines (a partial earlier attempt) before it is replayed again."""
        self._done.pop(key, None)
        if key in self._in_file:
            self._in_file.discard(key)
            self.records = [r for r in self.records if record_key(r) != key]
            self._fh.close()
            _write_atomic(self.path, _dump(self.records))
            self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, record: dict) -> None:
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.records.append(record)
        self._in_file.add(record_key(record))

    def summaries(self) -> list[dict]:
        return summaries(self.records)

    def close(self) -> list[dict]:
        self._fh.close()
        sums = self.summaries()
        _write_atomic(self.out / SUMMARY_FILE, json.dumps(sums, indent=1) + "\n")
        return sums
