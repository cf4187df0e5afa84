"""The bursts of a timescale study: the worker processes (burst_worker.py) and `run_bursts`, which
runs one controller's bursts, each in a fresh cgroup with a hard limit, measured by the task-stop
observer (bpf/task_stop.bpf.c) to the same two kernel-clock endpoints:

    onset  the first memcg reclaim the burst worker entered
    stop   the worker's first switch-out in a stopped state (sched_switch): the SIGSTOP took effect

reaction = stop - onset; overshoot = burst bytes the worker touched in between. Per burst, "ran on" =
the worker touched more of its burst after onset before it stopped (or never stopped).

May import: studies.timescale (the gate's bound), the cgroups its callers hand it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ...studies.timescale import lower_bound

MIB = 1 << 20
WORKER = Path(__file__).with_name("burst_worker.py")        # a program of its own, started by its path


def child_setup(cg):
    """preexec_fn: join cg, and die with the test process (PR_SET_PDEATHSIG), even on SIGKILL."""
    import ctypes
    files = cg.join_files()
    libc = ctypes.CDLL(None)
    def setup():
        libc.prctl(1, signal.SIGKILL)            # PR_SET_PDEATHSIG
        for f in files:
            Path(f).write_text("0")
    return setup


def pct(values, q):
    vals = sorted(values)
    if not vals:
        return float("nan")
    k = min(len(vals) - 1, max(0, int(round(q / 100 * (len(vals) - 1)))))
    return vals[k]


class Worker:
    def __init__(self, park):
        self.proc = subprocess.Popen([sys.executable, str(WORKER)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1,
                                     preexec_fn=child_setup(park))
        self.pid = self.proc.pid

    def ask(self, line, expect):
        """Send a command; the reply must start with `expect`; returns what follows it."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        got = self.proc.stdout.readline().strip()
        assert got.split(" ", 1)[0] == expect, f"worker said {got!r} to {line!r} (exit {self.proc.poll()})"
        return got[len(expect):].strip()

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self):
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


def run_bursts(name, arm, *, obs, thr, workload, park, workers, cfg, count):
    """`count` bursts under one controller, each measured by the task-stop observer `obs`. With
    several workers, the bursts run in that many parallel lanes, each burst in its own cgroup with
    its own controller instance (used for PSI, whose reaction is bounded by each cgroup's own 2 s
    averaging tick, not by the CPU)."""
    b = cfg["burst"]
    burst_bytes = b["burst_mb"] << 20
    lock = threading.Lock()                  # the BPF maps and the shared lists
    reactions, overshoots, sent, misses, no_onset, early, late, errors = [], [], [], [], [], [], [], []
    ran_on, after_reclaim = [], []           # bursts that touched more after onset; stop - end of first reclaim
    where = []                               # where each reaction's time went (diagnostics)

    def burst(i, worker):
        cg = workload.child(f"{name}-{i}", ("memory",))
        try:
            cg.set_memory_max(b["limit_mb"] << 20)
            progress_addr = int(worker.ask(f"prep {','.join(cg.join_files())} {b['cushion_mb']} {b['burst_mb']}",
                                           "ready"))
            with lock:
                obs.watch(worker.pid, progress_addr)
            wait = arm(cg, worker.pid)
            worker.send("go")
            acted = wait()
            # wait for the SIGSTOP to take effect before SIGCONT, which would otherwise overtake it
            seen = obs.wait_stop(worker.pid, b["stop_timeout_s"]) if acted is not None else obs.seen(worker.pid)
            os.kill(worker.pid, signal.SIGCONT)
            got = worker.proc.stdout.readline().strip()
            assert got == "done", f"burst {name}-{i}: worker said {got!r} (exit {worker.proc.poll()})"
            assert seen is not None and not seen.read_err, \
                f"burst {name}-{i}: task_stop.bpf.c could not read the worker's progress counter: {seen}"
            with lock:
                after = obs.seen(worker.pid)             # the whole burst, resumed or not
                if not after.onset_ns:
                    no_onset.append((i, cg.counters()))
                elif seen.stop_ns and not seen.onset_ns:
                    early.append(i)                       # stopped before the first reclaim began
                elif acted is None or seen.reaction_ns is None:
                    misses.append(i)
                    ran_on.append(i)                      # never stopped: it ran on to the end
                else:
                    reactions.append(seen.reaction_ns / 1e6)
                    overshoots.append(seen.overshoot_bytes / MIB)
                    if seen.overshoot_bytes > 0:
                        ran_on.append(i)
                    if seen.onset_end_ns:
                        after_reclaim.append((seen.stop_ns - seen.onset_end_ns) / 1e6)
                    if seen.stop_progress >= burst_bytes:
                        late.append(i)
                    sent.append((acted - seen.onset_ns) / 1e6)
                    where.append({"reaction_ms": seen.reaction_ns / 1e6,
                                  "first_reclaim_ms": (seen.onset_end_ns - seen.onset_ns) / 1e6 if seen.onset_end_ns else None,
                                  "runnable_ms": seen.runnable_ns / 1e6, "blocked_ms": seen.blocked_ns / 1e6,
                                  "reclaims": seen.reclaims})
            worker.ask(f"free {','.join(park.join_files())}", "freed")
        finally:
            with lock:
                obs.unwatch(worker.pid)
                thr.unmark(cg.id)
            cg.remove()

    def lane(k, worker):
        try:
            for i in range(k, count, len(workers)):
                burst(i, worker)
        except BaseException as exc:        # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    t_start = time.monotonic_ns()
    if len(workers) == 1:
        lane(0, workers[0])
    else:
        threads = [threading.Thread(target=lane, args=(k, w), daemon=True) for k, w in enumerate(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    where.sort(key=lambda w: w["reaction_ms"])
    bursts = len(reactions) + len(misses)
    return {"controller": name, "n": len(reactions), "misses": len(misses), "no_onset": len(no_onset),
            "ran_on": len(ran_on), "bursts": bursts,
            "ran_on_pct": 100 * len(ran_on) / bursts if bursts else float("nan"),
            "ran_on_lower_pct": 100 * lower_bound(len(ran_on), bursts, b["confidence"]) if bursts else float("nan"),
            "after_reclaim_p99_ms": pct(after_reclaim, 99),
            "no_onset_counters": [f"burst {i}: {c}" for i, c in no_onset],
            "early": len(early), "late": len(late), "lanes": len(workers),
            "p50_ms": pct(reactions, 50), "p95_ms": pct(reactions, 95), "p99_ms": pct(reactions, 99),
            "max_ms": max(reactions, default=float("nan")),
            "overshoot_p50_mib": pct(overshoots, 50), "overshoot_p99_mib": pct(overshoots, 99),
            "sent_p99_ms": pct(sent, 99),
            "runnable_p99_ms": pct([w["runnable_ms"] for w in where], 99),
            "first_reclaim_p99_ms": pct([w["first_reclaim_ms"] for w in where if w["first_reclaim_ms"] is not None], 99),
            "no_cpu_wait_p99_ms": pct([w["reaction_ms"] - w["runnable_ms"] for w in where], 99),
            "slowest": where[-3:],
            "window": (t_start, time.monotonic_ns())}
