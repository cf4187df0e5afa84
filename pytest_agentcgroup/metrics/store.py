"""The results directory: one directory per run, never overwritten, and inside each run
metrics.jsonl (a line per step, flushed as each step ends, so a killed run keeps every step it
finished) and summary.json (one object per experiment × config × seed × params).

    results/                       the results directory (--agentcgroup-out)
      0001_20261123T190000/        a run: NNNN_<UTC start>, numbered as pytest-benchmark numbers saves
        run.json  metrics.jsonl  summary.json  complete.json
      0002_20261123T193000/        the next run
      latest -> 0002_20261123T193000

A run directory is made only when the run's first experiment test is about to write: a session
that runs no experiment never makes, changes or removes anything here. `run.json` is written when
the run directory is made (its start, command, config, the checkout's commit and the machine:
what a results page names as the run's provenance; a resumed run keeps the first session's).
`complete.json` is written
when the session ends (not when it was killed or interrupted): a run without it is unfinished, and
`--agentcgroup-resume` continues the newest run when it is unfinished, else starts a new one.
`resolve_run` turns what a reader is given (a run directory, the results directory, `latest`)
into one run directory: a results directory means its newest run — even when an old top-level
metrics.jsonl (written before runs had directories) lies beside the runs; a directory without runs
that holds metrics.jsonl itself (a run, or such old results) is taken as it is.

A run is written by one session at a time, and by one process of it: the pytest process, or
xdist's controller, to which the workers send their records (harness/controller.py); a worker,
on this machine or another, never opens the run. That process holds a shared flock on the run
directory itself for as long as it writes (`claim`: nothing is added to the run). A resume takes the unfinished
newest run only when nobody holds it (`resume_run`, which probes with an exclusive lock): a run
still written by a live session is never continued — the resuming session starts a new run and
says so. Choosing and claiming happen under a short exclusive flock on the results directory, so
two sessions never both take one run.

One writer: `RUN/metrics.jsonl` is appended to by the one process that writes the run, so a run
directory looks the same however the run was split. Runs that a version which had xdist workers
write `RUN/<worker>/metrics.jsonl` left unmerged (killed before its controller merged them) are
still read: `merged_records` and `begin_session` (a resume) join them into the run's file.

A test's results are identified by its `run_key`: experiment, arm (`config`), trace, seed and
matrix params. When a run is continued (resume), `begin_session` first consolidates it (its file
plus what workers of such a killed parallel run left) into its one file. With `resume=True` the store
keeps what the earlier attempt wrote: `complete(key, n)` says whether a test's steps are all there
already, and `restart(key)` drops a test's partial lines before it is replayed again, so the final
file holds every step once.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from .records import summarize

METRICS_FILE = "metrics.jsonl"
PACKED_METRICS_FILE = METRICS_FILE + ".gz"
SUMMARY_FILE = "summary.json"
COMPLETE_FILE = "complete.json"       # written when a run's session ended: the run is finished
RUN_FILE = "run.json"                 # written when the run is made: what, where and from what code
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
    """DIR is itself a run: its own metrics.jsonl (or a published run's, gzip'd: PACKED_METRICS_FILE,
    which only reports/ reads), or xdist workers' gw*/metrics.jsonl."""
    return (d / METRICS_FILE).is_file() or (d / PACKED_METRICS_FILE).is_file() \
        or any((w / METRICS_FILE).is_file() for w in worker_dirs(d))


def resolve_run(path: str | Path, *, exclude: Path | None = None) -> Path:
    """The run directory meant by `path`: the newest run of a results directory (run directories
    win over an old top-level metrics.jsonl beside them), else a run directory itself (or
    `latest`, which resolves to one). `exclude`: the run this session writes, which is never the
    answer (a results directory then means its newest other run). Raises NoRun naming the path."""
    d = Path(path)
    if not d.is_dir():
        raise NoRun(f"{d}: no such results directory")
    mine = Path(exclude).resolve() if exclude is not None else None
    have = [r for r in runs(d) if r.resolve() != mine]
    if have:
        return have[-1]
    if holds_results(d):
        if mine is not None and d.resolve() == mine:
            if d.name == LATEST:                     # latest -> this run: the newest other run
                return resolve_run(d.parent, exclude=exclude)
            raise NoRun(f"{d}: is the run this session writes; it cannot be its own baseline")
        return d
    if runs(d):
        raise NoRun(f"{d}: its only run is the one this session writes; there is no other run to read")
    raise NoRun(f"{d}: no {METRICS_FILE} (nor gw*/{METRICS_FILE} from xdist workers) and no run "
                "directories (NNNN_<time>/) — not a results directory")


