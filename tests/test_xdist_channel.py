"""No shared filesystem between xdist workers and the controller (harness/session.py,
harness/controller.py), in pytest subprocesses on the synthetic study: everything a worker measures
reaches the controller on its test reports, and only the controller writes the run directory.

* a serial run and a `-n 2` run write the same files, the same records (less what a clock or the
  kernel's timing decides), summaries, run tree and machines; every record names its host;
* a worker that sees the results directory read-only (its own mount namespace: a write there fails
  even as root) still gives the controller every record: it never writes there;
* a worker that dies mid-run loses none of the tests it finished: their records went with their
  reports.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from helpers import EXP_MODULE, KILLED_ON_PURPOSE, cgroups_or_skip, leaked, run_study, write_study

import xdist  # noqa: E402,F401  (the `test` extra installs it: missing is a broken set-up, not a skip)

#: what the machine's clock and the kernel's timing decide: not the same in two runs of one test
MEASURED = {"latency_ms", "cpu_ms", "max_rss_mb", "mem_high_events", "mem_max_events", "used_gib_s", "usage_samples",
            "utilization", "idle_reserved_gib_s", "mem_stall_ms"}
#: a summary's figures that do not depend on timing (the study's OOM kills are its limits')
STEADY = ("experiment", "config", "seed", "params", "total_steps", "executed_steps", "oom_kills", "timeouts")
FILES = ["complete.json", "metrics.jsonl", "run.json", "summary.json"]


@pytest.fixture
def project(pytester):
    write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)


def _run(pytester) -> Path:
    return (pytester.path / "out" / "latest").resolve()


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _steady(records: list[dict]) -> Counter:
    return Counter(json.dumps({k: v for k, v in r.items() if k not in MEASURED}, sort_keys=True) for r in records)


def _this_host(mode: str) -> dict:
    return {"host": platform.node(), "kernel": os.uname().release, "cgroup_mode": mode}


@pytest.mark.slow
def test_serial_and_parallel_runs_write_the_same_files(pytester, project):
    host = cgroups_or_skip()
    run_study(pytester).assert_outcomes(passed=4)
    serial = _run(pytester)
    run_study(pytester, "-n", "2").assert_outcomes(passed=4)
    parallel = _run(pytester)
    assert serial != parallel
    assert sorted(p.name for p in serial.iterdir()) == sorted(p.name for p in parallel.iterdir()) == FILES

    records = {"serial": _records(serial), "parallel": _records(parallel)}
    assert len(records["serial"]) == len(records["parallel"]) == 16
    assert _steady(records["serial"]) == _steady(records["parallel"])
    assert {frozenset(r) for r in records["serial"]} == {frozenset(r) for r in records["parallel"]}
    for r in records["serial"] + records["parallel"]:            # every record names the host that measured it
        assert {k: r[k] for k in ("host", "kernel", "cgroup_mode")} == _this_host(host.mode), r

    summaries = {name: sorted(({k: s[k] for k in STEADY} for s in json.loads((run / "summary.json").read_text())),
                              key=lambda s: s["config"]) for name, run in (("serial", serial), ("parallel", parallel))}
    assert summaries["serial"] == summaries["parallel"] and len(summaries["serial"]) == 4
    complete = {name: json.loads((run / "complete.json").read_text()) for name, run in (("s", serial), ("p", parallel))}
    assert set(complete["s"]) == set(complete["p"]) >= {"finished", "exitstatus", "run_tree", "hosts"}
    assert complete["s"]["run_tree"] == complete["p"]["run_tree"]
    assert {"memory", "pids"} <= set(complete["p"]["run_tree"]["controllers"])
    # the machine that measured, the controller's own serially, the workers' (here the same) under xdist
    assert complete["s"]["hosts"] == complete["p"]["hosts"]
    [(name, machine)] = complete["p"]["hosts"].items()
    assert name == platform.node() and machine["cgroups"]["mode"] == host.mode
    assert machine["kernel"]["release"] == os.uname().release and machine["packages"]["pytest-agentcgroup"]
    facts = {name: json.loads((run / "run.json").read_text()) for name, run in (("s", serial), ("p", parallel))}
    assert set(facts["s"]) == set(facts["p"]) and facts["s"]["host"] == facts["p"]["host"]
    assert leaked(host) == []


READ_ONLY_WORKER = """#!/bin/sh
# an xdist worker in a mount namespace of its own where the results directory is mounted read-only:
# a write there fails (EROFS) even as root; the controller, outside, writes it as usual
exec unshare --mount -- sh -c 'mount --bind -o ro "$1" "$1" && shift && exec "$@"' sh {out} {python} "$@"
"""


def _read_only_mounts_or_skip(where: Path) -> None:
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("needs unshare (util-linux) for a worker with a mount namespace of its own")
    where.mkdir(parents=True, exist_ok=True)
    probe = subprocess.run([unshare, "--mount", "--", "sh", "-c", f'mount --bind -o ro "{where}" "{where}" && '
                            f'! touch "{where}/probe" 2>/dev/null'], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"a read-only bind mount in a new mount namespace failed here (needs CAP_SYS_ADMIN): "
                    f"{probe.stderr.strip() or 'the mount was writable'}")


@pytest.mark.slow
def test_a_worker_never_writes_under_the_run_directory(pytester, project):
    host = cgroups_or_skip()
    out = pytester.path / "out"
    _read_only_mounts_or_skip(out)
    worker = pytester.path / "read-only-worker"
    worker.write_text(READ_ONLY_WORKER.format(out=out, python=sys.executable))
    worker.chmod(0o755)
    result = run_study(pytester, "--dist", "load", "--tx", f"2*popen//python={worker}", "-rA")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*2 workers*"])
    run = _run(pytester)
    assert sorted(p.name for p in run.iterdir()) == FILES            # no worker directory, no worker file
    records = _records(run)
    assert Counter(r["config"] for r in records) == Counter(
        {"unlimited": 4, "static-env": 4, "static-toolcall": 4, "static-high": 4})
    assert all({k: r[k] for k in ("host", "kernel", "cgroup_mode")} == _this_host(host.mode) for r in records)
    summary = {s["config"]: s for s in json.loads((run / "summary.json").read_text())}
    assert {c: s["oom_kills"] for c, s in summary.items()} == {
        "unlimited": 0, "static-env": 1, "static-toolcall": 1, "static-high": 0}
    complete = json.loads((run / "complete.json").read_text())
    assert complete["exitstatus"] == 0 and list(complete["hosts"]) == [platform.node()]
    assert {"memory", "pids"} <= set(complete["run_tree"]["controllers"])
    assert leaked(host) == []


# Runs after the study's tests (file order, one worker): notes its worker's run roots as killed on
# purpose (helpers.killed_on_purpose: no neighbour counts them as a leak), then kills the worker.
WORKER_DIES = """
import os, signal

