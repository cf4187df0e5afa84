"""Experiment 4 — overhead.

(a) `test_exp4`: the same traces under no control, a static per-step cgroup and the dynamic
    `agentcgroup` arm (the arm list is data: [experiments.exp4] in agentcgroup.toml), through the
    normal fixtures; the budgets bound each arm's per-step overhead over the replayed durations.

(b) `test_exp4_step_overhead`: what the harness itself costs per step, against the tools people use,
    on a trivial step (`/bin/true`), all peers interleaved round by round in one run:

    bare            subprocess.run: fork/exec/wait, no cgroup (the baseline)
    ours            the replayer's own step (replay_step) in a per-step cgroup with the arm's limit:
                    join before exec, counters read after exit. Cgroup creation, the fork and the
                    removal are done between steps (cgroups/pool.py), reported as `ours, between steps`
    ours, no pool   the same with creation and removal on the step's path
    shell wrapper   AgentCgroup-style: sh mkdirs the cgroups, writes its pid, runs the step, rmdirs
    cgexec          libcgroup (Debian cgroup-tools): cgcreate, cgexec, cgdelete
    docker exec     `docker exec <container> /bin/true` (Docker CLI, a running container)

    The table prints median and p95 per peer and the ratio of medians to bare; a peer that is not
    installed is left out, naming what is missing. The test asserts the goal: ours <= 1.5 x bare;
    a pass above it is measured again and the test fails only when the second pass is above it too.
"""
from __future__ import annotations

import itertools
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.cgroups.container import cgroup_parent
from pytest_agentcgroup.cgroups.host import _mounts
from pytest_agentcgroup.metrics.records import percentile
from pytest_agentcgroup.engines.docker import LOCAL_IMAGE, SESSION_LABEL
from pytest_agentcgroup.replay.executors import ExecutorUnavailable, Launch
from pytest_agentcgroup.replay.replayer import replay_step
from pytest_agentcgroup.traces.ir import Step, Trace

pytestmark = pytest.mark.experiment(name="exp4")

GOAL = 1.5              # ours / bare, medians
ROUNDS = 200            # every peer once per round (docker exec every DOCKER_EVERY-th round)
DOCKER_EVERY = 4
TRUE = ["/bin/true"]
QUIET = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_exp4(agentcgroup_run):
    outcome = agentcgroup_run()
    assert outcome.records, "the replay produced no step records"
    outcome.assert_within_budget()


# ---------------------------------------------------------------------------------------------
# (b) per-step cost of the harness against its peers

class TrueExecutor:
    """Every step is `/bin/true`: what is left to measure is the harness."""
    name = "true"

    def launch(self, step: Step) -> Launch:
        return Launch(argv=TRUE, cwd="/", timeout_s=10.0)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _relative(path: Path) -> str:
    """A cgroup directory as libcgroup names it: relative to its hierarchy's mount point."""
    point = max((Path(m) for m, fs, _ in _mounts("/proc/self/mountinfo") if path.is_relative_to(m)),
                key=lambda m: len(m.parts))
    return "/" + str(path.relative_to(point))


class Peers:
    """Each peer: one `/bin/true` step; returns its wall time in ms."""

    def __init__(self, pooled: ArmPlacement, unpooled: ArmPlacement, workload):
        self.workload, self.n = workload, itertools.count()
        self.trace = Trace("exp4/true", {"format": "synthetic"}, ())
        self.pooled, self.unpooled = pooled, unpooled
        self.between: list[float] = []      # the pooled placement's work between steps
        self.executor = TrueExecutor()

    def bare(self) -> float:
        t0 = time.perf_counter()
        subprocess.run(TRUE, **QUIET)
        return _ms(t0)

    def _replay(self, placement) -> float:
        step = Step(next(self.n), "bash", {"command": "true"})
        t0 = time.perf_counter()
        r = replay_step(self.trace, step, self.executor, placement)
        ms = _ms(t0)
        assert r.exit_code == 0 and "peak_bytes" in r.counters, r
        return ms

    def ours(self) -> float:
        ms = self._replay(self.pooled)
        t0 = time.perf_counter()
        self.pooled.tidy()                  # what the replayer does once the step's result is out
        self.between.append(_ms(t0))
        return ms

    def ours_unpooled(self) -> float:
        return self._replay(self.unpooled)

    def shell_wrapper(self) -> float:
        dirs = [str(p / f"w{next(self.n)}") for p in self.workload.paths.values()]
        script = ('for d do mkdir "$d" && echo $$ > "$d/cgroup.procs" || exit 125; done; /bin/true; rc=$?; '
                  'for d do echo $$ > "${d%/*}/cgroup.procs"; rmdir "$d"; done; exit $rc')
        t0 = time.perf_counter()
        rc = subprocess.run(["/bin/sh", "-c", script, "sh", *dirs], **QUIET).returncode
        ms = _ms(t0)
        assert rc == 0
        return ms

    def cgexec(self) -> float:
        name = f"c{next(self.n)}"
        groups = [a for key, p in self.workload.paths.items() if key != "unified"
                  for a in ("-g", f"{key}:{_relative(p / name)}")]
        if not groups:                      # pure v2: the unified hierarchy
            groups = ["-g", f"memory,pids:{_relative(self.workload.unified / name)}"]
        t0 = time.perf_counter()
        rcs = [subprocess.run(["cgcreate", *groups], **QUIET).returncode,
               subprocess.run(["cgexec", *groups, *TRUE], **QUIET).returncode,
               subprocess.run(["cgdelete", *groups], **QUIET).returncode]
        ms = _ms(t0)
        assert rcs == [0, 0, 0], rcs
        return ms

    def close(self) -> None:
        self.pooled.close()