@contextlib.contextmanager
def _choosing(results: Path):
    """An exclusive flock on the results directory while a session chooses and claims a run."""
    Path(results).mkdir(parents=True, exist_ok=True)
    fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _hold(run: Path) -> int:
    fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def in_use(run: Path) -> bool:
    """Some live process holds RUN (writes into it): an exclusive flock cannot be had now."""
    try:
        fd = os.open(run, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def claim(run: Path, *, new: bool) -> int:
    """Make RUN (`new`: it must not exist yet, else FileExistsError; otherwise it may — xdist
    workers share one run) and hold it as written by this process. Returns the fd whose shared
    flock marks the run as live: keep it open while writing, close it (`release`) when done."""
    with _choosing(run.parent):
        run.mkdir(exist_ok=not new)
        return _hold(run)


def release(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def resume_run(results: Path) -> tuple[Path | None, int | None, Path | None]:
    """What a resume continues: (run, its claim fd, None) for the unfinished newest run that no
    live session writes; (None, None, that run) when a live session still writes it (a new run is
    to be started instead); (None, None, None) when there is no unfinished run."""
    if not Path(results).is_dir():
        return None, None, None
    with _choosing(results):
        found = unfinished_run(results)
        if found is None:
            return None, None, None
        if in_use(found):
            return None, None, found
        return found, _hold(found), None


def point_latest(run: Path) -> None:
    """results/latest -> this run (relative, replaced atomically, so a reader never sees none)."""
    link = run.parent / LATEST
    tmp = run.parent / f".{LATEST}.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(run.name, tmp)
    os.replace(tmp, link)


def mark_finished(run: Path, exitstatus: int, run_tree: dict | None = None, *, claims: dict | None = None,
                  hosts: dict | None = None) -> None:
    """`run_tree`: the run's cgroup controllers and those left out with why (harness/environment.py
    merge_run_trees); `claims`: a sharded run's inputs to the claims, or a merged run's verdicts;
    `hosts`: hostname -> the machine that measured (environment.machine), every host of the run."""
    _write_atomic(run / COMPLETE_FILE, json.dumps({
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"), "exitstatus": exitstatus,
        **({"run_tree": run_tree} if run_tree is not None else {}),
        **({"hosts": hosts} if hosts else {}),
        **({"claims": claims} if claims is not None else {})}) + "\n")


def write_run_file(run: Path, facts: dict) -> None:
    """RUN/run.json := `facts` (the controller's: started, command, config, checkout, host)."""
    _write_atomic(run / RUN_FILE, json.dumps(facts, indent=1) + "\n")


def read_run_file(run: Path) -> dict:
    """RUN/run.json, or {} when the run has none or it does not read as a JSON object."""
    try:
        facts = json.loads((run / RUN_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


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
    """A run whose xdist workers wrote files of their own (an older version, killed before its
    controller merged them): DIR/metrics.jsonl := `keep` (earlier results, on resume) minus every
    test a worker redid, plus every worker's records; the worker directories are removed. Returns
    the merged records and their summaries (summary.json is written too).

    Which version of a test wins is decided by age: a worker's records are newer than DIR's file
    (that version's controller wrote that file before its workers started), so they replace its
    version of the test. A worker file OLDER than DIR's file is stale: a later
    run rewrote DIR's file after that worker stopped (a serial run after a killed parallel one,
    left by a version that did not yet remove worker directories at start); it is dropped, not
    merged. Equal times (coarse file clocks) count as newer: the worker wins."""
    merged = merged_records(out, keep=keep)
    sums = write_results(out, merged)
    _remove_worker_dirs(out)
    return merged, sums


def merged_records(out: Path, *, keep: list[dict] | None = None) -> list[dict]:
    """What merge_workers will write, read without writing or removing anything."""
    written = _mtime_ns(out / METRICS_FILE)
    fresh = [r for d in worker_dirs(out) if _mtime_ns(d / METRICS_FILE) >= written
             for r in read_records(d / METRICS_FILE)]
    redone = {record_key(r) for r in fresh}
    return [r for r in (keep or []) if record_key(r) not in redone] + fresh


def begin_session(run: Path) -> list[dict]:
    """The controller's set-up of a run it continues (resume), before any of its tests runs, serial
    or parallel: RUN's file := what the earlier attempt left (its own lines merged with the files
    of workers of an older version's parallel run killed before its controller merged them); returns those
    records, which tests read to know what is complete. A new run needs no set-up: its directory
    is new."""
    if not worker_dirs(run):             # nothing to consolidate: the run is read, not rewritten
        return read_records(run / METRICS_FILE)
    return merge_workers(run, keep=read_records(run / METRICS_FILE))[0]


class ResultsStore:
    """The run's metrics.jsonl, written by the run's one writing process.

    resume: the store continues RUN's file, which `begin_session` has consolidated; its lines are
    kept and what they complete is skipped. Without resume the store is a new run's: its
    directory is new."""

    def __init__(self, out: str | Path, *, resume: bool = False):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / METRICS_FILE
        self.records: list[dict] = read_records(self.path) if resume else []
        # Indexes built once, so that each resumed test's complete()/restart() is a lookup:
        # test -> step ids already recorded by earlier runs; the tests that have lines in our file.
        self._done: dict[tuple, set] = defaultdict(set)
        for r in self.records:
            self._done[record_key(r)].add(r["step_id"])
        self._in_file: set[tuple] = set(self._done)
        self._fh = open(self.path, "a" if resume else "w", encoding="utf-8")

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
