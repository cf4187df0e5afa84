"""The task-stop observer (bpf/task_stop.bpf.c): when a watched task actually stopped,
measured from when its memory pressure began, both on the kernel clock.

    with TaskStopObserver() as obs:             # probes which prev_state bits mean "stopped"
        obs.watch(pid, progress_addr)           # before the burst
        ... pressure; some controller sends SIGSTOP ...
        seen = obs.wait_stop(pid, timeout_s=1)  # TaskStop(onset_ns, stop_ns, ...) or None
        seen.reaction_ns, seen.overshoot_bytes

Onset = the first memcg reclaim the task entered; stop = its first switch-out in a stopped state;
progress = a u64 the task publishes at `progress_addr`, read in the kernel at both endpoints.
Timestamps are bpf_ktime_get_ns(), i.e. CLOCK_MONOTONIC (== time.monotonic_ns()).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .loader import ProgramSide

# features (bpf/features.py) this observer needs; callers skip on `features.missing(*NEEDS)`
NEEDS = ("root", "bcc", "bpf_syscall", "tracefs", "tp:vmscan/mm_vmscan_memcg_reclaim_begin",
         "tp:vmscan/mm_vmscan_memcg_reclaim_end", "tp:sched/sched_switch")
TRACEPOINTS = [("vmscan:mm_vmscan_memcg_reclaim_begin", "agcg_stop_onset"),
               ("vmscan:mm_vmscan_memcg_reclaim_end", "agcg_stop_rcl_end"),
               ("sched:sched_switch", "agcg_stop_switch")]


@dataclass(frozen=True)
class TaskStop:
    """What the observer saw of one watched task (0 = not seen)."""
    onset_ns: int
    onset_progress: int
    stop_ns: int
    stop_progress: int
    stop_state: int
    read_err: int            # bpf_probe_read_user's last error, 0 when progress was read
    # where onset..stop went (diagnostics): end of the first reclaim, reclaims entered, time off
    # the CPU runnable (waiting for a CPU) and blocked (sleeping)
    onset_end_ns: int = 0
    reclaims: int = 0
    runnable_ns: int = 0
    blocked_ns: int = 0
    switches: int = 0        # switch-outs seen while watched (any state)

    @property
    def reaction_ns(self) -> int | None:
        """stop - onset, when both were seen and in that order."""
        if self.onset_ns and self.stop_ns >= self.onset_ns:
            return self.stop_ns - self.onset_ns
        return None

    @property
    def overshoot_bytes(self) -> int | None:
        """Progress the task made between onset and stop (what the delay cost)."""
        if self.reaction_ns is None or self.read_err:
            return None
        return self.stop_progress - self.onset_progress


def proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class TaskStopObserver(ProgramSide):
    program = "task_stop"

    def __init__(self):
        super().__init__(tracepoints=TRACEPOINTS)

    def _set_up(self) -> None:
        self.stopped_mask = self._probe_stopped_state()
        mask = self.prog["agcg_stop_mask"]
        mask[mask.Key(0)] = mask.Leaf(self.stopped_mask)

    def _probe_stopped_state(self) -> int:
        """The prev_state value sched_switch reports for a SIGSTOPped task on this kernel: a
        sleeping child is stopped, and the state of its last switch-out is read (a stopped task
        does not run again, so that switch-out was the stop)."""
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            self.watch(child.pid)
            time.sleep(0.05)
            os.kill(child.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 5
            while proc_state(child.pid) != "T" and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.05)                          # /proc shows T just before the switch-out
            v = self.prog["agcg_stop_tasks"].get(ctypes.c_uint32(child.pid))
            state = v.last_state if v is not None else 0
            if proc_state(child.pid) != "T" or not state or state & (state - 1):
                raise RuntimeError(
                    f"task_stop.bpf.c: cannot tell which sched_switch prev_state means stopped on this "
                    f"kernel: a SIGSTOPped child is in state {proc_state(child.pid)!r} and its last "
                    f"switch-out reported prev_state={state:#x} (want one bit)")
            return state
        finally:
            self.unwatch(child.pid)
            child.kill()
            child.wait()

    def watch(self, tid: int, progress_addr: int = 0) -> None:
        """Watch `tid` afresh (forgets what was seen of it)."""
        table = self.prog["agcg_stop_tasks"]
        v = table.Leaf()                              # ctypes zero-fills it
        v.progress_addr = progress_addr
        table[ctypes.c_uint32(tid)] = v

    def unwatch(self, tid: int) -> None:
        self._forget(ctypes.c_uint32(tid), "agcg_stop_tasks")

    def seen(self, tid: int) -> TaskStop | None:
        v = self.prog["agcg_stop_tasks"].get(ctypes.c_uint32(tid))
        if v is None:
            return None
        return TaskStop(v.onset_ns, v.onset_progress, v.stop_ns, v.stop_progress, v.stop_state, v.read_err,
                        v.onset_end_ns, v.reclaims, v.runnable_ns, v.blocked_ns, v.switches)

    def wait_stop(self, tid: int, timeout_s: float) -> TaskStop | None:
        """What was seen of `tid` once its stop was recorded, or after timeout_s without one."""
        deadline = time.monotonic() + timeout_s
        while True:
            s = self.seen(tid)
            if s is not None and s.stop_ns:
                # The program writes the stamp last, but on another CPU it may still be finishing
                # the record's other fields: read it again once it has surely returned.
                time.sleep(0.002)
                return self.seen(tid)
            if s is None or time.monotonic() >= deadline:
                return s
            time.sleep(0.0005)
