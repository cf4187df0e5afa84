"""Memory usage of a step's cgroup over time: sampled at a fixed period while the step runs.

A step's peak (memory.peak, max_usage_in_bytes) says how tall it got, not how long it held it; what
memory a limit leaves idle needs the integral of usage over the step's time. The kernel keeps no
such integral, so one thread per placement reads the step cgroup's usage (v2 memory.current | v1
memory.usage_in_bytes) every `period_s` between `start(cg)` and `stop()`, and the integral is the
trapezoid rule over those samples plus one last reading at stop.

The first reading is taken as soon as the step's window opens (before its program runs, so it is
the cgroup's baseline, e.g. the parked shell); a step shorter than the period has only that reading
and the last one, so its integral is under-sampled: `samples` says how many readings it rests on.

With `keep_samples=True` the readings themselves are kept too (`curve`: ms after the window opened,
bytes), for a profile's memory curve (`agentcgroup traces profile`).
"""
from __future__ import annotations

import threading
import time

MB = 1024 * 1024


class UsageSampler:
    def __init__(self, period_s: float = 0.02, *, keep_samples: bool = False):
        if period_s <= 0:
            raise ValueError(f"usage sampling period must be positive, got {period_s!r}")
        self.period_s = period_s
        self.keep_samples = keep_samples
        self.curve: list[tuple[float, int]] = []      # the last window's readings (keep_samples)
        self._cond = threading.Condition()
        self._cg = None
        self._gen = 0                      # which window a reading belongs to (start/stop move it on)
        self._samples: list[tuple[float, int]] = []
        self._t0 = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self, cg) -> None:
        """Open a step's window on `cg` (made on first use: one thread per sampler, not per step)."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="agentcgroup-usage", daemon=True)
                self._thread.start()
            self._cg, self._gen, self._samples, self._t0 = cg, self._gen + 1, [], time.monotonic()
            self.curve = []                # never the previous window's readings for this one
            self._cond.notify_all()

    def stop(self) -> dict:
        """Close the window: {"usage_mib_ms": integral over it, "usage_samples": readings,
        "usage_window_ms": its length}; {} when no window was open."""
        with self._cond:                   # a reading in flight holds the lock: none runs after this
            cg, samples, t0 = self._cg, self._samples, self._t0
            self._cg, self._gen, self._samples = None, self._gen + 1, []
            if cg is None:
                self.curve = []
                return {}
            last = _read(cg)
        t1 = time.monotonic()
        if last is not None:
            samples = [*samples, (t1, last)]
        if self.keep_samples:
            self.curve = [((t - t0) * 1000.0, v) for t, v in samples]
        return {"usage_mib_ms": integral_mib_ms(samples, t0, t1), "usage_samples": len(samples),
                "usage_window_ms": (t1 - t0) * 1000.0}

    def close(self) -> None:
        with self._cond:
            self._closed, self._cg = True, None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def _loop(self) -> None:
        with self._cond:
            while not self._closed:
                if self._cg is None:
                    self._cond.wait()
                    continue
                # read under the lock: stop() (and the cgroup's removal after it) never races a read
                gen, value = self._gen, _read(self._cg)
                if value is not None:
                    self._samples.append((time.monotonic(), value))
                # sleep one period unless the window changes first
                deadline = time.monotonic() + self.period_s
                while self._gen == gen and not self._closed and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)


def _read(cg) -> int | None:
    try:
        return cg.usage_bytes()
    except (OSError, ValueError):           # the cgroup is going away
        return None


def integral_mib_ms(samples: list[tuple[float, int]], t0: float, t1: float) -> float:
    """∫ usage dt over [t0, t1] in MiB·ms, from (monotonic s, bytes) readings: trapezoids between
    readings, the first reading held back to t0 and the last held on to t1."""
    pts = sorted((t, v) for t, v in samples if t0 <= t <= t1)
    if not pts or t1 <= t0:
        return 0.0
    total = pts[0][1] * (pts[0][0] - t0) + pts[-1][1] * (t1 - pts[-1][0])
    for (ta, va), (tb, vb) in zip(pts, pts[1:]):
        total += (va + vb) / 2 * (tb - ta)
    return total / MB * 1000.0
