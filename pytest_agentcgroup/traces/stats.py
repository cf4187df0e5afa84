"""Distribution summaries of derived figures: a quantile by numpy's default rule, and the
P50 / P95 / max summary every characterization table prints. Imports nothing from the package."""
from __future__ import annotations

import math
from typing import Any, Sequence


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default); None for no values."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def dist(values: Sequence[float], nd: int = 1) -> dict[str, Any]:
    r = (lambda x: None if x is None else round(x, nd))
    return {"n": len(values), "p50": r(quantile(values, 0.5)), "p95": r(quantile(values, 0.95)),
            "max": r(max(values)) if values else None, "provenance": "derived"}
