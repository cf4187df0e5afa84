"""A trace's shape, as the corpus manifest and `agentcgroup traces select` describe it: its length
class (by step count) and whether its memory is bursty (one step far above the trace's median)."""
from __future__ import annotations

import statistics

from .ir import Trace

SHORT_MAX, LONG_MIN = 20, 50            # steps: short <= 20 < medium < 50 <= long
BURST_FACTOR, BURST_MIN_MB = 3.0, 100.0


def length_class(n_steps: int) -> str:
    return "short" if n_steps <= SHORT_MAX else "long" if n_steps >= LONG_MIN else "medium"


def step_peaks(trace: Trace) -> list[float]:
    return [s.profile.peak_mb.value for s in trace.steps if s.profile.peak_mb is not None]


def is_bursty(peaks: list[float]) -> bool:
    """Some step's peak is >= BURST_FACTOR x the trace's median step peak and >= BURST_MIN_MB."""
    if not peaks:
        return False
    med = statistics.median(peaks)
    return any(p >= BURST_FACTOR * med and p >= BURST_MIN_MB for p in peaks)
