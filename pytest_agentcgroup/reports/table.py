"""Plain-text tables for the terminal: one row per experiment × arm."""
from __future__ import annotations

COLUMNS = [("experiment", "experiment"), ("config", "arm"), ("traces", "traces"), ("total_steps", "steps"),
           ("latency_p50_ms", "p50 ms"), ("latency_p95_ms", "p95 ms"), ("latency_p99_ms", "p99 ms"),
           ("mem_high_events_total", "high ev"), ("mem_max_events_total", "max ev"), ("oom_kills", "OOM kills"),
           ("throttles_total", "throttled"), ("freezes_total", "frozen"), ("policy_kills_total", "policy kills"),
           ("pids_max_events_total", "forks refused"), ("timeouts", "timeouts")]


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def format_summary(summaries: list[dict]) -> str:
    rows = [[_cell(s.get(k)) for k, _ in COLUMNS] for s in summaries]
    heads = [h for _, h in COLUMNS]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    fmt = lambda cells: "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([fmt(heads), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)])
