"""The timescale study (`kind = "timescale"`, the shipped exp2): how fast do controllers react to the
same memory burst? Settings and claims: its `[experiments.<name>]` (checked at load by
studies/timescale.py); its arms are the controllers (controllers.py; select some with
--agentcgroup-arms).

Every controller is measured by one observer, bpf/task_stop.bpf.c, to the same endpoints, both
kernel clock (bpf_ktime_get_ns, CLOCK_MONOTONIC): onset (the first memcg reclaim the burst worker
entered) and stop (the worker's first switch-out in a stopped state: the SIGSTOP took effect);
reaction = stop - onset. The worker publishes how many bytes of the burst it has touched; the
observer reads that counter in the worker's own context at both endpoints, so overshoot = touched at
stop - touched at onset: the memory the controller's delay let through (bursts.py). "sent" (when the
signal was sent: user space after kill(), in-kernel after bpf_send_signal) is shown for information
only; it is not the task stopping and nothing is asserted on it. A co-located probe process
(sleep_probe.py: sleep 1 ms, measure lateness) runs throughout; its p99 per controller phase is
reported too. The claims (e.g. `ebpf_kernel.ran_on_lower_pct <= 1`: a lower confidence bound of the
share of bursts that ran on, see studies/timescale.py) read each controller's result row
(studies/timescale.py COLUMNS); every one is printed with its values and verdict (table.py).

May import: bpf (the observer and the throttle), studies (claims, kinds), the harness (experiment),
procedures.outcome and this package's modules.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ...harness import experiment as harness_exp
from ...studies import claims, kinds
from ...studies.timescale import COLUMNS
from ..outcome import StudyOutcome
from . import table
from .bursts import Worker, child_setup, pct, run_bursts
from .controllers import controller_of

PROBE = Path(__file__).with_name("sleep_probe.py")          # a program of its own, started by its path


def run(request: pytest.FixtureRequest, study, exp, part: str | None = None, arm: str | None = None) -> StudyOutcome:
    """Every selected controller's bursts, printed as one table; the outcome holds the claims'
    verdicts and the bursts that measured nothing."""
    controllers = harness_exp.arms(request, study, exp)
    from ...bpf import controller, features, task_stop
    why = features.missing(*controller.NEEDS, *task_stop.NEEDS)     # the in-kernel arm's and the stop observer's
    if why:
        pytest.skip(why)
    from ...bpf.reclaim_throttle import ReclaimThrottle
    from ...bpf.task_stop import TaskStopObserver

    tmp_path, capsys = request.getfixturevalue("tmp_path"), request.getfixturevalue("capsys")
    # the cgroup fixtures once the settings are known: a config without the study skips before anything is made
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
        probe = subprocess.Popen([sys.executable, str(PROBE), str(cfg["probe"]["period_us"]), str(probe_out)],
                                 preexec_fn=child_setup(probe_cg))
        try:
            # the observer first: on the shared reclaim tracepoint it is attached before the throttle
            with TaskStopObserver() as obs, ReclaimThrottle(track_stop=False) as thr:
                stopped_mask.append(obs.stopped_mask)
                plan = [(name, controller_of(name, thr, b)) for name in controllers]
                for name, arm_of in plan:
                    psi = name == "psi"
                    results.append(run_bursts(name, arm_of, obs=obs, thr=thr, workload=workload, park=park,
                                              workers=workers if psi else [worker], cfg=cfg,
                                              count=b["psi_count"] if psi else b["count"]))
        finally:
            for w in workers:
                w.close()
            probe.send_signal(signal.SIGTERM)
            probe.wait(10)
            park.remove()

    # asked for once nothing can skip the test any more (pytest-benchmark warns of one skipped after it)
    benchmark = request.getfixturevalue("benchmark")
    benchmark.pedantic(measure, rounds=1, iterations=1)

    samples = json.loads(probe_out.read_text()) if probe_out.exists() else []
    for r in results:
        t0, t1 = r.pop("window")
        lat = [l / 1e6 for t, l in samples if t0 <= t <= t1]
        r["probe_p99_ms"] = pct(lat, 99) if lat else None

    lines = table.lines(results, b, stopped_mask[0])
    by = {r["controller"]: r for r in results}
    verdicts = claims.check(kinds.claims_of(exp), by, harness_exp.not_run(exp, by))
    lines += [str(v) for v in verdicts]
    with capsys.disabled():                            # output capture would swallow the table
        print("\n" + "\n".join(lines))
    benchmark.extra_info[exp.name] = results
    benchmark.extra_info[f"{exp.name}_columns"] = COLUMNS
    benchmark.extra_info[f"{exp.name}_table"] = lines
    benchmark.extra_info["claims"] = [str(v) for v in verdicts]

    problems = [f"bursts that never reached memcg reclaim measure nothing: {r['controller']}: {r['no_onset_counters']}"
                for r in results if r["no_onset"]]
    context = [f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"]
    if "ebpf_kernel" in by:
        kern = by["ebpf_kernel"]
        context.append(f"in-kernel: where the slowest stops' time went: {kern['slowest']}; p99 without the wait "
                       f"for a CPU: {table.fmt(kern['no_cpu_wait_p99_ms'], 0).strip()} ms")
    return StudyOutcome(f"{exp.name} claims (" + "; ".join(context) + ")", verdicts, problems)
