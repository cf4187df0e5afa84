"""The registry of per-test metrics: every number one test (trace × arm × seed × params) is compared
by — in the regression gate (gate.py) and in `agentcgroup compare` (reports/comparison.py), both
through the comparison core (compare.py).

Each entry is a Metric (metric.py): its unit, which direction is better (`lower`, `higher`, or
`none`: any change is only a change, compared with `exact`), where the number comes from
(`recorded` by the kernel or the wall clock in this run, `derived` from recorded numbers,
`synthetic`, or `measured` by a benchmark), one line of what it is, and its default tolerance
(docs/gate.md, "Tolerances"). One default per metric serves both commands: the same noise gets the
same allowance.

`regression` marks the metrics a regression check (the gate, `compare --only-worse`) checks when no
rules are given: outcomes that a baseline saved on another day must still match — kills, timeouts,
steps above the soft limit, what ran — and the p95 latency, loosely, to catch a hang. A
reproducibility check (`compare` without `--only-worse`) checks every metric with a default.

Adding a metric is one entry here (and the number in records.summarize or compare.test_values).
"""
from __future__ import annotations

from dataclasses import replace

from .metric import Metric
from .records import SUMMARY_METRICS


def _summary(name: str, tolerance: str | None, regression: bool = False) -> Metric:
    """A number of a test's summary (records.summarize): unit, direction, provenance and source as
    records.py declares them, so that they are said once, with the test's tolerance."""
    return replace(SUMMARY_METRICS[name], tolerance=tolerance, regression=regression)


# Defaults are for two runs of the same study on one (possibly shared, small) machine. Counts of
# what the kernel did are exact for the emulator's deterministic profiles — except limit hits (v1
# memory.failcnt, v2 `max` events) and v2 `high` events, which count reclaim attempts and so vary
# with timing from one run to the next. Latency and CPU time follow machine load: the p95 may
# double plus 500 ms — the gate catches a hang or a slow path, not a few percent. What a policy arm's
# controller did (throttles, freezes) and forks refused at pids.max follow timing like limit hits;
# a controller kill is an outcome, exact like an OOM kill.
# The order is the order of the default rules and of `compare`'s rows.
REGISTRY: dict[str, Metric] = {m.name: m for m in (
    _summary("oom_kills", "+0", regression=True),
    _summary("timeouts", "+0", regression=True),
    _summary("policy_kills_total", "+0"),
    # soft-limit breaches: v1 counts upward crossings (a few), v2 every reclaim above memory.high
    # (hundreds, timing-dependent); the steps that breached are the same on both
    _summary("mem_high_steps", "+1", regression=True),
    _summary("mem_high_events_total", "+200%+50"),
    _summary("mem_max_events_total", "+200%+50"),
    _summary("pids_max_events_total", "+200%+50"),
    _summary("throttles_total", "+100%+5"),
    _summary("freezes_total", "+100%+2"),
    # time waiting for memory follows reclaim and load: compared only when a rule names it
    _summary("mem_stall_s_total", None),
    _summary("mem_stall_ms_max", None),
    _summary("latency_p50_ms", "+100%+100"),
    _summary("latency_p95_ms", "+100%+500", regression=True),
    _summary("latency_p99_ms", None),
    Metric("latency_total_ms", "ms", "lower", "derived", "sum of latency_ms over the test's steps", None),
    Metric("cpu_total_ms", "ms", "lower", "derived", "sum of cpu_ms over the test's steps", "+100%+500"),
    Metric("peak_rss_mb", "MiB", "lower", "derived", "largest max_rss_mb of the test's steps", "+10%+8"),
    _summary("total_steps", "exact"),
    # what ran is exact: a step that stops (or starts) executing changes what the run measured
    _summary("executed_steps", "exact", regression=True),
    _summary("unstarted_steps", "+0", regression=True),
    Metric("failed_steps", "count", "lower", "derived",
           "executed steps with a non-zero exit code or a signal", "+0"),
    # what the arm's limits reserved and the steps used (metrics/reservation.py): compared only when a
    # rule names them — reserved follows the arm's limits exactly, used follows sampling and load; the
    # oracle (each step's own peak × its time) follows the trace, and reserved_vs_oracle the arm
    *(_summary(m, None) for m in ("step_time_s", "reserved_gib_s", "ceiling_reserved_gib_s",
                                  "soft_reserved_gib_s", "used_gib_s", "utilization", "idle_reserved_gib_s",
                                  "oracle_gib_s", "reserved_vs_oracle")),
)}
