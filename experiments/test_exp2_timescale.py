"""Experiment 2 — timescale mismatch: how fast do controllers react to the same memory burst?

Controllers (the experiment's arms; settings and claims in `[experiments.exp2]` of the config file,
experiments/agentcgroup.toml, checked at load by studies/timescale.py; select some with
--agentcgroup-arms):
  poll_<N>ms    user space reads memory.failcnt (v1) / memory.events `max` (v2) every N ms
  psi           a PSI trigger on the burst cgroup's memory.pressure (window: what the host allows)
  ebpf_ringbuf  the eBPF program posts a ring-buffer event; user space sends SIGSTOP
  ebpf_kernel   the eBPF program sends SIGSTOP itself (bpf_send_signal)
  ebpf_delayed_<N>us  as ebpf_ringbuf, SIGSTOP sent N us after the reclaim began: slowed on purpose
Every controller is measured by one observer, bpf/task_stop.bpf.c, to the same endpoints,
both kernel clock (bpf_ktime_get_ns, CLOCK_MONOTONIC):
  onset  the first memcg reclaim the burst worker entered
  stop   the worker's first switch-out in a stopped state (sched_switch): the SIGSTOP took effect
reaction = stop - onset. The worker publishes how many bytes of the burst it has touched; the
observer reads that counter in the worker's own context at both endpoints, so
overshoot = touched at stop - touched at onset: the memory the controller's delay let through.
"sent" (when the signal was sent: user space after kill(), in-kernel after bpf_send_signal) is shown
for information only; it is not the task stopping and nothing is asserted on it.
A co-located probe process (sleep 1 ms, measure lateness) runs throughout; its p99 per controller
phase is reported too. Per burst, "ran on" = the worker touched more of its burst after onset before
it stopped (or never stopped). The claims (e.g. `ebpf_kernel.ran_on_lower_pct <= 1`: a lower confidence
bound of that share, see studies/timescale.py) read each controller's result
row (studies/timescale.py COLUMNS); every one is printed with its values and verdict, and a refuted
one fails the test.
"""
from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_agentcgroup.harness import experiment as harness_exp
from pytest_agentcgroup.studies import claims, kinds
from pytest_agentcgroup.studies.timescale import COLUMNS, delay_us, lower_bound, poll_period_ms

MIB = 1 << 20

WORKER = r"""
import ctypes, mmap, os, sys
MB = 1 << 20
# bytes of the burst touched so far; task_stop.bpf.c reads it (at its address) at onset and at the stop
counter = bytearray(8)
progress = memoryview(counter).cast("Q")
progress_addr = ctypes.addressof(ctypes.c_char.from_buffer(counter))
def join(files):
    for f in files.split(","):
        fd = os.open(f, os.O_WRONLY); os.write(fd, b"0"); os.close(fd)
def touch(m, n):
    for i in range(0, n, 4096):
        m[i] = 1
def touch_burst(m):
    for i in range(4096, len(m) + 1, 4096):
        m[i - 4096] = 1
        progress[0] = i
maps = []
out = sys.stdout
for line in sys.stdin:
    cmd, *a = line.split()
    if cmd == "prep":                      # prep <join files> <cushion_mb> <burst_mb>
        join(a[0]); c, b = int(a[1]) * MB, int(a[2]) * MB
        cushion = mmap.mmap(-1, c, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        touch(cushion, c); cushion.madvise(mmap.MADV_FREE)
        burst = mmap.mmap(-1, b, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        maps = [cushion, burst]
        progress[0] = 0
        out.write(f"ready {progress_addr}\n"); out.flush()
    elif cmd == "go":
        touch_burst(maps[1])
        out.write("done\n"); out.flush()
    elif cmd == "free":                    # free <park join files>
        for m in maps: m.close()
        maps = []; join(a[0])
        out.write("freed\n"); out.flush()
"""

PROBE = r"""
import sys, time, json, signal
period = int(sys.argv[1]) / 1e6
rec = []
stop = False
def bye(*_):
    global stop; stop = True
signal.signal(signal.SIGTERM, bye)
while not stop:
    t = time.monotonic_ns(); time.sleep(period); t2 = time.monotonic_ns()
    rec.append((t2, t2 - t - int(period * 1e9)))
json.dump(rec, open(sys.argv[2], "w"))
"""


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
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE,
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

