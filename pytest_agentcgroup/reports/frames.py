"""Results directories as pandas DataFrames: one row per step, and one row per test (trace × arm ×
seed × sweep params) — the rows of runs.csv.

    from pytest_agentcgroup.reports import load
    res = load("results")                  # or load(["results-a", "results-b"])
    res.steps                              # a row per metrics.jsonl line
    res.tests                              # a row per trace × arm × seed (× params), per results dir

A results directory holds one directory per run (metrics/store.py; the newest is read unless a
run directory is named). A run holds metrics.jsonl (written by metrics/store.py), or — a parallel run of
an older version, killed before its controller merged them — one per xdist worker in gw0/, gw1/, …,
which are read together.
Records without `seed` are seed 0; without `params`, no sweep axes ({}).
"""
from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..metrics.compare import test_values
from ..metrics.metric import Metric
from ..metrics.records import METRICS, SUMMARY_METRICS
from ..metrics.registry import REGISTRY
from ..metrics.store import METRICS_FILE, PACKED_METRICS_FILE, NoRun, resolve_run, worker_dirs

#: Every column a report shows, with unit, direction and provenance: the store's METRICS, as a test's
#: or an arm's summary holds them (SUMMARY_METRICS: oom_kills there is the steps' sum), plus what a
#: per-test row derives from a trace's steps (the metric registry), plus the replayed inputs (their
#: provenance is the trace's own, per step in `profile_source`).
COLUMNS: dict[str, Metric] = {**METRICS, **SUMMARY_METRICS, **{
    m.name: m for m in REGISTRY.values() if m.name not in SUMMARY_METRICS}, **{m.name: m for m in (
    Metric("traces", "count", "none", "derived", "distinct traces replayed"),
    Metric("executed_steps", "count", "none", "derived", "steps that ran a command (sandbox skips edits/reads)"),
    Metric("replayed_duration_ms", "ms", "none", "trace", "the trace's step duration × the executor's time_scale "
           "(recorded/derived/synthetic: see profile_source)"),
    Metric("recorded_duration_ms", "ms", "none", "trace", "the trace's step duration, unscaled (see duration_source)"),
    Metric("replayed_peak_mb", "MiB", "none", "trace", "the trace's step memory peak "
           "(recorded/derived/synthetic: see profile_source)"),
)}}

#: What identifies one test's row: the same trace × arm × seed × params in one results directory.
TEST_KEY = ["run", "experiment", "trace_id", "config", "seed", "params"]
#: The metric columns of a test's row (runs.csv), in order: what `compare` can compare.
TEST_METRICS = ["total_steps", "executed_steps", "failed_steps", "latency_p50_ms", "latency_p95_ms",
                "latency_p99_ms", "latency_total_ms", "cpu_total_ms", "peak_rss_mb", "mem_high_events_total",
                "mem_high_steps", "mem_max_events_total", "oom_kills", "timeouts", "throttles_total", "freezes_total",
                "policy_kills_total", "pids_max_events_total",
                # what the arm's limits reserved and the steps used (metrics/reservation.py), GiB·s
                "step_time_s", "reserved_gib_s", "ceiling_reserved_gib_s", "soft_reserved_gib_s", "used_gib_s",
                "utilization", "idle_reserved_gib_s", "oracle_gib_s", "reserved_vs_oracle"]
#: Keys a metrics.jsonl record must have for a report to use it.
REQUIRED = ("trace_id", "step_id", "config", "latency_ms", "oom_kills", "mem_high_events", "mem_max_events")


class ResultsError(ValueError):
    """A results directory that cannot be read; the message names the file (and line)."""


