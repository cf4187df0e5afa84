"""`agentcgroup traces select`: classify IR traces of any source and draw seeded, stratified subsets.

Per bash step: its kind (`classify.classify_command`: test, install, build, vcs, search, fileops, other).
Per trace (`describe`):

* `length`: short (<= 20 steps) / medium / long (>= 50 steps), as in build_corpus.
* `category`: the dominant bash kind (`classify.dominant_kind`, weighted by recorded duration when
  steps have one, else each bash step counts 1); "other" when the trace has no bash step.
* `bursty`, with `bursty_basis` saying what it was judged on, the best evidence the trace has:
  `peak_mb` (resource profile: some step's peak >= 3x the median step peak and >= 100 MiB, as in
  build_corpus), else `duration` (some step lasts >= 3x the median step and >= 10 s), else `commands`
  (traces without measurements, e.g. OpenHands rows: heavy commands - test/build/install - come in a
  cluster, at least 3 of them within 5 consecutive bash steps, while they are under half of all bash
  steps), else `none` (no bash step: not bursty).

Strata are (source format, length, category, bursty). Sampling with a seed: traces in each stratum
are shuffled (random.Random(seed), after sorting by trace_id so input order does not matter), then
taken round-robin over the strata (strata order shuffled too), one per stratum per round; every subset
is a prefix of that one ordering, so smoke (5) is in dev (20) is in paper (50-100) is in full (all),
and a subset at least as large as the number of strata covers every stratum.

Output: OUT/traces/<trace id>.json (IR, one trace each) and OUT/manifest.json (agentcgroup-manifest/1,
see corpus.py) with the subsets and each trace's descriptive keys.
"""
from __future__ import annotations

import json
import random
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Sequence

from .shape import is_bursty, length_class, step_peaks
from .classify import KINDS, classify_command, dominant_kind
from .corpus import MANIFEST, MANIFEST_SCHEMA, ir_files
from .ir import Trace, TraceError, read_traces, write_trace

DEFAULT_SIZES = {"smoke": 5, "dev": 20, "paper": 100}
PAPER_MIN = 50
HEAVY = frozenset({"test", "build", "install"})
DUR_FACTOR, DUR_MIN_MS = 3.0, 10_000.0
CLUSTER_N, CLUSTER_WINDOW = 3, 5


def step_kinds(trace: Trace) -> list[str]:
    """The kind of each bash step, in order."""
    return [classify_command(s.command or "") for s in trace.steps if s.tool == "bash"]


def _bursty(trace: Trace, kinds: Sequence[str]) -> tuple[bool, str]:
    peaks = step_peaks(trace)
    if peaks:
        return is_bursty(peaks), "peak_mb"
    durs = [s.duration_ms.value for s in trace.steps if s.duration_ms is not None]
    if durs:
        med = statistics.median(durs)
        return any(d >= DUR_FACTOR * med and d >= DUR_MIN_MS for d in durs), "duration"
    if not kinds:
        return False, "none"
    heavy = [k in HEAVY for k in kinds]
    if sum(heavy) * 2 >= len(heavy):
        return False, "commands"
    clustered = any(sum(heavy[i:i + CLUSTER_WINDOW]) >= CLUSTER_N for i in range(max(1, len(heavy) - CLUSTER_WINDOW + 1)))
    return clustered, "commands"


def describe(trace: Trace) -> dict[str, Any]:
    bash = [s for s in trace.steps if s.tool == "bash"]
    kinds = step_kinds(trace)
    timed = any(s.duration_ms is not None for s in bash)
    weights = [s.duration_ms.value if s.duration_ms else 0.0 for s in bash] if timed else None
    bursty, basis = _bursty(trace, kinds)
    counts = Counter(kinds)
    return {
        "trace_id": trace.trace_id,
        "format": str(trace.source.get("format", "?")),
        "steps": len(trace.steps),
        "bash_steps": len(bash),
        "length": length_class(len(trace.steps)),
        "category": dominant_kind([s.command or "" for s in bash], weights) if bash else "other",
        "kinds": {k: counts[k] for k in KINDS if counts[k]},
        "bursty": bursty,
        "bursty_basis": basis,
    }


