"""The results directory: metrics.jsonl (a line per step, flushed as each step ends, so a killed
run keeps every step it finished) and summary.json (one object per experiment × config × seed ×
params).

One writer per file: a serial run writes `DIR/metrics.jsonl`; each xdist worker writes
`DIR/<worker>/metrics.jsonl` and the controller merges them into `DIR/metrics.jsonl` at the end
(`merge_workers`), so a results directory looks the same however the run was split.

A test's results are identified by its `run_key`: experiment, arm (`config`), trace, seed and
matrix params. With `resume=True` the store keeps what an earlier run wrote: `complete(key, n)`
says whether a test's steps are all there already, and `restart(key)` drops a test's partial lines
before it is replayed again, so the final file holds every step once.
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


def run_key(record: dict) -> tuple:
    """Which test wrote a record: (experiment, arm, trace, seed, params). A missing seed is 0."""
    return (record.get("experiment"), record["config"], record["trace_id"], record.get("seed", 0),
            json.dumps(record.get("params") or {}, sort_keys=True))


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
        groups[(r.get("experiment"), r["config"], r.get("seed", 0),
                json.dumps(r.get("params") or {}, sort_keys=True))].append(r)
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


def merge_workers(out: Path, *, keep: list[dict] | None = None) -> list[dict]:
    """Controller side: DIR/metrics.jsonl := `keep` (earlier results, on resume) minus every test a
    worker redid, plus every worker's records; the worker directories are removed. Returns the
    merged records (summary.json is written too)."""
    fresh = [r for d in worker_dirs(out) for r in read_records(d / METRICS_FILE)]
    redone = {run_key(r) for r in fresh}
    merged = [r for r in (keep or []) if run_key(r) not in redone] + fresh
    write_results(out, merged)
    for d in worker_dirs(out):
        shutil.rmtree(d, ignore_errors=True)
    return merged


def earlier_results(out: Path) -> list[dict]:
    """What earlier runs left in DIR: its metrics.jsonl plus the files of workers of a parallel run
    that was killed before its controller could merge them (a worker's version of a test wins)."""
    fresh = [r for d in worker_dirs(out) for r in read_records(d / METRICS_FILE)]
    redone = {run_key(r) for r in fresh}
    return [r for r in read_records(out / METRICS_FILE) if run_key(r) not in redone] + fresh


class ResultsStore:
    """One writer's metrics.jsonl. `earlier` holds records already complete from earlier runs
    (resume); they are read, never rewritten, by a worker."""

    def __init__(self, out: str | Path, *, resume: bool = False, earlier: list[dict] | None = None):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / METRICS_FILE
        self.records: list[dict] = []
        if resume and earlier is None:            # the serial writer owns DIR: consolidate it now
            self.records = earlier_results(self.out)
            write_results(self.out, self.records)
            for d in worker_dirs(self.out):
                shutil.rmtree(d, ignore_errors=True)
        self.earlier = earlier if earlier is not None else list(self.records)
        # Without resume a new run starts a new file: results of different runs are never mixed.
        self._fh = open(self.path, "a" if resume and earlier is None else "w", encoding="utf-8")

    def complete(self, key: tuple, steps: int) -> bool:
        """All `steps` steps of this test are already recorded (by an earlier run)."""
        return len({r["step_id"] for r in self.earlier if run_key(r) == key}) >= steps > 0

    def restart(self, key: tuple) -> None:
        """Forget this test's lines (a partial earlier attempt) before it is replayed again."""
        self.earlier = [r for r in self.earlier if run_key(r) != key]
        if any(run_key(r) == key for r in self.records):
            self.records = [r for r in self.records if run_key(r) != key]
            self._fh.close()
            _write_atomic(self.path, _dump(self.records))
            self._fh = open(self.path, "a", encoding="utf-8")

    def append(self, record: dict) -> None:
        self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.records.append(record)

    def summaries(self) -> list[dict]:
        return summaries(self.records)

    def close(self) -> list[dict]:
        self._fh.close()
        sums = self.summaries()
        _write_atomic(self.out / SUMMARY_FILE, json.dumps(sums, indent=1) + "\n")
        return sums
