"""Limits from the agent's own earlier tool calls in the trace (arms.py limit_from "vpa", "window"):
each step's hard limit is computed before it runs from the peaks of the steps before it, never from
its own. Both see what a recommender on a host would see: each earlier step's measured peak (its
cgroup's) and whether it was OOM-killed.

VPA (Kubernetes' vertical pod autoscaler's recommender, its published defaults as the arm's knobs'):
each peak is a sample of a decaying histogram with VPA's memory buckets (exponential: the first
10^7 bytes wide, each 5 % wider than the one before); the target is the `percentile` (0.9) of the
histogram, read as the end of the bucket it falls in (as VPA's histogram does), times
1 + `margin_fraction` (0.15), and never below `floor_mb` (250, pod-recommendation-min-memory-mb).
`half_life_steps`: a sample's weight halves every that many tool calls (VPA: 24 h; absent here: no
decay, 24 h being longer than any trace). After an OOM kill VPA adds a sample of max(L x
`oom_bump_ratio`, L + `oom_min_bump_mb`) (1.2, 100 MiB), L the memory the killed container had
(here its limit, which its usage reached); and the next step's limit is at least that sample, so the
kill raises the very next recommendation. A histogram with no sample has no recommendation: the
first step gets `cold_start_mb`.

Window (Autopilot, EuroSys 2020, its moving-window recommenders): the max, or the `percentile`
(nearest rank), of the last `window` peaks, times 1 + `margin_fraction`, never below `floor_mb`;
`cold_start_mb` before the first peak. A killed step's peak is what it reached, its limit: the
window then never rises above it (every later step bigger is killed too) unless the arm sets
`oom_bump_ratio` and `oom_min_bump_mb`, VPA's response, which Autopilot's paper does not give for
its windows: then a kill counts as a peak of max(limit x ratio, limit + MiB).

May import: arms (the knobs). Pure arithmetic: no cgroup, no trace.
"""
from __future__ import annotations

import math
from collections import deque

MIB = 1024 * 1024
#: VPA's memory histogram (recommender model: aggregations_config): bucket i starts at
#: FIRST x (RATIO^i - 1) / (RATIO - 1) bytes, up to MAX bytes
VPA_FIRST_BUCKET_BYTES, VPA_BUCKET_RATIO, VPA_MAX_BYTES = 1e7, 1.05, 1e12
_VPA_BUCKETS = math.ceil(math.log(VPA_MAX_BYTES * (VPA_BUCKET_RATIO - 1) / VPA_FIRST_BUCKET_BYTES + 1)
                         / math.log(VPA_BUCKET_RATIO)) + 1


def vpa_bucket(mib: float) -> int:
    """The index of VPA's memory bucket holding `mib` MiB."""
    b = mib * MIB
    if b < VPA_FIRST_BUCKET_BYTES:
        return 0
    i = int(math.log(b * (VPA_BUCKET_RATIO - 1) / VPA_FIRST_BUCKET_BYTES + 1) / math.log(VPA_BUCKET_RATIO))
    return min(i, _VPA_BUCKETS - 1)


def vpa_bucket_start(i: int) -> float:
    """Where VPA's bucket `i` starts, in MiB."""
    return VPA_FIRST_BUCKET_BYTES * (VPA_BUCKET_RATIO ** i - 1) / (VPA_BUCKET_RATIO - 1) / MIB


class VPA:
    """VPA's recommender over one trace's steps: limit_mb() before a step, observe() after it."""

    def __init__(self, knobs: dict):
        self.k = knobs
        self.weights: dict[int, float] = {}     # bucket -> weight
        self.bump: float | None = None          # after a kill: the next limit's least value

    def add(self, mib: float) -> None:
        i = vpa_bucket(mib)
        self.weights[i] = self.weights.get(i, 0.0) + 1.0

    def percentile(self, p: float) -> float | None:
        """VPA's histogram percentile (MiB): the end of the bucket where the cumulative weight reaches
        p of the total (the start of the last bucket there is none after); None when empty."""
        total = sum(self.weights.values())
        if total <= 0:
            return None
        acc, last = 0.0, max(self.weights)
        for i in sorted(self.weights):
            acc += self.weights[i]
            if acc >= p * total or i == last:
                return vpa_bucket_start(i + 1 if i < _VPA_BUCKETS - 1 else i)
        return None     # pragma: no cover - the loop returns at the last bucket

    def limit_mb(self) -> float:
        target = self.percentile(self.k["percentile"])
        if target is None:
            return float(self.k["cold_start_mb"])
        limit = max(target * (1 + self.k["margin_fraction"]), float(self.k["floor_mb"]))
        return max(limit, self.bump) if self.bump is not None else limit

    def observe(self, limit_mb: float | None, peak_mb: float | None, oom_killed: bool) -> None:
        """After a step: its limit, its measured peak and whether it was OOM-killed. Earlier samples
        decay by one tool call's worth first (the newest weighs 1)."""
        h = self.k.get("half_life_steps")
        if h:
            for i in self.weights:
                self.weights[i] *= 2.0 ** (-1.0 / h)
        self.bump = None
        if oom_killed and limit_mb is not None:
            used = max(limit_mb, peak_mb or 0.0)
            self.bump = max(used * self.k["oom_bump_ratio"], used + self.k["oom_min_bump_mb"])
            self.add(self.bump)
        elif peak_mb is not None:
            self.add(peak_mb)


class Window:
    """Autopilot's moving window over one trace's steps: limit_mb() before a step, observe() after it."""

    def __init__(self, knobs: dict):
        self.k = knobs
        self.peaks: deque[float] = deque(maxlen=int(knobs["window"]))

    def limit_mb(self) -> float:
        if not self.peaks:
            return float(self.k["cold_start_mb"])
        if self.k["statistic"] == "max":
            stat = max(self.peaks)
        else:                                    # nearest rank: the smallest peak with >= p of them at or below
            xs = sorted(self.peaks)
            stat = xs[max(0, math.ceil(self.k["percentile"] * len(xs)) - 1)]
        return max(stat * (1 + self.k["margin_fraction"]), float(self.k["floor_mb"]))

    def observe(self, limit_mb: float | None, peak_mb: float | None, oom_killed: bool) -> None:
        ratio, least = self.k.get("oom_bump_ratio"), self.k.get("oom_min_bump_mb")
        if oom_killed and limit_mb is not None and ratio is not None:
            used = max(limit_mb, peak_mb or 0.0)
            self.peaks.append(max(used * ratio, used + least))
        elif peak_mb is not None:
            self.peaks.append(peak_mb)
