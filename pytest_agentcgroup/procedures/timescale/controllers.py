"""The controllers a timescale study compares, each as `arm(cg, pid) -> wait`, where `wait()`
returns when the controller acted (the monotonic ns it sent SIGSTOP, or the in-kernel stop's) or
None when it did not act in time. The arm names (studies/timescale.py) map to them in controller_of.

    poll_<N>ms          user space reads memory.failcnt (v1) / memory.events `max` (v2) every N ms
    psi                 a PSI trigger on the burst cgroup's memory.pressure
    ebpf_ringbuf        the eBPF program posts a ring-buffer event; user space sends SIGSTOP
    ebpf_kernel         the eBPF program sends SIGSTOP itself (bpf_send_signal)
    ebpf_delayed_<N>us  as ebpf_ringbuf, SIGSTOP sent N us after the reclaim began: slowed on purpose

May import: studies.timescale (the arm names).
"""
from __future__ import annotations

import os
import random
import select
import signal
import threading
import time

from ...studies.timescale import delay_us, poll_period_ms


def max_events_file(cg):
    if cg.host.mode == "v2":
        return cg.unified / "memory.events", lambda text: int(next(
            (l.split()[1] for l in text.splitlines() if l.startswith("max ")), 0))
    return cg.paths["memory"] / "memory.failcnt", int


def stop_now(pid):
    os.kill(pid, signal.SIGSTOP)
    return time.monotonic_ns()


def react_poll(period_s, timeout_s):
    """Returns (arm, wait): arm(cg, pid) starts a poller thread; wait() -> actuation ns or None."""
    def arm(cg, pid):
        path, parse = max_events_file(cg)
        result = {}
        stop = threading.Event()
        fd = os.open(path, os.O_RDONLY)
        def loop():
            time.sleep(random.uniform(0, period_s))        # random phase w.r.t. the burst
            deadline = time.monotonic() + timeout_s
            while not stop.is_set() and time.monotonic() < deadline:
                if parse(os.pread(fd, 4096, 0).decode()) > 0:
                    result["t"] = stop_now(pid)
                    return
                time.sleep(period_s)
        th = threading.Thread(target=loop, daemon=True)
        th.start()
        def wait():
            th.join(timeout_s + period_s + 1)
            stop.set()
            os.close(fd)
            return result.get("t")
        return wait
    return arm


def react_psi(window_us, threshold_us, timeout_s):
    def arm(cg, pid):
        fd = os.open(cg.unified / "memory.pressure", os.O_RDWR | os.O_NONBLOCK)
        os.write(fd, f"some {threshold_us} {window_us}\0".encode())
        poller = select.poll()
        poller.register(fd, select.POLLPRI)
        def wait():
            try:
                if poller.poll(timeout_s * 1000):
                    return stop_now(pid)
                return None
            finally:
                os.close(fd)
        return wait
    return arm


def react_ringbuf(thr, timeout_s):
    def arm(cg, pid):
        thr.mark(cg.id, "notify")
        def wait():
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for ev in thr.poll(50):
                    if ev.cgroup_id == cg.id:
                        return stop_now(ev.pid)
            return None
        return wait
    return arm


def react_delayed(thr, delay_ns, timeout_s):
    """The ring-buffer controller slowed on purpose: SIGSTOP `delay_ns` after the reclaim began."""
    def arm(cg, pid):
        thr.mark(cg.id, "notify")
        def wait():
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for ev in thr.poll(50):
                    if ev.cgroup_id == cg.id:
                        time.sleep(max(0, ev.trigger_ns + delay_ns - time.monotonic_ns()) / 1e9)
                        return stop_now(ev.pid)
            return None
        return wait
    return arm


def react_kernel(thr, timeout_s):
    def arm(cg, pid):
        thr.mark(cg.id, "stop")
        def wait():
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for ev in thr.poll(50):
                    if ev.cgroup_id == cg.id:
                        return ev.action_ns
            return None
        return wait
    return arm


def controller_of(name: str, thr, burst: dict):
    """The arm of the controller `name` (an arm of the study), with the burst table's timeouts and
    PSI trigger; `thr` the reclaim throttle the eBPF controllers act through."""
    if poll_period_ms(name):
        return react_poll(poll_period_ms(name) / 1000, burst["react_timeout_s"])
    if delay_us(name):
        return react_delayed(thr, delay_us(name) * 1000, burst["react_timeout_s"])
    return {"psi": lambda: react_psi(burst["psi_window_us"], burst["psi_threshold_us"], burst["psi_timeout_s"]),
            "ebpf_ringbuf": lambda: react_ringbuf(thr, burst["react_timeout_s"]),
            "ebpf_kernel": lambda: react_kernel(thr, burst["react_timeout_s"])}[name]()
