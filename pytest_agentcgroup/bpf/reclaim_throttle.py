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

from .loader import RingBufferProgram

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


def _mode_name(value: int) -> str:
    return next((k for k, v in MODES.items() if v == value), str(value))


class ReclaimThrottle(RingBufferProgram):
    program, ring, cgroups, event_struct = "reclaim_throttle", "agcg_thr_events", "agcg_thr_cgs", _Event
    events: list[ThrottleEvent]

    def __init__(self, *, track_stop: bool = True):
        super().__init__(tracepoints=[("vmscan:mm_vmscan_memcg_reclaim_begin", "agcg_thr_reclaim")]
                         + ([("sched:sched_switch", "agcg_thr_switch")] if track_stop else []))

    def _record(self, e) -> ThrottleEvent:
        return ThrottleEvent(e.cgroup_id, e.trigger_ns, e.action_ns, e.pid, e.tid, _mode_name(e.mode), e.signal_ret)

    def mark(self, cgroup_id: int, mode: str = "stop") -> None:
        val = self.prog[self.cgroups].Leaf()
        val.mode, val.armed = MODES[mode], 1
        self._mark(cgroup_id, val)

    def rearm(self, cgroup_id: int) -> None:
        val = self.prog[self.cgroups][ctypes.c_uint64(cgroup_id)]    # KeyError when it is not marked
        val.armed = 1
        self._mark(cgroup_id, val)

    def unmark(self, cgroup_id: int) -> None:
        self._unmark(cgroup_id)

    def state(self, cgroup_id: int) -> ThrottleState | None:
        v = self._marked(cgroup_id)
        if v is None:
            return None
        return ThrottleState(_mode_name(v.mode), bool(v.armed), v.trigger_ns, v.action_ns, v.stopped_ns, v.pid,
                             v.triggers, v.reclaims, v.signal_ret)