def _docker_exec(request, workload, tree):
    """A `docker exec` peer on a running container of the local image, or the reason there is none."""
    cli = shutil.which("docker")
    if not cli:
        return None, "the docker CLI is not installed (Debian package docker.io)"
    try:
        engine = request.getfixturevalue("agentcgroup_docker")
    except pytest.skip.Exception as exc:
        return None, str(exc)
    try:
        engine.ensure_image(LOCAL_IMAGE)
    except ExecutorUnavailable as exc:
        return None, str(exc)
    box = engine.client.containers.run(LOCAL_IMAGE, ["sleep", "infinity"], detach=True, network_mode="none",
                                       read_only=True, cap_drop=["ALL"], labels={SESSION_LABEL: engine.tag},
                                       cgroup_parent=cgroup_parent(tree, workload), stop_signal="SIGKILL")
    request.addfinalizer(lambda: box.remove(force=True))

    def docker_exec() -> float:
        t0 = time.perf_counter()
        rc = subprocess.run([cli, "exec", box.id, *TRUE], **QUIET).returncode
        ms = _ms(t0)
        assert rc == 0, f"docker exec exited {rc}"
        return ms
    return docker_exec, None


def _table(rows: list[tuple[str, list[float]]], bare: float, missing: dict[str, str]) -> str:
    lines = [f"{'peer':<22}{'n':>5}{'median ms':>11}{'p95 ms':>10}{'x bare':>8}",
             "-" * 56]
    for name, xs in rows:
        med = percentile(xs, 50)
        lines.append(f"{name:<22}{len(xs):>5}{med:>11.3f}{percentile(xs, 95):>10.3f}{med / bare:>8.2f}")
    lines += [f"{name:<22}  not measured: {why}" for name, why in missing.items()]
    return "\n".join(lines)


def test_exp4_step_overhead(request, agentcgroup_tree, agentcgroup_placement, workload_cgroup, benchmark, capsys):
    arm = "static-toolcall"                   # a per-step limit: the cgroup is made and limited per step
    peers = Peers(agentcgroup_placement(arm, pool=True), agentcgroup_placement(arm), workload_cgroup)
    request.addfinalizer(peers.close)
    runs = {"bare": peers.bare, "ours": peers.ours, "ours, no pool": peers.ours_unpooled,
            "shell wrapper": peers.shell_wrapper}
    missing = {}
    if all(shutil.which(t) for t in ("cgcreate", "cgexec", "cgdelete")):
        runs["cgexec"] = peers.cgexec
    else:
        missing["cgexec"] = "cgcreate/cgexec/cgdelete are not installed (Debian package cgroup-tools)"
    docker_exec, why = _docker_exec(request, workload_cgroup, agentcgroup_tree)
    if docker_exec:
        runs["docker exec"] = docker_exec
    else:
        missing["docker exec"] = why

    def measure() -> dict[str, list[float]]:
        samples = {name: [] for name in runs}
        for name, fn in runs.items():         # warm-up: first calls pay imports, page cache, pool
            fn()
        peers.between.clear()
        order = random.Random(4)      # a fresh order every round: each peer follows every other alike
        for r in range(ROUNDS):
            names = list(runs)
            order.shuffle(names)
            for name in names:
                if name == "docker exec" and r % DOCKER_EVERY:
                    continue
                samples[name].append(runs[name]())
        rows = [(n, xs) for n, xs in samples.items()]
        rows.insert(2, ("ours, between steps", list(peers.between)))
        return dict(rows)

    def ratio(samples) -> float:
        return percentile(samples["ours"], 50) / percentile(samples["bare"], 50)

    benchmark.group = "exp4"
    passes = [benchmark.pedantic(measure, rounds=1, iterations=1, warmup_rounds=0)]
    # This is wall clock on a shared 2-core machine: the median ratio moves by about +-0.1 from one
    # run to the next. A pass above the goal is measured once more, and only a second pass above
    # it fails: a real regression shows twice, a noisy minute does not. Both passes are reported.
    if ratio(passes[0]) > GOAL:
        passes.append(measure())

    def stats(samples):
        return {n: {"median_ms": percentile(xs, 50), "p95_ms": percentile(xs, 95), "samples": len(xs),
                    "unit": "ms", "better": "lower", "provenance": "recorded"} for n, xs in samples.items()}
    benchmark.extra_info.update({"experiment": "exp4", "goal_ours_over_bare": GOAL, "peers": stats(passes[-1]),
                                 "ours_over_bare": [ratio(p) for p in passes]})
    if len(passes) > 1:
        benchmark.extra_info["peers_first_pass"] = stats(passes[0])
    tables = []
    for i, samples in enumerate(passes):
        head = (f"exp4: per-step cost of running /bin/true, {ROUNDS} interleaved rounds "
                f"(wall clock; noisy on a shared machine)" if i == 0 else
                f"exp4: ours/bare {ratio(passes[0]):.2f} is above the goal {GOAL}: measured again")
        tables.append(f"{head}\n{_table(list(samples.items()), percentile(samples['bare'], 50), missing)}")
    with capsys.disabled():
        print("\n" + "\n\n".join(tables))
    assert ratio(passes[-1]) <= GOAL, \
        (f"ours costs {ratio(passes[-1]):.2f} x bare spawn per step (goal <= {GOAL}), "
         f"confirmed by a second pass\n" + "\n\n".join(tables))
