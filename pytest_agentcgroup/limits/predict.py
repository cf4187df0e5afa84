"""The predictive arm's limits (arms.py limit_from = "predict"): a step's limit is the `quantile` of
the recorded peaks of its command class in the training traces of the fold that held its trace out
(limits/model.py), plus the arm's margin_mb.

The quantile is the empirical one, nearest rank: the smallest training peak with at least `quantile`
of the class's peaks at or below it (a peak some step really had; 1.0 is the class's largest).
Fallback, stated: a class with fewer than `min_class_steps` training steps (or none: never seen)
takes the quantile of its kind's peaks (traces/classify.py: test, install, ..., or the tool), and a
kind with fewer, the quantile of every training peak.
With `history`, the agent's own history counts too: a step's limit is never below the largest
peak a step of its class reached earlier in the same trace (measured in the replay; recorded, in
accuracy()), which lifts a class whose peaks depend on the task (`python script` in a project that
imports a large package) from its second call on.

`accuracy()` judges the model like a classifier, each trace under the fold that held it out: the
share of steps whose limit covered their peak, the mean over-reservation (limit − peak, MiB, over
the covered steps) and the reservation against the steps' own peaks (Σ limit × time / Σ peak × time),
per command class and in all.

May import: limits/model.py, traces/ (classify).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..traces.classify import command_class
from .model import ALL, Model, groups, step_kind_of


def nearest_rank(sorted_peaks: list[float], q: float) -> float:
    return sorted_peaks[max(0, math.ceil(q * len(sorted_peaks)) - 1)]


@dataclass(frozen=True)
class Table:
    """The limits of one fold at one quantile: by class, by kind, and of all its training peaks."""
    by_class: dict
    by_kind: dict
    overall: float
    training: tuple

    @classmethod
    def build(cls, model: Model, scheme: str, fold: str, q: float, least: int) -> "Table":
        training = model.training(scheme, fold)
        by_class: dict[str, list] = {}
        by_kind: dict[str, list] = {}
        for tid in training:
            for c, kind, peak, _ in model.data["traces"][tid]["steps"]:
                by_class.setdefault(c, []).append(peak)
                by_kind.setdefault(kind, []).append(peak)
        every = sorted(p for ps in by_class.values() for p in ps)
        if not every:
            raise ValueError(f"{model.path}: fold {scheme}/{fold} has no training step")
        return cls({c: nearest_rank(sorted(p), q) for c, p in by_class.items() if len(p) >= least},
                   {k: nearest_rank(sorted(p), q) for k, p in by_kind.items() if len(p) >= least},
                   nearest_rank(every, q), tuple(training))

    def limit(self, cls_: str, kind: str) -> tuple[float, str]:
        """(MiB, where it came from: "class", "kind" or "all")."""
        if cls_ in self.by_class:
            return self.by_class[cls_], "class"
        if kind in self.by_kind:
            return self.by_kind[kind], "kind"
        return self.overall, "all"


_TABLES: dict[tuple, Table] = {}


def table(model: Model, scheme: str, fold: str, q: float, least: int) -> Table:
    key = (model.path, scheme, fold, q, least)
    if key not in _TABLES:
        _TABLES[key] = Table.build(model, scheme, fold, q, least)
    return _TABLES[key]


class Predictor:
    """The limits of one trace's steps: its fold's table (built once per fold and quantile)."""

    def __init__(self, model: Model, trace, *, quantile: float, folds: str, min_class_steps: int,
                 history: bool = False):
        self.group = groups(trace)[folds]
        self.fold = model.fold_for(folds, self.group)
        self.table = table(model, folds, self.fold, quantile, min_class_steps)
        self.history: dict[str, float] | None = {} if history else None    # class -> largest peak so far

    def limit_mb(self, step) -> float:
        cls_ = command_class(step)
        limit = self.table.limit(cls_, step_kind_of(step))[0]
        return max(limit, self.history.get(cls_, 0.0)) if self.history is not None else limit

    def observe(self, step, peak_mb: float | None) -> None:
        if self.history is not None and peak_mb is not None:
            cls_ = command_class(step)
            self.history[cls_] = max(self.history.get(cls_, 0.0), peak_mb)


def accuracy(model: Model, *, quantile: float, folds: str, min_class_steps: int = 3,
             margin_mb: float = 0.0, history: bool = False) -> dict:
    """{"classes": {class: row}, "all": row}, each row: steps, covered (share), over_mb (mean limit −
    peak over covered steps), reserved_vs_peak (Σ limit × ms / Σ peak × ms), fallback (steps whose
    class had too few training steps). Every trace under the fold that holds its group out."""
    rows: dict[str, dict] = {}
    for tid, t in model.data["traces"].items():
        fold = model.fold_for(folds, t[folds])
        if fold == ALL:          # pragma: no cover - every trace of the model is in a fold
            continue
        tab = table(model, folds, fold, quantile, min_class_steps)
        assert tid not in tab.training, f"{tid} trains the fold that holds it out"
        seen: dict[str, float] = {}                  # the trace's own earlier peaks by class (history)
        for c, kind, peak, ms in t["steps"]:
            mib, source = tab.limit(c, kind)
            mib = (max(mib, seen.get(c, 0.0)) if history else mib) + margin_mb
            seen[c] = max(seen.get(c, 0.0), peak)
            for key in (c, None):
                r = rows.setdefault(key, {"steps": 0, "covered": 0, "over": 0.0, "lim_ms": 0.0, "peak_ms": 0.0,
                                          "fallback": 0})
                r["steps"] += 1
                r["covered"] += mib >= peak
                r["over"] += mib - peak if mib >= peak else 0.0
                r["lim_ms"] += mib * ms
                r["peak_ms"] += peak * ms
                r["fallback"] += source != "class"

    def out(r):
        return {"steps": r["steps"], "covered": round(r["covered"] / r["steps"], 4),
                "over_mb": round(r["over"] / r["covered"], 2) if r["covered"] else None,
                "reserved_vs_peak": round(r["lim_ms"] / r["peak_ms"], 3) if r["peak_ms"] > 0 else None,
                "fallback": r["fallback"]}
    classes = {c: out(r) for c, r in sorted(rows.items(), key=lambda kv: -kv[1]["steps"]) if c is not None}
    return {"quantile": quantile, "folds": folds, "min_class_steps": min_class_steps, "margin_mb": margin_mb,
            "history": history,
            "classes": classes, "all": out(rows[None]) if None in rows else None}