@dataclass
class Results:
    """The records of one or more results directories and their DataFrames."""
    records: list[dict]
    sources: list[Path] = field(default_factory=list)     # the metrics.jsonl files read

    @cached_property
    def steps(self):
        import pandas as pd
        cols = ["run", "experiment", "trace_id", "config", "seed", "params", "step_id", "tool", "cmd",
                "executor", "executed", "latency_ms", "cpu_ms", "max_rss_mb", "mem_high_events",
                "mem_max_events", "oom_kills", "exit_code", "signal", "timed_out", "profile_source",
                "replayed_duration_ms", "replayed_peak_mb"]
        df = pd.DataFrame([{**r, "params": params_key(r["params"])} for r in self.records])
        if df.empty:
            return pd.DataFrame(columns=cols)
        extra = [c for c in df.columns if c not in cols]
        return df.reindex(columns=cols + extra)

    @cached_property
    def tests(self):
        return per_test_frame(self.records)

    def axes(self) -> dict[str, list]:
        """The sweep axes of these records: params name -> values, in order of first appearance."""
        out: dict[str, list] = {}
        for r in self.records:
            for k, v in r["params"].items():
                vals = out.setdefault(k, [])
                if v not in vals:
                    vals.append(v)
        return out


def params_key(params: dict) -> str:
    """A sweep point as text (a column value, a dict key): canonical JSON, "" for no params."""
    return json.dumps(params, sort_keys=True, separators=(",", ":")) if params else ""


def metrics_files(directory: str | Path) -> list[Path]:
    """The metrics.jsonl files of a run (a run directory, `results/latest`, or a results directory,
    which means its newest run: metrics/store.py resolve_run): its own, else one per xdist worker
    (gw*/) — also when its own is older than all of the workers' (left by an earlier run)."""
    try:
        d = resolve_run(directory)
    except NoRun as exc:
        raise ResultsError(str(exc)) from None
    top = d / METRICS_FILE
    if not top.is_file() and (d / PACKED_METRICS_FILE).is_file():
        return [d / PACKED_METRICS_FILE]    # a published run, compressed for the repository
    workers = [w / METRICS_FILE for w in worker_dirs(d) if (w / METRICS_FILE).is_file()]
    if top.is_file() and not (workers and min(w.stat().st_mtime for w in workers) > top.stat().st_mtime):
        return [top]            # a serial run's, or the workers' merged by the controller after they ended
    if workers:                 # (a top-level file older than every worker's is an earlier run's)
        return workers
    raise ResultsError(f"{d}: no {METRICS_FILE} (nor gw*/{METRICS_FILE} from xdist workers) — not a results directory")


def read_metrics(path: str | Path, run: str) -> list[dict]:
    """The step records of one metrics.jsonl (or metrics.jsonl.gz), checked; `run` labels where they
    came from."""
    path = Path(path)
    records = []
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    if not line.endswith("\n"):    # the last line, cut short by a killed run: as the
                        break                      # store reads it (store.read_records), its step is not there
                    raise ResultsError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
                records.append(_checked(rec, where, run))
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except (OSError, EOFError, zlib.error) as exc:       # gzip's BadGzipFile is an OSError
        raise ResultsError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return records


def _checked(rec, where: str, run: str) -> dict:
    if not isinstance(rec, dict):
        raise ResultsError(f"{where}: expected a JSON object per line, got {type(rec).__name__}")
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise ResultsError(f"{where}: missing field(s) {', '.join(missing)}")
    for k in ("latency_ms", "cpu_ms", "max_rss_mb", "oom_kills", "mem_high_events", "mem_max_events", "seed"):
        v = rec.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ResultsError(f"{where}: field {k}: expected a number, got {v!r}")
    seed, params = rec.get("seed"), rec.get("params")
    if params is not None and not isinstance(params, dict):
        raise ResultsError(f"{where}: field params: expected an object (sweep axis -> value), got {params!r}")
    return {**rec, "run": run, "experiment": rec.get("experiment") or "",
            "seed": 0 if seed is None else int(seed), "params": params or {},
            "executed": rec.get("executed", True), "timed_out": rec.get("timed_out", False)}


