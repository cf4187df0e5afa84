"""The in-kernel reclaim throttle (bpf/reclaim_throttle.bpf.c).

    with ReclaimThrottle() as thr:
        thr.mark(cg.id, mode="stop")      # low priority: SIGSTOP the allocating process on reclaim
        ... pressure ...
        for ev in thr.poll(100): ev.trigger_ns, ev.action_ns, ev.pid
        thr.rearm(cg.id)                  # after user space resumed it

Modes: "record" (stamp the trigger only), "notify" (stamp + ring-buffer event, user space acts),
"stop" (stamp + bpf_send_signal(SIGSTOP) + event). A mark is armed for one reaction; `rearm`
arms it again. Timestamps are kernel CLOCK_MONOTONIC ns (== time.monotonic_ns()).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from .loader import Loaded, ProgramSide

MODES = {"record": 0, "notify": 1, "stop": 2}


class _Event(ctypes.Structure):
    _fields_ = [("cgroup_id", ctypes.c_uint64), ("trigger_ns", ctypes.c_uint64),
                ("action_ns", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("tid", ctypes.c_uint32),
                ("mode", ctypes.c_uint32), ("signal_ret", ctypes.c_int32)]


@dataclass(frozen=True)
class ThrottleEvent:
    cgroup_id: int
    trigger_ns: int        # reclaim began (tracepoint entry)
    action_ns: int         # SIGSTOP queued by bpf_send_signal (0 in notify mode)
    pid: int
    tid: int
    mode: str
    signal_ret: int        # bpf_send_signal's return (0 = sent)

    @property
    def reaction_ns(self) -> int | None:
        return self.action_ns - self.trigger_ns if self.action_ns else None


@dataclass(frozen=True)
class ThrottleState:
    mode: str
    armed: bool
    trigger_ns: int
    action_ns: int
    stopped_ns: int        # the signalled task left the CPU in stopped state (sched_switch)
    pid: int
    triggers: int
    reclaims: int
    signal_ret: int


class ReclaimThrottle(ProgramSide):
    def __init__(self, *, track_stop: bool = True):
        self.prog = Loaded("reclaim_throttle")
        self.events: list[ThrottleEvent] = []
        try:
            self.prog.attach_tracepoint("vmscan:mm_vmscan_memcg_reclaim_begin", "agcg_thr_reclaim")
            if track_stop:
                self.prog.attach_tracepoint("sched:sched_switch", "agcg_thr_switch")
            self.prog.open_ring_buffer("agcg_thr_events", self._on_event)
        except BaseException:
            self.prog.close()
            raise

    def _on_event(self, ctx, data, size):
        e = ctypes.cast(data, ctypes.POINTER(_Event)).contents
        mode = next((k for k, v in MODES.items() if v == e.mode), str(e.mode))
        self.events.append(ThrottleEvent(e.cgroup_id, e.trigger_ns, e.action_ns, e.pid, e.tid, mode,
                                         e.signal_ret))

    def mark(self, cgroup_id: int, mode: str = "stop") -> None:
        table = self.prog["agcg_thr_cgs"]
        val = table.Leaf()
        val.mode, val.armed = MODES[mode], 1
        table[ctypes.c_uint64(cgroup_id)] = val

    def rearm(self, cgroup_id: int) -> None:
        table = self.prog["agcg_thr_cgs"]
        val = table[ctypes.c_uint64(cgroup_id)]
        val.armed = 1
        table[ctypes.c_uint64(cgroup_id)] = val

    def unmark(self, cgroup_id: int) -> None:
        try:
            del self.prog["agcg_thr_cgs"][ctypes.c_uint64(cgroup_id)]
        except KeyError:
            pass

    def state(self, cgroup_id: int) -> ThrottleState | None:
        v = self.prog["agcg_thr_cgs"].get(ctypes.c_uint64(cgroup_id))
        if v is None:
            return None
        mode = next((k for k, m in MODES.items() if m == v.mode), str(v.mode))
        return ThrottleState(mode, bool(v.armed), v.trigger_ns, v.action_ns, v.stopped_ns, v.pid,
                             v.triggers, v.reclaims, v.signal_ret)

    def poll(self, timeout_ms: int = 0) -> list[ThrottleEvent]:
        n = len(self.events)
        self.prog.poll(timeout_ms)
        return self.events[n:]
