"""Parallel runs (`-n 2`) in pytest subprocesses on the synthetic study: one benchmark JSON in
pytest-benchmark's schema with the same entries as a serial run, a results directory that looks
like a serial run's, nothing left behind, and disjoint cpusets per worker with --agentcgroup-isolate."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import EXP_MODULE, cgroups_or_skip, leaked, run_study, write_study

import xdist  # noqa: E402,F401  (the `test` extra installs it: missing is a broken set-up, not a skip)

SCHEMA_KEYS = {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
ENTRY_KEYS = {"group", "name", "fullname", "params", "param", "extra_info", "options", "stats"}


@pytest.fixture
def project(pytester):
    write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)


@pytest.mark.slow
def test_parallel_json_matches_serial_and_pytest_benchmark_compare_reads_it(pytester, project):
    host = cgroups_or_skip()
    serial = run_study(pytester, "--benchmark-json", "serial.json")
    serial.assert_outcomes(passed=4)
    serial_results = sorted((pytester.path / "out" / "latest" / "metrics.jsonl").read_text().splitlines())
    parallel = run_study(pytester, "-n", "2", "--benchmark-json", "parallel.json")
    parallel.assert_outcomes(passed=4)
    parallel.stdout.fnmatch_lines(["*agentcgroup summary*", "*static-toolcall*1*",
                                   "*wrote benchmark JSON of 4 test(s) from the xdist workers*"])

    docs = {name: json.loads((pytester.path / f"{name}.json").read_text()) for name in ("serial", "parallel")}
    by_id = {}
    for name, doc in docs.items():
        assert set(doc) == SCHEMA_KEYS
        by_id[name] = {b["fullname"]: b for b in doc["benchmarks"]}
        for b in doc["benchmarks"]:
            assert set(b) == ENTRY_KEYS, b.keys()
            assert b["stats"]["rounds"] == 1 and b["stats"]["min"] > 0
        env = doc["machine_info"]["agentcgroup"]
        assert env["cgroups"]["mode"] == host.mode and env["kernel"]["release"]
        assert "ringbuf" in env["bpf_features"] and env["packages"]["pytest-agentcgroup"] and env["seeds"] == [0]
        # the run tree's controllers, from this process (serial) or the workers (xdist), the same
        assert {"memory", "pids"} <= set(env["run_tree"]["controllers"]), (name, env["run_tree"])
    assert docs["serial"]["machine_info"]["agentcgroup"]["run_tree"] == docs["parallel"]["machine_info"]["agentcgroup"]["run_tree"]
    assert sorted(by_id["serial"]) == sorted(by_id["parallel"])
    assert len(by_id["parallel"]) == 4
    for fullname, s in by_id["serial"].items():
        p = by_id["parallel"][fullname]
        for key in ("group", "name", "params", "param", "options"):
            assert s[key] == p[key], (key, s[key], p[key])
        assert set(s["stats"]) == set(p["stats"])
        assert s["extra_info"]["oom_kills"] == p["extra_info"]["oom_kills"]
        assert p["params"] == {"agentcgroup_case": p["param"]}

    # one run directory, as after a serial run: no worker directories, every step once; the serial
    # run before it is kept
    assert len([p for p in (pytester.path / "out").iterdir() if p.name != "latest"]) == 2
    out = (pytester.path / "out" / "latest").resolve()
    assert out.name.startswith("0002_")
    assert sorted(p.name for p in out.iterdir()) == ["complete.json", "metrics.jsonl", "run.json", "summary.json"]
    assert json.loads((out / "complete.json").read_text())["run_tree"] == env["run_tree"]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(serial_results) == 16
    strip = lambda recs: sorted((r["config"], r["step_id"], r["oom_kills"]) for r in map(json.loads, recs))  # noqa: E731
    assert strip(lines) == strip(serial_results)
    assert len(json.loads((out / "summary.json").read_text())) == 4

    compare = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(pytester.path / "parallel.json")],
                             capture_output=True, text=True, timeout=120)
    assert compare.returncode == 0, compare.stderr
    for fullname in by_id["parallel"]:
        assert fullname.split("::")[1] in compare.stdout
    assert leaked(host) == []


def test_parallel_without_isolation_warns_once(pytester, project):
    result = run_study(pytester, "-n", "2", "--collect-only", "-q")
    assert result.stdout.str().count("xdist workers share CPUs and memory") == 1


ISOLATION_PROBE = '''
import json, os
from pathlib import Path

def test_where(agentcgroup_tree, worker_id):
    root = agentcgroup_tree.root
    limit = (root.paths["memory"] / "memory.limit_in_bytes") if "memory" in root.paths else root.unified / "memory.max"
    Path(f"probe-{worker_id}.json").write_text(json.dumps({
        "cpus": sorted(os.sched_getaffinity(0)), "cpuset": Path("/proc/self/cpuset").read_text().strip(),
        "limit": limit.read_text().strip()}))

def test_where_too(agentcgroup_tree, worker_id):
    test_where(agentcgroup_tree, worker_id)
'''


@pytest.mark.slow
def test_isolate_gives_each_worker_a_disjoint_cpuset_and_a_memory_share(pytester, project):
    host = cgroups_or_skip()
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 CPUs for 2 disjoint cpusets")
    pytester.makepyfile(test_probe=ISOLATION_PROBE)
    result = run_study(pytester, "test_probe.py", "-n", "2", "--agentcgroup-isolate", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert "xdist workers share CPUs" not in result.stdout.str()
    probes = [json.loads(p.read_text()) for p in sorted(pytester.path.glob("probe-gw*.json"))]
    assert len(probes) == 2, "both workers must have run a test (load scheduling sends one to each)"
    assert set(probes[0]["cpus"]).isdisjoint(probes[1]["cpus"]), probes
    assert probes[0]["cpuset"] != probes[1]["cpuset"]
    assert all(p["limit"] not in ("max", "9223372036854771712") for p in probes), probes
    # the per-worker cpusets are gone, like every run root
    assert leaked(host) == []
    cpuset_root = "/sys/fs/cgroup/cpuset"
    if host.mode == "hybrid":
        assert not any(p.name.startswith("agentcgroup-") for p in Path(cpuset_root).iterdir())
