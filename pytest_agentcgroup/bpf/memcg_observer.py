"""The memcg observer (bpf/memcg_observer.bpf.c): per-cgroup reclaim, OOM, page-fault and
run-queue-latency counts, and reclaim/OOM events with kernel timestamps.

    with MemcgObserver() as obs:
        obs.watch(step_cg.id)
        ... run the step ...
        obs.poll()                  # ring-buffer events -> obs.events
        obs.stats(step_cg.id)       # ObserverStats(reclaim_begin=..., oom_victims=..., ...)

Timestamps are bpf_ktime_get_ns(), i.e. CLOCK_MONOTONIC: comparable with time.monotonic_ns().
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field, fields

from . import features
from .loader import BPFUnavailable, RingBufferProgram

EVENT_KINDS = {1: "reclaim_begin", 2: "reclaim_end", 3: "oom_victim"}

TRACEPOINTS = [
    ("vmscan:mm_vmscan_memcg_reclaim_begin", "agcg_obs_rcl_beg"),
    ("vmscan:mm_vmscan_memcg_reclaim_end", "agcg_obs_rcl_end"),
    ("oom:mark_victim", "agcg_obs_oom"),
]
PGFAULT_TP = ("raw:page_fault_user", "agcg_obs_pgfault")     # exceptions:page_fault_user, raw
RUNQ_TPS = [("sched:sched_wakeup", "agcg_obs_wakeup"), ("sched:sched_wakeup_new", "agcg_obs_wakeup"),
            ("sched:sched_switch", "agcg_obs_switch")]


class _Event(ctypes.Structure):
    _fields_ = [("ts_ns", ctypes.c_uint64), ("cgroup_id", ctypes.c_uint64), ("kind", ctypes.c_uint32),
                ("pid", ctypes.c_uint32), ("value", ctypes.c_uint64)]


@dataclass(frozen=True)
class ObserverEvent:
    kind: str            # reclaim_begin | reclaim_end | oom_victim
    ts_ns: int           # kernel CLOCK_MONOTONIC
    cgroup_id: int
    pid: int             # the task that reclaimed; for oom_victim the victim
    value: int           # reclaim_begin: order; reclaim_end: ns in reclaim; oom_victim: anon rss kB


@dataclass
class ObserverStats:
    reclaim_begin: int = 0
    reclaim_end: int = 0
    reclaim_ns_total: int = 0
    reclaim_ns_max: int = 0
    reclaimed_pages: int = 0
    oom_victims: int = 0
    page_faults: int = 0
    first_reclaim_ns: int = 0
    last_reclaim_ns: int = 0
    runq_hist_us: dict = field(default_factory=dict)   # log2 bucket lower bound (us) -> count

    def runq_percentile_us(self, q: float) -> float | None:
        """Upper bound (us) of the log2 bucket holding quantile q (0..1) of run-queue latency."""
        total = sum(self.runq_hist_us.values())
        if not total:
            return None
        acc = 0
        for low in sorted(self.runq_hist_us):
            acc += self.runq_hist_us[low]
            if acc >= q * total:
                return float(max(1, low * 2))
        return None


class MemcgObserver(RingBufferProgram):
    program, ring, cgroups, event_struct = "memcg_observer", "agcg_obs_events", "agcg_obs_cgs", _Event
    events: list[ObserverEvent]

    def __init__(self, *, page_faults: bool = False, runq: bool = True):
        # page-fault counting is opt-in: a program on every user fault costs far more than the rest
        # on a fault-heavy workload (tests/test_bpf_overhead.py measures both)
        self.page_faults, self.runq = page_faults, runq
        if page_faults and (why := features.missing("tp:exceptions/page_fault_user")):
            raise BPFUnavailable(f"page-fault counting needs the exceptions:page_fault_user tracepoint, "
                                 f"which only x86 kernels have ({why})")
        tps = TRACEPOINTS + ([PGFAULT_TP] if page_faults else []) + (RUNQ_TPS if runq else [])
        super().__init__(tracepoints=tps, cflags=["-DAGCG_PGFAULT"] if page_faults else [])

    def _record(self, e) -> ObserverEvent:
        return ObserverEvent(EVENT_KINDS.get(e.kind, str(e.kind)), e.ts_ns, e.cgroup_id, e.pid, e.value)

    def watch(self, *cgroup_ids: int) -> None:
        for cg in cgroup_ids:
            self._mark(cg, ctypes.c_uint32(1))
            faults = self.prog["agcg_obs_pgf"] if self.page_faults else None
            if faults is not None and faults.get(ctypes.c_uint64(cg)) is None:
                faults[ctypes.c_uint64(cg)] = faults.Leaf()      # zero on every CPU

    def unwatch(self, *cgroup_ids: int) -> None:
        for cg in cgroup_ids:
            self._unmark(cg, "agcg_obs_stats", *(["agcg_obs_pgf"] if self.page_faults else []))

    def stats(self, cgroup_id: int) -> ObserverStats:
        st = ObserverStats()
        raw = self.prog["agcg_obs_stats"].get(ctypes.c_uint64(cgroup_id))
        if raw is not None:
            for f in fields(ObserverStats):
                if f.name not in ("runq_hist_us", "page_faults"):     # page faults: a map of their own
                    setattr(st, f.name, int(getattr(raw, f.name)))
        if self.page_faults:
            per_cpu = self.prog["agcg_obs_pgf"].get(ctypes.c_uint64(cgroup_id))
            st.page_faults = sum(per_cpu) if per_cpu is not None else 0
        if self.runq:
            for k, v in self.prog["agcg_obs_runq"].items():
                if k.cgroup_id == cgroup_id:
                    low = 0 if k.slot == 0 else 1 << (k.slot - 1)
                    st.runq_hist_us[low] = st.runq_hist_us.get(low, 0) + int(v.value)
        return st
