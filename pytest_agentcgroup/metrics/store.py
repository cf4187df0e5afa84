"""The results directory: metrics.jsonl (a line per step, flushed as each step ends, so a killed
run keeps every step it finished) and summary.json (one object per experiment × config × seed ×
params).

One writer per file: a serial run writes `DIR/metrics.jsonl`; each xdist worker writes
`DIR/<worker>/metrics.jsonl` and the controller merges them into `DIR/metrics.jsonl` at the end
(`merge_workers`), so a results directory looks the same however the run was split.

A test's results are identified by its `run_key`: experiment, arm (`config`), trace, seed and
matrix params. Once per session, before any test, the controller calls `begin_session`: on resume
it consolidates DIR (its file plus what workers of a killed parallel run left) into DIR's one file;
otherwise it removes what an earlier run left (worker directories, DIR's own files), so a later
merge or resume never takes stale records for this run's. With `resume=True` the store keeps what an earlier run wrote:
`complete(key, n)` says whether a test's steps are all there already, and `restart(key)` drops a
test's partial lines before it is replayed again, so the final file holds every step once.
"""
from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from pathlib import Path

from .records import summarize

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
WORKER_PREFIX = "gw"                  # xdist worker ids: gw0, gw1, ...


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


def begin_session(out: Path, *, resume: bool) -> list[dict]:
    """The controller's setup of DIR before any test runs, serial or parallel. On resume, DIR's
    file := what earlier runs left (its own lines merged with the files of workers of a parallel
    run killed before its controller could merge them); returns those records, which tests read to
    know what is complete. Otherwise leftover worker directories are removed: this run must not
    find them later (a resume or a merge would take their stale records for newer ones)."""
    if not resume:
        # A new run's results start empty, also under xdist, where DIR's own file is written only at
        # the end: a parallel run killed midway must not leave an older run's file for a resume to
        # take as this run's.
        _remove_worker_dirs(out)
        for name in (METRICS_FILE, SUMMARY_FILE):
            (out / name).unlink(missing_ok=True)
        return []
    if not out.is_dir():
        return []
    return merge_workers(out, keep=read_records(out / METRICS_FILE))[0]


class ResultsStore:
    """One writer's metrics.jsonl.

    resume, serial (`earlier` None): the store continues DIR's file, which `begin_session` has
    consolidated; its lines are kept and what they complete is skipped. resume, xdist worker:
    `earlier` holds DIR's records (read, never rewritten, by a worker) and the worker's own file
    starts empty. Without resume a new run starts a new file: results of different runs are never
    mixed."""

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