def load(dirs: str | Path | list[str | Path]) -> Results:
    """Read one results directory or several into a Results (`.steps`, `.tests` DataFrames).
    Each directory's rows carry its path in the `run` column. Raises ResultsError naming the file
    and line of the first record it cannot use."""
    dirs = [dirs] if isinstance(dirs, (str, Path)) else list(dirs)
    if not dirs:
        raise ResultsError("no results directory given")
    records, sources = [], []
    for d in dirs:
        for f in metrics_files(d):
            sources.append(f)
            records.extend(read_metrics(f, run=str(d)))
    return Results(records, sources)


def profiles(recs: list[dict]) -> str:
    """Where a test's replayed step profiles came from: `recorded` when any step replayed a recorded
    profile (a recorded trace's steps without a command, a file read, keep their source's derived
    figures), else the most common of its steps' provenances (derived, synthetic; `none` for real
    commands, which replay no profile)."""
    seen = Counter(str(r.get("profile_source")) for r in recs if r.get("profile_source"))
    if "recorded" in seen:
        return "recorded"
    return seen.most_common(1)[0][0] if seen else "none"


def _test_row(key: tuple, recs: list[dict]) -> dict:
    [values] = test_values(recs).values()       # the numbers the gate and `compare` compare
    return {
        **dict(zip(TEST_KEY, key)),
        "executor": ",".join(sorted({str(r.get("executor", "")) for r in recs})),
        "profiles": profiles(recs),
        **{k: values[k] for k in TEST_METRICS if k in values},
    }


def per_test_frame(records: list[dict]):
    """One row per trace × arm × seed × params per results directory (runs.csv), in first-seen order;
    each sweep axis also gets its own `param:<axis>` column."""
    import pandas as pd
    groups: dict[tuple, list[dict]] = {}
    params: dict[str, dict] = {}
    for r in records:
        pk = params_key(r["params"])
        params[pk] = r["params"]
        groups.setdefault(tuple(r[k] if k != "params" else pk for k in TEST_KEY), []).append(r)
    rows = [_test_row(k, recs) for k, recs in groups.items()]
    axes = sorted({a for p in params.values() for a in p})
    for row in rows:
        for a in axes:
            row[f"param:{a}"] = params[row["params"]].get(a)
    cols = [*TEST_KEY, *(f"param:{a}" for a in axes), "executor", "profiles", *TEST_METRICS]
    return pd.DataFrame(rows, columns=cols)


def ablation_deltas(tests, defaults: dict | None = None,
                    metrics=("latency_p95_ms", "oom_kills", "peak_rss_mb")):
    """For each sweep axis and each of its values other than the axis's default, per arm: the mean of
    each metric over the tests at that value minus the mean at the default value (other axes and
    seeds pooled). The default is `defaults[axis]`, else the axis's first value seen. An empty frame
    when there are no sweep axes."""
    import pandas as pd
    rows = []
    for col in (c for c in tests.columns if c.startswith("param:")):
        axis = col.split(":", 1)[1]
        values = list(dict.fromkeys(tests[col].dropna()))
        if not values:
            continue
        default = (defaults or {}).get(axis, values[0])
        for config, per_arm in tests.groupby("config", sort=False):
            base = per_arm[per_arm[col] == default]
            if base.empty:
                continue
            for value in values:
                if value == default:
                    continue
                at = per_arm[per_arm[col] == value]
                for m in metrics:
                    if at.empty or at[m].isna().all() or base[m].isna().all():
                        continue
                    rows.append({"axis": axis, "value": value, "default": default, "config": config, "metric": m,
                                 "default_mean": base[m].mean(), "mean": at[m].mean(),
                                 "delta": at[m].mean() - base[m].mean(), "tests": len(at)})
    return pd.DataFrame(rows, columns=["axis", "value", "default", "config", "metric", "default_mean", "mean",
                                       "delta", "tests"])
