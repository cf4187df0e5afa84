"""The table a multitenant study prints for one arm (and keeps in the benchmark JSON): each tenant's
row alone and with the noisy neighbour, the ratios, the host probe.

May import: nothing of the package.
"""
from __future__ import annotations

from pathlib import Path


def lines(s: dict[str, dict], arm, a_ratio, b_ratio, probe_p99) -> list[str]:
    """The rows of `s` (phase -> Tenant.summary()) under `arm`, the ratios and the probe's p99."""
    fmt = lambda v: "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))   # noqa: E731
    cols = [("tenant", 6), ("phase", 8), ("steps", 5), ("failed_steps", 6), ("latency_p50_ms", 8),
            ("latency_p95_ms", 8), ("latency_p99_ms", 8), ("page_load_p50_ms", 8), ("page_load_p95_ms", 8),
            ("test_step_p95_ms", 8), ("test_step_stdev_ms", 8), ("oom_kills", 4), ("pids_max_events", 7), ("throttles", 4),
            ("cpu_s", 6), ("cpu_weight", 6)]
    heads = ["tenant", "phase", "steps", "failed", "p50 ms", "p95 ms", "p99 ms", "load p50", "load p95",
             "test p95", "test sd", "OOM", "pids.max", "thr", "cpu s", "weight"]
    lines = [f"Experiment 3 — multi-tenant isolation, arm {arm.name} (limits {arm.limits or 'none'}"
             f"{', policy ' + arm.policy if getattr(arm, 'policy', None) else ''}); latencies recorded here, "
             "on a shared 2-core host: noisy",
             "  ".join(h.rjust(w) if i > 1 else h.ljust(w) for i, (h, (_, w)) in enumerate(zip(heads, cols)))]
    for key in ("A-solo", "A", "B-solo", "B", "C"):
        row = s[key]
        lines.append("  ".join(fmt(row[k]).rjust(w) if i > 1 else fmt(row[k]).ljust(w) for i, (k, w) in enumerate(cols)))
    lines.append(f"A page-load p95 with C / alone: {fmt(a_ratio)}x; B step p95 with C / alone: {fmt(b_ratio)}x; "
                 f"host probe p99 lateness while C ran: {fmt(probe_p99)} ms; load average {loadavg()}")
    for key, row in s.items():
        if row["error"]:
            lines.append(f"tenant {key}: {row['error']}")
    return lines


def loadavg() -> str:
    """The host's 1/5/15-minute load average as the kernel reports it (a shared machine's context)."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None
