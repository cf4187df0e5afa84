"""Experiment 2 — timescale mismatch. The pure part: the settings of `[experiments.exp2]`, checked
at load, the controllers its `arms` name, and what each result row measures (the metrics its claims
read). The bursts themselves: experiments/test_exp2_timescale.py.

    [experiments.exp2]
    arms = ["poll_10ms", "poll_50ms", "poll_100ms", "psi", "ebpf_ringbuf", "ebpf_kernel"]   # the controllers
    claims = ["ebpf_kernel.p99_ms <= 1.0", "poll_50ms.p99_ms >= 10 * ebpf_kernel.p99_ms"]
    [experiments.exp2.burst]       # count, limit_mb, cushion_mb, burst_mb, react/stop timeouts, PSI trigger
    [experiments.exp2.probe]       # period_us of the co-located sleeper

A controller (its arm) is `poll_<N>ms` (user space polls the limit counter every N ms), `psi` (a PSI
trigger), `ebpf_ringbuf` (eBPF event, user space stops the worker) or `ebpf_kernel` (eBPF stops it).

May import: metrics.metric (Metric), studies.tables.
"""
from __future__ import annotations

import re

from ..metrics.metric import Metric
from .tables import TableError, number, table

TABLES = ("burst", "probe")
KEYS = ()                    # besides description, arms, claims, TABLES: its settings are in its tables
KERNEL_CONTROLLERS = ("psi", "ebpf_ringbuf", "ebpf_kernel")
_POLL = re.compile(r"^poll_([1-9][0-9]*)ms$")

_BURST_INT = ("count", "limit_mb", "cushion_mb", "burst_mb", "psi_window_us", "psi_threshold_us", "psi_count")
_BURST_SECONDS = ("react_timeout_s", "stop_timeout_s", "psi_timeout_s")

# what each number of a result row is (extra_info["exp2_columns"], and the metrics a claim reads);
# reactions are kernel-clock differences (task stopped - first reclaim), overshoots differences of
# the worker's own counter read in the kernel at those two moments, so every percentile is derived
COLUMNS = {m.name: {k: v for k, v in m.describe(None).items() if k != "value"} for m in (
    Metric("n", "count", "higher", "recorded", "bursts in which the controller stopped the worker"),
    Metric("misses", "count", "lower", "recorded",
           "bursts the worker was not stopped in (the controller did not act in time, or its signal never took effect)"),
    Metric("no_onset", "count", "lower", "recorded", "bursts that never reached memcg reclaim (measure nothing)"),
    Metric("early", "count", "none", "recorded",
           "bursts the worker stopped in before its first reclaim (a charge failed, the controller saw it, and "
           "the stop came before reclaim began); not in the percentiles"),
    Metric("late", "count", "lower", "recorded", "stops that came after the worker had finished the whole burst"),
    Metric("lanes", "count", "none", "synthetic",
           "bursts run concurrently (one cgroup each); from [experiments.exp2.burst] psi_lanes"),
    Metric("p50_ms", "ms", "lower", "derived",
           "median reaction: worker left the CPU stopped (sched_switch) - its first memcg reclaim, kernel clock"),
    Metric("p95_ms", "ms", "lower", "derived", "95th percentile of the reactions (to the stop)"),
    Metric("p99_ms", "ms", "lower", "derived", "99th percentile of the reactions (to the stop)"),
    Metric("max_ms", "ms", "lower", "derived", "slowest reaction (to the stop)"),
    Metric("overshoot_p50_mib", "MiB", "lower", "derived",
           "median of burst bytes the worker touched between its first reclaim and its stop"),
    Metric("overshoot_p99_mib", "MiB", "lower", "derived", "99th percentile of the overshoots"),
    Metric("sent_p99_ms", "ms", "lower", "derived",
           "informational, not asserted: p99 of signal sent (user space after kill(), in-kernel after "
           "bpf_send_signal) - first reclaim"),
    Metric("runnable_p99_ms", "ms", "lower", "derived",
           "diagnostic: p99 of the time the worker waited for a CPU (off the CPU, runnable) between onset and stop"),
    Metric("first_reclaim_p99_ms", "ms", "lower", "derived",
           "diagnostic: p99 duration of the worker's first memcg reclaim (a signal is acted on only after it)"),
    Metric("no_cpu_wait_p99_ms", "ms", "lower", "derived",
           "diagnostic, not asserted: p99 of (reaction - time the worker waited for a CPU), i.e. without the host's CPU contention"),
    Metric("probe_p99_ms", "ms", "lower", "derived", "p99 lateness of a co-located 1 ms sleeper during the bursts"),
)}
#: metric -> the test that measures it (every claim of exp2 is checked in its one test)
CLAIM_METRICS = {name: "test_exp2_reaction_time" for name in COLUMNS}


def poll_period_ms(controller: str) -> int | None:
    """N of `poll_<N>ms`; None for the other controllers."""
    m = _POLL.match(controller)
    return int(m.group(1)) if m else None


def check_arms(names, where: str) -> None:
    """exp2's arms are its controllers, not arms of `[arms]`."""
    for name in names:
        if name not in KERNEL_CONTROLLERS and poll_period_ms(name) is None:
            raise TableError(f"{where}: {name!r} is not a controller of exp2: expected poll_<N>ms, "
                             f"{', '.join(KERNEL_CONTROLLERS)}")


def validate(tables: dict, where: str, arms: dict) -> dict:
    """The burst and probe tables of `[experiments.exp2]`, checked; TableError names the key."""
    for name in TABLES:
        if name not in tables:
            raise TableError(f"{where}: missing table [{where}.{name}]")
    b = table(tables["burst"], f"{where}.burst", {*_BURST_INT, *_BURST_SECONDS}, {"psi_lanes"})
    for key in _BURST_INT:
        number(b[key], f"{where}.burst.{key}", integer=True)
    for key in _BURST_SECONDS:
        number(b[key], f"{where}.burst.{key}")
    b.setdefault("psi_lanes", 1)
    number(b["psi_lanes"], f"{where}.burst.psi_lanes", integer=True)
    if b["cushion_mb"] + b["burst_mb"] <= b["limit_mb"]:
        raise TableError(f"{where}.burst: cushion_mb + burst_mb ({b['cushion_mb'] + b['burst_mb']}) must exceed "
                         f"limit_mb ({b['limit_mb']}), or no burst reaches memcg reclaim")
    p = table(tables["probe"], f"{where}.probe", {"period_us"}, set())
    number(p["period_us"], f"{where}.probe.period_us", integer=True)
    return {"burst": b, "probe": p}
