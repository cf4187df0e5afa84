"""The timescale study (`kind = "timescale"`, the shipped exp2) — how fast do controllers react to
the same memory burst. The pure part: the settings of its `[experiments.<name>]`, checked at load,
the controllers its `arms` name, and what each result row measures (the metrics its claims read).
The bursts themselves: procedures/timescale/.

    [experiments.exp2]
    kind = "timescale"
    arms = ["poll_10ms", "poll_50ms", "poll_100ms", "psi", "ebpf_ringbuf", "ebpf_kernel"]   # the controllers
    claims = ["ebpf_kernel.ran_on_lower_pct <= 1", "poll_50ms.p50_ms >= 10 * ebpf_kernel.p50_ms"]
    [experiments.exp2.burst]       # count, limit_mb, cushion_mb, burst_mb, react/stop timeouts, PSI
                                   # trigger, confidence of the per-burst bound
    [experiments.exp2.probe]       # period_us of the co-located sleeper

A controller (its arm) is `poll_<N>ms` (user space polls the limit counter every N ms), `psi` (a PSI
trigger), `ebpf_ringbuf` (eBPF event, user space stops the worker), `ebpf_kernel` (eBPF stops it) or
`ebpf_delayed_<N>us` (eBPF event, user space stops the worker N us after the reclaim began: a
controller slowed on purpose, to show that the gate fails a slow one).

What the in-kernel policy controls, and so what the gate asserts: it sends SIGSTOP in the reclaim
that began the pressure; the kernel acts on the signal when the worker next returns to user space,
i.e. once that reclaim (and the charge it serves) is over. How long the kernel's reclaim takes is the
kernel's, not the policy's (1-2 ms at times on a quiet host; more when the worker waits for a CPU).
So the per-burst outcome a claim reads is whether the worker *ran on*: touched more of its burst
after the reclaim began, before it stopped (or was never stopped). `ran_on_lower_pct` is the lower
bound of the share of bursts that ran on, one-sided at `confidence` (Clopper-Pearson): a claim
`ran_on_lower_pct <= 1` is refuted only when the run shows, at that confidence, that more than 1 % of
bursts ran on. A controller that meets "held in >= 99 % of bursts" is therefore refuted in at most
1 - confidence of runs (0.1 % at the default 0.999), whatever the host's load; a controller a few
hundred microseconds slower than the reclaim lets nearly every burst run on and is refuted.
The full onset -> stop percentiles are still measured and printed (p50_ms ... max_ms).

May import: metrics.metric (Metric), studies.tables.
"""
from __future__ import annotations

import math
import re

from ..metrics.metric import Metric
from .tables import TableError, number, table

TABLES = ("burst", "probe")
KEYS = ()                    # besides description, arms, claims, TABLES: its settings are in its tables
KERNEL_CONTROLLERS = ("psi", "ebpf_ringbuf", "ebpf_kernel")
_POLL = re.compile(r"^poll_([1-9][0-9]*)ms$")
_DELAYED = re.compile(r"^ebpf_delayed_([1-9][0-9]*)us$")
CONFIDENCE = 0.999           # [experiments.exp2.burst] confidence, when not set

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
    Metric("ran_on", "count", "lower", "recorded",
           "bursts whose worker touched more of the burst after its first memcg reclaim began, before it stopped, "
           "or was never stopped (progress read in the kernel at onset and at the stop)"),
    Metric("bursts", "count", "none", "recorded", "bursts with an onset, stopped or missed (the share's denominator)"),
    Metric("ran_on_pct", "%", "lower", "derived", "ran_on / bursts"),
    Metric("ran_on_lower_pct", "%", "lower", "derived",
           "lower confidence bound of the share of bursts that ran on (one-sided Clopper-Pearson at the burst "
           "table's confidence): above 1 only when the run shows more than 1 % of bursts ran on"),
    Metric("after_reclaim_p99_ms", "ms", "lower", "derived",
           "informational, not asserted: p99 of stop - end of the first memcg reclaim (kernel clock)"),
)}
#: metric -> the test that measures it (every claim is checked in its one test, the bursts)
CLAIM_METRICS = {name: "timescale" for name in COLUMNS}


def poll_period_ms(controller: str) -> int | None:
    """N of `poll_<N>ms`; None for the other controllers."""
    m = _POLL.match(controller)
    return int(m.group(1)) if m else None


def delay_us(controller: str) -> int | None:
    """N of `ebpf_delayed_<N>us`; None for the other controllers."""
    m = _DELAYED.match(controller)
    return int(m.group(1)) if m else None


def check_arms(names, where: str) -> None:
    """A timescale study's arms are its controllers, not arms of `[arms]`."""
    for name in names:
        if name not in KERNEL_CONTROLLERS and poll_period_ms(name) is None and delay_us(name) is None:
            raise TableError(f"{where}: {name!r} is not a controller of a timescale study: expected poll_<N>ms, "
                             f"{', '.join(KERNEL_CONTROLLERS)}, ebpf_delayed_<N>us")


def _binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return 1.0 - sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k))


def lower_bound(k: int, n: int, confidence: float) -> float:
    """One-sided Clopper-Pearson lower confidence bound of a proportion seen k times in n: the p at
    which seeing k or more has probability 1 - confidence (0 when k is 0)."""
    if n <= 0 or k <= 0:
        return 0.0
    alpha, lo, hi = 1.0 - confidence, 0.0, k / n
    for _ in range(60):                       # bisection: the tail grows with p
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _binomial_tail(k, n, mid) < alpha else (lo, mid)
    return lo


def validate(tables: dict, where: str, arms: dict) -> dict:
    """The burst and probe tables of a timescale study, checked; TableError names the key."""
    for name in TABLES:
        if name not in tables:
            raise TableError(f"{where}: missing table [{where}.{name}]")
    b = table(tables["burst"], f"{where}.burst", {*_BURST_INT, *_BURST_SECONDS}, {"psi_lanes", "confidence"})
    for key in _BURST_INT:
        number(b[key], f"{where}.burst.{key}", integer=True)
    for key in _BURST_SECONDS:
        number(b[key], f"{where}.burst.{key}")
    b.setdefault("psi_lanes", 1)
    number(b["psi_lanes"], f"{where}.burst.psi_lanes", integer=True)
    b.setdefault("confidence", CONFIDENCE)
    number(b["confidence"], f"{where}.burst.confidence")
    if not 0.5 <= b["confidence"] < 1:
        raise TableError(f"{where}.burst.confidence: {b['confidence']} is not a confidence: expected 0.5 <= it < 1")
    if b["cushion_mb"] + b["burst_mb"] <= b["limit_mb"]:
        raise TableError(f"{where}.burst: cushion_mb + burst_mb ({b['cushion_mb'] + b['burst_mb']}) must exceed "
                         f"limit_mb ({b['limit_mb']}), or no burst reaches memcg reclaim")
    p = table(tables["probe"], f"{where}.probe", {"period_us"}, set())
    number(p["period_us"], f"{where}.probe.period_us", integer=True)
    return {"burst": b, "probe": p}
