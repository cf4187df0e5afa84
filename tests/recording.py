"""Recorded traces for the fidelity tests, made here for real: each command runs in a cgroup of its
own on this host, its memory sampled every 5 ms (v1 memory.usage_in_bytes | v2 memory.current), its
peak the kernel's per-cgroup peak, its CPU the cgroup's cpu.stat usage, its duration the wall time
from spawn to reap (proc.run, as the replayer measures a step). Nothing is made up: a command that
fails or whose cgroup has no peak counter is an error, not a recording.

Beside each recorded profile, `original` holds what a 1 Hz sampler would have derived from the same
run (the memory readings at 0.5 s, 1.5 s, ... and the CPU counter read at the same instants; its
duration is the recorded one, so it is left out), as the converters derive profiles from 1 Hz
container samples: `traces fidelity` reports how wrong those were.
This is a test helper, not the profiler (`agentcgroup traces profile` is built elsewhere).
"""
from __future__ import annotations

import shlex
import sys
import threading
import time
from pathlib import Path

from pytest_agentcgroup.proc import run
from pytest_agentcgroup.traces.ir import Curve, Measure, Original, Outcome, Profile, Step, Trace

MIB = 1024 * 1024
PERIOD_S = 0.005
SLOW_PERIOD_S, SLOW_PHASE_S = 1.0, 0.5


def record_step(parent, controllers, step_id: int, argv: list[str], *, timeout_s: float = 60.0) -> Step:
    cg = parent.child(f"rec{step_id}", controllers)
    fast: list[tuple[float, float]] = []
    slow: list[tuple[float, float, float]] = []        # (t_ms, mb, cpu_ms) at 1 Hz
    done = threading.Event()
    t0 = time.perf_counter()

    def sample() -> None:
        next_slow = SLOW_PHASE_S
        while not done.is_set():
            t = time.perf_counter() - t0
            mb = cg.usage_bytes() / MIB
            fast.append((t * 1000.0, mb))
            if t >= next_slow:
                slow.append((t * 1000.0, mb, (cg.counters().cpu_usec or 0) / 1000.0))   # None: refused below
                next_slow += SLOW_PERIOD_S
            done.wait(PERIOD_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        proc = run(argv, join=cg.join_files(), timeout_s=timeout_s, kill=cg.kill)
    finally:
        done.set()
        sampler.join()
        counters = cg.counters()
        cg.remove()
    if proc.exit_code != 0:
        raise RuntimeError(f"recording {argv!r}: exit {proc.exit_code}, signal {proc.signal}")
    if counters.peak_bytes is None:
        raise RuntimeError("this kernel has no per-cgroup memory peak (v2 memory.peak is 5.19+)")
    if counters.cpu_usec is None:
        raise RuntimeError("the step's cgroup has no readable cpu.stat (no unified hierarchy)")
    rec = lambda v: Measure(round(v, 3), "recorded")        # noqa: E731
    top = max(fast, key=lambda p: p[1])
    profile = Profile(peak_mb=rec(counters.peak_bytes / MIB), cpu_ms=rec(counters.cpu_usec / 1000.0),
                      ramp_ms=Measure(round(top[0], 3), "derived"),
                      curve=Curve(tuple(round(t, 3) for t, _ in fast), tuple(round(m, 3) for _, m in fast), "recorded"))
    original = None
    if slow:        # a step shorter than the first 1 Hz reading has no derived profile, as in the sources
        stop = max(slow, key=lambda p: p[1])
        original = Original(profile=Profile(
            peak_mb=Measure(round(stop[1], 3), "derived"), ramp_ms=Measure(round(stop[0], 3), "derived"),
            cpu_ms=Measure(round(slow[-1][2], 3), "derived")))
    return Step(step_id, "bash", {"command": shlex.join(argv)}, duration_ms=rec(proc.wall_ms), profile=profile,
                outcome=Outcome("ok", 0), original=original)


def record_trace(parent, controllers, trace_id: str, commands: list[list[str]]) -> Trace:
    steps = tuple(record_step(parent, controllers, i, argv) for i, argv in enumerate(commands))
    return Trace(trace_id, {"format": "recorded", "note": "recorded by tests/recording.py on this host"}, steps)


PY = "/usr/bin/python3"
#: Real commands, one behaviour each: a two-peak allocation with a release between, a multi-core CPU
#: burst, a plain ramp-and-hold, and a dd writing (page cache) then removing its file.
TWO_PEAKS = [PY, "-c", "import time\nfor mb in (120, 60):\n a = bytearray(mb << 20)\n"
             " a[::4096] = b'1' * len(range(0, len(a), 4096))\n time.sleep(0.4); del a; time.sleep(0.3)"]
TWO_CORES = [PY, "-c", "import os, time\npid = os.fork()\ne = time.process_time() + 0.6\n"
             "while time.process_time() < e: pass\nos.waitpid(pid, 0) if pid else os._exit(0)"]
RAMP = [PY, "-c", "import time\nh = []\nfor i in range(16):\n b = bytearray(8 << 20); b[::4096] = b'1' * 2048"
        "; h.append(b); time.sleep(0.03)\ntime.sleep(0.3)"]
BURN = [PY, "-c", "import time\ne = time.process_time() + 0.5\nwhile time.process_time() < e: pass\ntime.sleep(0.2)"]
DD = ["sh", "-c", "f=$(mktemp); dd if=/dev/zero of=$f bs=1M count=64 status=none; sleep 0.3; rm -f $f"]
COMMANDS = [TWO_PEAKS, TWO_CORES, RAMP, BURN, DD]

#: Tool-call-like commands an agent runs (a test runner's start-up, byte-compiling, an archive, a
#: sort, a recursive grep, git, a C compile), recorded beside COMMANDS (docs/experiments/fidelity.md,
#: "a recording of your own").
SRC = "/usr/lib/python3.11"
AGENT_LIKE = [
    [sys.executable, "-m", "pytest", "--version"],
    ["sh", "-c", f"d=$(mktemp -d); cp -r {SRC}/email $d/; {PY} -m compileall -q $d; rm -rf $d"],
    ["sh", "-c", f"tar czf - -C {SRC} email json | wc -c"],
    ["sh", "-c", "seq 1 400000 | sort -R | sort -n | tail -1"],
    ["sh", "-c", f"grep -rc 'def ' {SRC}/email {SRC}/json | wc -l"],
    ["git", "-C", str(Path(__file__).resolve().parents[1]), "log", "--oneline", "-n", "200"],
    ["sh", "-c", "d=$(mktemp -d); printf 'int main(void){return 0;}\\n' > $d/a.c; "
                 "cc -O2 -c $d/a.c -o $d/a.o; rm -rf $d"],
]


def main(out: str) -> None:
    """Record COMMANDS and AGENT_LIKE here into OUT (one trace): `python tests/recording.py OUT`."""
    from pytest_agentcgroup.cgroups import RunTree, detect
    from pytest_agentcgroup.traces.ir import write_trace
    tree = RunTree(detect())
    try:
        trace = record_trace(tree.workload("record"), tree.controllers, "recorded/here", COMMANDS + AGENT_LIKE)
    finally:
        tree.close()
    write_trace(trace, out)


if __name__ == "__main__":
    main(sys.argv[1])