def _cap_sys_resource() -> bool:
    eff = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("CapEff:"))
    return bool(int(eff.split()[1], 16) >> 24 & 1)          # CAP_SYS_RESOURCE = 24


@pytest.mark.experiment(name="exp2")
def test_exp2_reaction_time(request, benchmark, tmp_path, capsys):
    conf, exp = harness_exp.experiment(request.config, "exp2")
    controllers = harness_exp.arms(request, conf, exp)
    from pytest_agentcgroup.bpf import features
    from pytest_agentcgroup.bpf import controller, task_stop
    why = features.missing(*controller.NEEDS, *task_stop.NEEDS)     # the in-kernel arm's and the stop observer's
    if why:
        pytest.skip(why)
    from pytest_agentcgroup.bpf.task_stop import TaskStopObserver
    from pytest_agentcgroup.bpf.reclaim_throttle import ReclaimThrottle

    # the cgroup fixtures once the settings are known: a config without exp2 skips before anything is made
    workload_cgroup, agentcgroup_tree = (request.getfixturevalue(f) for f in ("workload_cgroup", "agentcgroup_tree"))
    cfg = exp.tables
    b = cfg["burst"]
    workload = workload_cgroup.child("bursts", agentcgroup_tree.controllers, inner=True)
    park = workload.child("park", ("memory",))
    probe_cg = workload_cgroup.child("probe", agentcgroup_tree.controllers)
    probe_out = tmp_path / "probe.json"
    results = []
    stopped_mask = []

    def measure():
        workers = [Worker(park) for _ in range(max(1, b.get("psi_lanes", 1)))]
        worker = workers[0]
        probe = subprocess.Popen([sys.executable, "-c", PROBE, str(cfg["probe"]["period_us"]), str(probe_out)],
                                 preexec_fn=child_setup(probe_cg))
        try:
            # the observer first: on the shared reclaim tracepoint it is attached before the throttle
            with TaskStopObserver() as obs, ReclaimThrottle(track_stop=False) as thr:
                stopped_mask.append(obs.stopped_mask)
                reactions = {"psi": lambda: react_psi(b["psi_window_us"], b["psi_threshold_us"], b["psi_timeout_s"]),
                             "ebpf_ringbuf": lambda: react_ringbuf(thr, b["react_timeout_s"]),
                             "ebpf_kernel": lambda: react_kernel(thr, b["react_timeout_s"])}
                def controller_of(name):
                    if poll_period_ms(name):
                        return react_poll(poll_period_ms(name) / 1000, b["react_timeout_s"])
                    if delay_us(name):
                        return react_delayed(thr, delay_us(name) * 1000, b["react_timeout_s"])
                    return reactions[name]()
                plan = [(name, controller_of(name)) for name in controllers]
                for name, arm in plan:
                    psi = name == "psi"
                    results.append(run_bursts(name, arm, obs=obs, thr=thr, workload=workload, park=park,
                                              workers=workers if psi else [worker], cfg=cfg,
                                              count=b["psi_count"] if psi else b["count"]))
        finally:
            for w in workers:
                w.close()
            probe.send_signal(signal.SIGTERM)
            probe.wait(10)
            park.remove()

    benchmark.pedantic(measure, rounds=1, iterations=1)

    samples = json.loads(probe_out.read_text()) if probe_out.exists() else []
    for r in results:
        t0, t1 = r.pop("window")
        lat = [l / 1e6 for t, l in samples if t0 <= t <= t1]
        r["probe_p99_ms"] = pct(lat, 99) if lat else None

    # without CAP_SYS_RESOURCE a PSI trigger is evaluated on the group's 2 s averaging tick
    psi_privilege = "; no CAP_SYS_RESOURCE: triggers fire on the 2 s averaging tick" if not _cap_sys_resource() else ""
    lines = [f"Experiment 2 — reaction to a memory burst, measured to the worker stopping: onset = its first memcg "
             f"reclaim, stop = it left the CPU stopped (sched_switch prev_state & {stopped_mask[0]:#x}), both kernel "
             f"clock (task_stop.bpf.c); overshoot = burst MiB it touched in between",
             f"{b['count']} bursts/controller of {b['burst_mb']} MiB over a {b['limit_mb']} MiB limit "
             f"({b['psi_count']} for PSI, in {b.get('psi_lanes', 1)} parallel lanes: one cgroup + trigger each); "
             f"PSI window {b['psi_window_us'] // 1000} ms (host accepts multiples of 2 s{psi_privilege}), "
             f"threshold {b['psi_threshold_us']} us; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end",
             f"{'controller':14} {'n':>4} {'miss':>4} {'earl':>4} {'late':>4} {'p50 ms':>9} {'p95 ms':>9} {'p99 ms':>9}"
             f" {'max ms':>9} {'over p50':>8} {'over p99':>8} {'sent p99':>9} {'probe p99':>9}"
             f" {'ran on':>9} {'bound %':>8} {'aft p99':>8}"]
    fmt = lambda v, w=9: f"{v:{w}.3f}" if isinstance(v, (int, float)) and v == v else f"{'-':>{w}}"
    for r in results:
        lines.append(f"{r['controller']:14} {r['n']:4d} {r['misses']:4d} {r['early']:4d} {r['late']:4d} {fmt(r['p50_ms'])}"
                     f" {fmt(r['p95_ms'])} {fmt(r['p99_ms'])} {fmt(r['max_ms'])} {fmt(r['overshoot_p50_mib'], 8)}"
                     f" {fmt(r['overshoot_p99_mib'], 8)} {fmt(r['sent_p99_ms'])} {fmt(r['probe_p99_ms'])}"
                     f" {r['ran_on']:4d}/{r['bursts']:<4d} {fmt(r['ran_on_lower_pct'], 8)} {fmt(r['after_reclaim_p99_ms'], 8)}")
    lines.append("p50/p95/p99/max: onset -> stop (ms); over: overshoot (MiB); earl: stopped before the first reclaim "
                 "(not in the percentiles); late: stopped only after the whole burst; sent p99: onset -> signal sent, informational (not the stop, not asserted); "
                 "probe p99: lateness of a co-located 1 ms sleeper during that controller's bursts; "
                 "ran on: bursts whose worker touched more of the burst after its first reclaim began, before it "
                 f"stopped (or never stopped); bound %: lower {b['confidence']:.1%}-confidence bound of that share "
                 "(what a claim on ran_on_lower_pct reads); aft p99: stop - end of the first reclaim (ms), informational"
                 + "".join(f" ({r['controller']}: {r['lanes']} bursts at a time, so not comparable)"
                           for r in results if r["lanes"] > 1))
    for r in results:                                  # where the slowest stops' time went
        if r["controller"].startswith("ebpf"):
            lines.append(f"{r['controller']}: p99 without the wait for a CPU {fmt(r['no_cpu_wait_p99_ms'], 0).strip()} ms; "
                         f"slowest stops: " + "; ".join(
                f"{w['reaction_ms']:.3f} ms = first reclaim {fmt(w['first_reclaim_ms'], 0).strip()} ms, "
                f"waiting for a CPU {w['runnable_ms']:.3f} ms, blocked {w['blocked_ms']:.3f} ms, "
                f"{w['reclaims']} reclaims" for w in r["slowest"]))
    by = {r["controller"]: r for r in results}
    verdicts = claims.check(kinds.claims_of(exp), by, harness_exp.not_run(exp, by))
    lines += [str(v) for v in verdicts]
    with capsys.disabled():                            # output capture would swallow the table
        print("\n" + "\n".join(lines))
    benchmark.extra_info["exp2"] = results
    benchmark.extra_info["exp2_columns"] = COLUMNS
    benchmark.extra_info["exp2_table"] = lines
    benchmark.extra_info["claims"] = [str(v) for v in verdicts]

    problems = [f"bursts that never reached memcg reclaim measure nothing: {r['controller']}: {r['no_onset_counters']}"
                for r in results if r["no_onset"]]
    context = [f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"]
    if "ebpf_kernel" in by:
        kern = by["ebpf_kernel"]
        context.append(f"in-kernel: where the slowest stops' time went: {kern['slowest']}; p99 without the wait "
                       f"for a CPU: {fmt(kern['no_cpu_wait_p99_ms'], 0).strip()} ms")
    harness_exp.outcome(verdicts, "exp2 claims (" + "; ".join(context) + ")", problems)
