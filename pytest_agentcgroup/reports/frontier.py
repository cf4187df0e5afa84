"""Reservation per arm and sweep point, and the kills-versus-reserved-memory frontier.

One row per results dir × experiment × arm × sweep point (params; seeds averaged): what the arm's
limits reserved over all its traces, what the steps used, utilization, idle reservation, the oracle's
reservation and the arm's ratio to it (GiB·s over the steps' recorded durations:
metrics/reservation.py) and the OOM kills there. A sweep of a limit
gives each arm one point per value: fewer kills cost more reserved memory, and the frontier figure
(figures.frontier) draws those points per arm. Tests whose traces replayed recorded profiles and
tests whose traces replayed profiles derived from 1 Hz samples (`profiles`, frames.profiles) are
kept apart: the same arm on both corpora is two series, and a run of both is a frontier to draw
even without a sweep.
"""
from __future__ import annotations

SUMS = ("oom_kills", "reserved_gib_s", "ceiling_reserved_gib_s", "soft_reserved_gib_s", "used_gib_s",
        "idle_reserved_gib_s", "oracle_gib_s", "step_time_s", "total_steps")
KEY = ["run", "experiment", "config", "params", "profiles"]
COLUMNS = [*KEY, "point", "seeds", "traces", *SUMS, "utilization", "reserved_vs_oracle"]


def point_name(params: str) -> str:
    """A sweep point's short name: its params' values joined (`p90`), or `-` without a matrix."""
    import json
    p = json.loads(params) if params else {}
    return ":".join(str(v) for v in p.values()) or "-"


def reservation_frame(tests):
    """Per run × experiment × arm × params × profiles: the sums over its traces (means over seeds) of
    SUMS, utilization = Σ used / Σ reserved, and reserved_vs_oracle = Σ reserved / Σ oracle over the
    steps with an oracle (a test's ratio × its oracle is its reserved GiB·s over those steps). Rows where
    no test carries a reservation are kept (None)."""
    import pandas as pd
    rows = []
    if tests.empty:
        return pd.DataFrame(rows, columns=COLUMNS)
    for key, sel in tests.groupby(KEY, sort=False):
        seeds = sel["seed"].nunique()
        row = dict(zip(KEY, key))
        row.update(point=point_name(key[3]), seeds=seeds, traces=sel["trace_id"].nunique())
        for k in SUMS:
            # each trace's mean over its own seeds, then the sum over traces: a seed missing for one
            # trace (skipped, failed before writing) does not shrink the arm's total
            per_trace = sel.groupby("trace_id", sort=False)[k].mean().dropna() if k in sel else []
            v = round(float(per_trace.sum()), 6) if len(per_trace) else None
            row[k] = int(v) if k in ("oom_kills", "total_steps") and v is not None and v.is_integer() else v
        both = sel.dropna(subset=["reserved_gib_s", "used_gib_s"]) if "reserved_gib_s" in sel else sel.iloc[0:0]
        res = both["reserved_gib_s"].sum() if len(both) else 0.0
        # utilization of the sums is the used share of what was reserved (a per-test mean would weight
        # a short trace like a long one)
        row["utilization"] = round(float(both["used_gib_s"].sum() / res), 6) if len(both) and res > 0 else None
        known = sel.dropna(subset=["reserved_vs_oracle", "oracle_gib_s"]) if "reserved_vs_oracle" in sel else sel.iloc[0:0]
        oracle = known["oracle_gib_s"].sum() if len(known) else 0.0
        row["reserved_vs_oracle"] = round(float((known["reserved_vs_oracle"] * known["oracle_gib_s"]).sum() / oracle), 6) \
            if oracle > 0 else None
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def frontier_frame(frame):
    """The rows (with a reservation) of the experiments that have a frontier to draw: some arm at two
    or more sweep points, or the experiment run on both recorded and other step profiles."""
    sel = frame.dropna(subset=["reserved_gib_s"])
    if sel.empty:
        return sel
    swept = sel.groupby(["run", "experiment", "config", "profiles"])["params"].transform("nunique") >= 2
    exp = ["run", "experiment"]
    corpora = sel.groupby(exp)["profiles"].transform("nunique") >= 2
    keep = (swept.groupby([sel[k] for k in exp]).transform("any")) | corpora
    return sel[keep]


def has_frontier(frame) -> bool:
    """True when some experiment has a frontier to draw (frontier_frame)."""
    return not frame.empty and not frontier_frame(frame).empty