def test_the_worker_dies(agentcgroup_tree):
    host = agentcgroup_tree.host
    names = [p.name for d in (host.unified, *host.v1.values()) for p in d.iterdir()
             if p.name.startswith(f"agentcgroup-{{os.getpid()}}-")]
    with open({killed!r}, "a") as f:
        f.writelines(n + "\\n" for n in names)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_a_worker_that_dies_loses_none_of_the_tests_it_finished(pytester, project):
    host = cgroups_or_skip()
    out = pytester.path / "out"
    _read_only_mounts_or_skip(out)
    worker = pytester.path / "read-only-worker"
    worker.write_text(READ_ONLY_WORKER.format(out=out, python=sys.executable))
    worker.chmod(0o755)
    pytester.makepyfile(test_zz_dies=WORKER_DIES.format(killed=str(KILLED_ON_PURPOSE)))
    result = run_study(pytester, "--dist", "load", "--tx", f"popen//python={worker}", "-p", "no:randomly")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines(["*crashed while running*test_the_worker_dies*"])
    run = _run(pytester)
    records = _records(run)
    assert Counter(r["config"] for r in records) == Counter(
        {"unlimited": 4, "static-env": 4, "static-toolcall": 4, "static-high": 4})
    complete = json.loads((run / "complete.json").read_text())
    assert complete["exitstatus"] == 1 and list(complete["hosts"]) == [platform.node()]
    assert leaked(host) == []
