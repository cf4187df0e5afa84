"""The `paper` subset and the static limits Experiment 1's frontier sweeps, both computed from the data.

Paper subset (about 50 traces, chosen for spread of memory peaks, not at random): each trace's peak
is its largest recorded step peak (manifest `peak_mb`). Traces fall into doubling bins of that peak
(< 32, 32-64, 64-128, 128-256, 256-512, 512-1024, >= 1024 MiB). Every bin gets the same quota q,
the largest q for which the bins' takes (min(size, q) each) fit in n; the traces still missing to
reach n go one per bin, highest-peak bins first, to bins with traces left. Inside a bin the chosen
traces are spread evenly over the bin's peak order (smallest and largest always in), ties broken by
trace id. So sparse bins — where the traces with limit-relevant steps are — are taken whole and the
crowded small-peak bins are thinned.

Swept limits: percentiles (linear interpolation, numpy's default) of the subset's trace peaks,
rounded up to whole MiB: p50 (half the traces fit), p90, p99 and max (every trace's peak fits, with
no headroom). They go into each swept arm's limit: static-toolcall's and static-env's memory_max_mb,
static-high's, agentcgroup's and bpf-soft's memory_high_mb (their ceiling stays).

    agentcgroup traces sweep traces                    # print the subset and the matrix
    agentcgroup traces sweep traces --write-manifest   # (re)write subsets.paper

The recorded corpus gets the same, drawn from subset `recorded` instead of `full`, and a smoke
subset of SMOKE_SIZE traces: each agent's (source format's) largest-peak trace first, agents in the
order of those peaks, then the largest peaks left (ties by trace id), so the smoke run keeps more
than one agent; beside it their derived twins where they exist (the trace of `full` made from the
same source run, its profiles derived from 1 Hz samples), so that a run of both compares the two
profiles of the same runs:

    agentcgroup traces sweep traces --from recorded --name paper-recorded --smoke recorded-smoke --write-manifest
    # writes subsets.paper-recorded, subsets.recorded-smoke and subsets.recorded-smoke-1hz

Both draw only from the traces an experiment may take (metrics/source_faithfulness.py `left_out`:
a trace replayed here only when its stored faithfulness verdict passes); `traces sweep` says how
many it left out and why, and `--include-unfaithful` takes them all.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

PEAK_BINS_MB = (32, 64, 128, 256, 512, 1024)
PAPER_SIZE = 50
SMOKE_SIZE = 5
#: the suffix of a smoke subset's derived twins: `recorded-smoke` -> `recorded-smoke-1hz`
TWINS_SUFFIX = "-1hz"
PERCENTILES = (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
#: arm -> the limit a sweep point sets on it
SWEPT = {"static-toolcall": "memory_max_mb", "static-env": "memory_max_mb", "static-high": "memory_high_mb",
         "agentcgroup": "memory_high_mb", "bpf-soft": "memory_high_mb"}


def peak_bin(peak_mb: float) -> int:
    """The index of a peak's doubling bin (0: below the first edge)."""
    return sum(1 for edge in PEAK_BINS_MB if peak_mb >= edge)