def stratum(entry: dict) -> tuple:
    return (entry["format"], entry["length"], entry["category"], entry["bursty"])


def order(entries: Sequence[dict], seed: int) -> list[str]:
    """All trace ids in the seeded stratified round-robin order (subsets are its prefixes)."""
    rng = random.Random(seed)
    strata: dict[tuple, list[str]] = {}
    for e in sorted(entries, key=lambda e: e["trace_id"]):
        strata.setdefault(stratum(e), []).append(e["trace_id"])
    keys = sorted(strata, key=repr)
    for k in keys:
        rng.shuffle(strata[k])
    rng.shuffle(keys)
    out: list[str] = []
    rnd = 0
    while len(out) < len(entries):
        for k in keys:
            if rnd < len(strata[k]):
                out.append(strata[k][rnd])
        rnd += 1
    return out


def select(entries: Sequence[dict], seed: int, sizes: dict[str, int] | None = None) -> dict[str, list[str]]:
    """Subsets name -> trace ids (prefixes of `order`), plus `full`."""
    sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
    ids = order(entries, seed)
    subsets = {name: ids[:max(0, n)] for name, n in sizes.items()}
    subsets["full"] = ids
    return subsets


def _safe_name(trace_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", trace_id).strip("._")[:200] or "trace"


def load(paths: Iterable[Path]) -> tuple[list[Trace], list[str]]:
    """Traces from IR files/directories; errors (one line each) for files that are not valid IR."""
    traces: list[Trace] = []
    errors: list[str] = []
    seen: set[str] = set()
    for f in ir_files(paths):
        try:
            for t in read_traces(f):
                if t.trace_id in seen:
                    errors.append(f"{f}: duplicate trace_id {t.trace_id!r}; the first is kept")
                    continue
                seen.add(t.trace_id)
                traces.append(t)
        except TraceError as exc:
            errors.append(str(exc))
    return traces, errors


def build(traces: Sequence[Trace], out: Path, *, seed: int, sizes: dict[str, int] | None = None,
          write: Sequence[str] | None = None) -> dict:
    """Describe, select, and write the traces of subsets `write` (default: all) + manifest.json."""
    entries = [describe(t) for t in traces]
    subsets = select(entries, seed, sizes)
    wanted = set().union(*(subsets[n] for n in (write or subsets)))
    out.mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(exist_ok=True)
    used: set[str] = set()
    manifest_traces = []
    by_id = {t.trace_id: t for t in traces}
    for e in entries:
        if e["trace_id"] not in wanted:
            continue
        name = _safe_name(e["trace_id"])
        base, i = name, 1
        while name in used:
            i += 1
            name = f"{base}-{i}"
        used.add(name)
        rel = f"traces/{name}.json"
        write_trace(by_id[e["trace_id"]], out / rel)
        manifest_traces.append(dict(e, file=rel))
    subsets = {k: [x for x in v if x in wanted] for k, v in subsets.items() if k in (write or subsets)}
    manifest = {"schema": MANIFEST_SCHEMA, "seed": seed, "strata": "format, length, category, bursty",
                "subsets": subsets, "traces": manifest_traces}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def coverage(manifest: dict) -> dict[str, dict]:
    entries = {e["trace_id"]: e for e in manifest["traces"]}
    all_strata = {stratum(e) for e in entries.values()}
    rep = {}
    for name, ids in manifest["subsets"].items():
        got = {stratum(entries[i]) for i in ids}
        rep[name] = {"traces": len(ids), "strata": len(got), "of_strata": len(all_strata),
                     "categories": dict(Counter(entries[i]["category"] for i in ids)),
                     "lengths": dict(Counter(entries[i]["length"] for i in ids)),
                     "bursty": sum(entries[i]["bursty"] for i in ids)}
    return rep
