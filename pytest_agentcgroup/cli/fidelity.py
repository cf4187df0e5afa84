"""`agentcgroup traces fidelity`: the emulator replays recorded traces (profile/fidelity.py) and is
compared per step with the recording (metrics/fidelity.py), the gate's verdict as the exit code."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..cgroups import CgroupUnavailable
from ..metrics import fidelity
from ..profile import fidelity as fidelity_run
from ..replay import ExecutorUnavailable
from ..traces.corpus import ir_files
from ..traces.ir import TraceError, read_traces


def add_parser(tsub) -> None:
    f = tsub.add_parser(
        "fidelity", help="replay recorded traces with the emulator and compare per step with the recording",
        description="Emulate every step whose peak and duration were recorded (agentcgroup traces profile), each "
                    "in a cgroup of its own, and compare the kernel's figures for the emulation with the recorded "
                    "ones: peak (goal ±5% or 4 MiB), duration (±10%), CPU (±15%). Prints the error distribution, "
                    "the worst steps and, where steps keep their source's figures, how wrong those were. Needs "
                    "cgroups this user can create (root or a delegated cgroup).",
        epilog="Exit codes: 0 at least 90% of the steps meet both the peak and the duration goal; 3 fewer do; "
               "1 bad input (named on stderr), no recorded step, no cgroups, a kernel without memory.peak, or "
               "steps timed only under the hypervisor's steal that could turn the verdict (the gate cannot be "
               "checked: said on stderr); 2 usage error.")
    f.add_argument("files", nargs="+", metavar="RECORDED", type=Path, help="IR files or directories of recorded traces")
    f.add_argument("--repeat", type=int, default=1, metavar="N", help="emulate each step N times, compare the median")
    f.add_argument("--json", type=Path, metavar="OUT", help="also write the whole result (every step) as JSON to OUT")
    f.set_defaults(func=cmd_fidelity)


def cmd_fidelity(args) -> int:
    if args.repeat < 1:
        print(f"agentcgroup traces fidelity: --repeat must be >= 1, got {args.repeat}", file=sys.stderr)
        return fidelity.EXIT_BAD_INPUT
    traces, bad = [], 0
    for f in ir_files(args.files):
        try:
            traces.extend(read_traces(f))
        except TraceError as exc:
            print(exc, file=sys.stderr)
            bad += 1
    if bad:         # comparing the rest would report on a corpus other than the one asked for
        print(f"agentcgroup traces fidelity: {bad} file(s) could not be read (named above); nothing emulated",
              file=sys.stderr)
        return fidelity.EXIT_BAD_INPUT
    if not any(fidelity.recorded(s) for t in traces for s in t.steps):
        print(f"agentcgroup traces fidelity: no step with a recorded peak and duration in {len(traces)} trace(s) "
              "(profile traces first: agentcgroup traces profile)", file=sys.stderr)
        return fidelity.EXIT_BAD_INPUT
    before = os.getloadavg()
    try:
        em = fidelity_run.emulate(traces, repeat=args.repeat)
    except CgroupUnavailable as exc:
        print(f"agentcgroup traces fidelity: cannot emulate in cgroups: {exc}", file=sys.stderr)
        return fidelity.EXIT_BAD_INPUT
    except ExecutorUnavailable as exc:        # the emulator cannot be built here (no compiler, ...)
        print(f"agentcgroup traces fidelity: {exc}", file=sys.stderr)
        return fidelity.EXIT_BAD_INPUT
    res = fidelity.result(em.rows, before, os.getloadavg(), args.repeat, em.exit_tail_ms, em.host())
    if res["gate"]["unmeasured"]:
        print("agentcgroup traces fidelity: this kernel has no per-cgroup memory peak (v2 memory.peak is 5.19+): "
              "peaks are not compared and the gate cannot be checked here", file=sys.stderr)
    if not res["gate"]["checked"] and res["gate"]["stolen"] and not res["gate"]["unmeasured"]:
        print(f"agentcgroup traces fidelity: {res['gate']['stolen']} step(s) were timed only while the hypervisor took "
              "the CPUs (steal), and they could turn the verdict: the gate cannot be checked here now", file=sys.stderr)
    print(fidelity.format_report(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")
    return fidelity.exit_code(res, 0)