def _spread(items: list, k: int) -> list:
    """k items evenly spread over `items` (both ends in when k >= 2)."""
    if k >= len(items):
        return list(items)
    if k == 1:
        return [items[len(items) // 2]]
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def paper_subset(entries: list[dict], n: int = PAPER_SIZE) -> list[str]:
    """Trace ids of the paper subset of manifest `entries` (trace_id, peak_mb), in peak order."""
    bins: dict[int, list[dict]] = {}
    for e in sorted(entries, key=lambda e: (float(e.get("peak_mb") or 0.0), e["trace_id"])):
        bins.setdefault(peak_bin(float(e.get("peak_mb") or 0.0)), []).append(e)
    q = 0
    while q < max((len(v) for v in bins.values()), default=0) and \
            sum(min(len(v), q + 1) for v in bins.values()) <= n:
        q += 1
    take = {b: min(len(v), q) for b, v in bins.items()}
    left = n - sum(take.values())
    for b in sorted(bins, reverse=True):             # the rest: one more per bin, highest peaks first
        if left <= 0:
            break
        if take[b] < len(bins[b]):
            take[b] += 1
            left -= 1
    chosen = [e for b in sorted(bins) for e in _spread(bins[b], take[b])]
    return [e["trace_id"] for e in chosen]


def percentile(values, q: float) -> float:
    xs = sorted(values)
    if not xs:
        raise ValueError("no values")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def sweep_limits(peaks_mb, percentiles=PERCENTILES) -> dict[str, int]:
    """name -> limit in MiB: each percentile of the trace peaks, rounded up to a whole MiB."""
    return {name: int(math.ceil(percentile(peaks_mb, q) - 1e-9)) for name, q in percentiles}


def matrix_toml(limits: dict[str, int], arms=SWEPT) -> str:
    """The `ablations` list of an experiment's matrix that sets each swept arm's limit per point."""
    lines = ["ablations = ["]
    for name, mb in limits.items():
        over = ", ".join(f"{a} = {{ {key} = {mb} }}" for a, key in arms.items())
        lines.append(f'  {{ name = "{name}", arms = {{ {over} }} }},')
    return "\n".join(lines + ["]"])


class NoSubset(KeyError):
    """The manifest has no subset of this name."""


def manifest_entries(root: Path, subset: str = "full") -> tuple[dict, list[dict]]:
    """The manifest and the entries of `subset`'s traces (NoSubset names a missing subset)."""
    data = json.loads((root / "manifest.json").read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("subsets"), dict) or not isinstance(data.get("traces"), list):
        raise ValueError("not a manifest: an object with `subsets` and `traces`")
    if subset not in data["subsets"] and subset != "full":        # `full` is every trace when not listed
        raise NoSubset(subset)
    listed = data["subsets"].get(subset)
    chosen = set(listed if listed is not None else [e["trace_id"] for e in data["traces"]])
    return data, [e for e in data["traces"] if e["trace_id"] in chosen]


def read_trace(root: Path, data: dict, trace_id: str):
    """The trace `trace_id` from the file the manifest `data` lists it in (ValueError when absent)."""
    from .ir import read_traces
    path = root / next(e["file"] for e in data["traces"] if e["trace_id"] == trace_id)
    trace = next((t for t in read_traces(path) if t.trace_id == trace_id), None)
    if trace is None:
        raise ValueError(f"{path}: has no trace {trace_id!r}, which the manifest lists there")
    return trace


def breadth_keys(trace) -> dict:
    """What a subset's breadth counts of a trace: its agent (the source format) and its task's
    repository (owner/name; None when the trace names no task)."""
    from .task import task_of
    task = task_of(trace)
    src = trace.source if isinstance(trace.source, dict) else {}
    return {"agent": src.get("format") or trace.trace_id.split("/", 1)[0],
            "repository": task.repository if task is not None else None}


def breadth(entries: list[dict]) -> str:
    """`12 traces, 3 agents, 5 repositories` of entries carrying `breadth_keys`."""
    agents = {e.get("agent") for e in entries}
    repos = {e.get("repository") for e in entries if e.get("repository")}
    return f"{len(entries)} traces, {len(agents)} agent(s), {len(repos)} repositories"


def derived_twins(root: Path, data: dict, ids: list[str]) -> dict[str, str]:
    """Trace id of `ids` -> the trace of subset `full` made from the same source run (same source
    dataset and path) whose profiles were not recorded here (no `source.profiled`): the 1 Hz
    original of a profiled copy. Ids without one are left out."""
    files = {e["trace_id"]: root / e["file"] for e in data["traces"]}

    def source(tid):
        return read_trace(root, data, tid).source

    def run_of(src):
        return (src.get("dataset"), src.get("path")) if src.get("dataset") and src.get("path") else None

    originals = {}
    for tid in data["subsets"].get("full", files):
        src = source(tid)
        if "profiled" not in src and run_of(src):
            originals.setdefault(run_of(src), tid)
    return {tid: originals[run_of(src)] for tid in ids
            if run_of(src := source(tid)) in originals and originals[run_of(src)] != tid}


def smoke_subset(entries: list[dict], n: int = SMOKE_SIZE) -> list[str]:
    """n trace ids of `entries` (trace_id, peak_mb, agent): each agent's largest-peak trace first,
    agents by that peak, then the largest peaks left; ties by trace id."""
    by_peak = sorted(entries, key=lambda e: (-float(e.get("peak_mb") or 0.0), e["trace_id"]))
    firsts: dict = {}
    for e in by_peak:
        firsts.setdefault(e.get("agent"), e["trace_id"])
    chosen = list(firsts.values())[:n]
    chosen += [e["trace_id"] for e in by_peak if e["trace_id"] not in chosen][:n - len(chosen)]
    return chosen
