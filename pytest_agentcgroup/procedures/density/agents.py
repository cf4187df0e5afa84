"""Groups of agents replayed at once under one budget cgroup, the machinery both tests of a density
study share: Bench runs a group (each agent a workload cgroup under the budget, each of its tool
calls a step cgroup below that with the arm's per-step limits or policy: cgroups/placement.py
ArmPlacement, the same placement every experiment uses), AgentRun is one agent's replay, and
AllocLoggingEmulator the emulate executor logging each MiB's allocation latency.

    <test>/k<K>/                budget: the hard limit shared by the K agents
        a<i>/                   agent i (replays its trace with the emulate executor)
            p<n>/               one tool call: the arm's per-step limits / policy
            base/               replication only: the agent's own resident memory (base_mb)

May import: arms, config (swept_arm), cgroups.node, metrics.records, proc, replay, studies (density,
budgets), traces.corpus, the harness (settings).
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ... import config as cfgmod
from ... import proc
from ...arms import Rules
from ...cgroups.node import MB
from ...harness.settings import setting
from ...metrics.records import step_record
from ...replay import EmulateExecutor, replay
from ...replay.executors import emulator_binary
from ...studies import density as dens
from ...studies.budgets import harness_failures
from ...traces.corpus import Corpus


def prioritized(arm) -> bool:
    """A policy arm whose eBPF acts on priorities (bpf-soft has none: ebpf = false)."""
    return arm.policy is not None and Rules.from_arm(arm).ebpf


def with_agent_priorities(arm, where: str):
    """The arm with the agent priority labels in its priority table: a placement keyed by them
    (kind_of) gives every step of an agent the agent's priority, whatever the step's own kind."""
    rules = dict(arm.rules)
    rules["priorities"] = {**rules.get("priorities", {"default": "normal"}), **dens.AGENT_PRIORITY_KINDS}
    return cfgmod.swept_arm(arm, {"rules": rules}, where)


def peak_mb(trace) -> tuple[float, str]:
    """The trace's largest step peak and that figure's provenance (the trace IR's)."""
    best = max((s.profile.peak_mb for s in trace.steps if s.profile.peak_mb is not None),
               key=lambda m: m.value, default=None)
    return (best.value, best.provenance) if best is not None else (0.0, "none")


class AllocLoggingEmulator(EmulateExecutor):
    """The emulate executor, each step appending its per-chunk allocation latency to `alloc_log`."""

    def __init__(self, alloc_log: str | None, **kw):
        super().__init__(**kw)
        self.alloc_log = alloc_log

    def launch(self, step):
        launch = super().launch(step)
        if launch is not None and self.alloc_log:
            launch.argv.append(self.alloc_log)
        return launch


class AgentRun:
    """One agent's replay in one group: its records, and what ended it abnormally."""

    def __init__(self, agent: dens.Agent, trace, arm_name: str, time_scale: float, alloc_log: str | None):
        self.agent, self.trace, self.arm_name, self.time_scale = agent, trace, arm_name, time_scale
        self.alloc_log = alloc_log
        self.records: list[dict] = []
        self.base_oom_kills = 0
        self.error: str | None = None
        self.raised: BaseException | None = None
        self._steps = {s.step_id: s for s in trace.steps}

    def add(self, result) -> None:
        self.records.append(step_record(result, self._steps[result.step_id], config=self.arm_name,
                                        time_scale=self.time_scale, executor="emulate"))

    @property
    def oom_kills(self) -> int:
        return sum(r["oom_kills"] for r in self.records) + self.base_oom_kills

    @property
    def policy_kills(self) -> int:
        return sum(r.get("policy_kills", 0) for r in self.records)

    @property
    def completed(self) -> bool:
        return (self.error is None and self.oom_kills == 0 and len(self.records) == len(self.trace.steps)
                and all(r["executed"] and r["exit_code"] == 0 and not r["signal"] and not r["timed_out"]
                        for r in self.records))

    @property
    def tool_ms(self) -> float | None:
        lat = [r["latency_ms"] for r in self.records if r["latency_ms"] is not None]
        return sum(lat) if lat else None

    def allocations_ms(self) -> list[float]:
        if not self.alloc_log or not os.path.exists(self.alloc_log):
            return []
        with open(self.alloc_log) as f:
            return [float(x) for x in f.read().split()]


class Bench:
    """Runs groups of agents, each group under its own budget cgroup in the test's workload cgroup."""

    def __init__(self, workload, tree, placement, corpus, tmp: Path, *, time_scale: float, step_timeout_s: float):
        self.workload, self.tree, self.placement, self.corpus, self.tmp = workload, tree, placement, corpus, tmp
        self.time_scale, self.step_timeout_s = time_scale, step_timeout_s
        self._n = 0
        self.harness: list[str] = []          # steps that did not run as replayed: the test fails on them

    def run(self, name: str, agents: list[dens.Agent], arm, *, budget_mb: float, stagger_ms: float = 0,
            base_mb: float = 0, log_alloc_of: set[int] = frozenset()) -> list[AgentRun]:
        self._n += 1
        controllers = self.tree.controllers
        budget = self.workload.child(f"{name}.{self._n}", controllers, inner=True)
        try:
            budget.set_memory_max(int(budget_mb * MB))
            by_priority = prioritized(arm)
            runs, bodies = [], []
            for a in agents:
                trace = self.corpus.load(a.trace_id)
                log = str(self.tmp / f"alloc-{self._n}-{a.index}.txt") if a.index in log_alloc_of else None
                run = AgentRun(a, trace, arm.name, self.time_scale, log)
                cg = budget.child(f"a{a.index}", controllers, inner=True)
                # made here, in the test's thread: a policy arm this host cannot run skips from here
                # the policy's timers at the replay's pace (docs/configuration.md, "One time rule")
                place = self.placement(arm, cg, pool=True, time_scale=self.time_scale, trace=trace,
                                       kind_of=(lambda step, k=a.kind: k) if by_priority else None)
                ex = AllocLoggingEmulator(log, time_scale=self.time_scale, step_timeout_s=self.step_timeout_s)
                runs.append(run)
                bodies.append(self._body(run, cg, ex, place, a.index * stagger_ms / 1000.0, base_mb))
            threads = [threading.Thread(target=b, name=f"agent-{r.agent.index}") for r, b in zip(runs, bodies)]
            for th in threads:
                th.start()
            try:
                for th in threads:
                    th.join()
            except BaseException:
                budget.kill()           # Ctrl-C: no agent outlives the test
                for th in threads:
                    th.join(timeout=60)
                raise
        finally:
            budget.remove()
        for r in runs:
            if r.raised is not None:
                raise r.raised
            self.harness += [f"{name} agent {r.agent.index}: {line}" for line in harness_failures(r.records, "emulate")]
            if r.error:
                self.harness.append(f"{name} agent {r.agent.index} ({r.trace.trace_id}): {r.error}")
        return runs

    def _body(self, run: AgentRun, cg, ex, place, delay_s: float, base_mb: float):
        def body():
            base = proc = None
            try:
                if base_mb:
                    base, proc = self._start_base(cg, base_mb)
                time.sleep(delay_s)
                replay(run.trace, ex, place, on_step=run.add)
            except Exception as exc:            # reported per agent; the test fails on it
                run.error = f"{type(exc).__name__}: {exc}"
            except BaseException as exc:        # skip/fail/interrupt: raised again in the test's thread
                run.raised = exc
            finally:
                if base is not None:
                    run.base_oom_kills = base.counters().oom_kills
                    base.kill()
                    proc.wait()
        return body

    def _start_base(self, cg, base_mb: float):
        """The agent's own resident memory for its whole run (AgentCgroup's `base_memory_mb`): the
        emulator holding base_mb, in a leaf beside the agent's step cgroups; waited for until resident."""
        base = cg.child("base", self.tree.controllers)
        argv = [emulator_binary(), str(int(base_mb * MB)), "0", "0", "0", str(10 ** 9), str(self.tmp)]
        # a parked shell joins, then execs: no fork with a Python pre-exec hook from several threads
        parked = proc.Parked(base.join_files())
        parked.start(argv, None, None)
        child = parked.proc
        deadline = time.monotonic() + 10
        while base.usage_bytes() < 0.9 * base_mb * MB and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return base, child


def bench_for(request, workload_cgroup, agentcgroup_tree, agentcgroup_placement, study, exp, tmp_path, **over) -> Bench:
    """The test's Bench: the corpus, time scale and step timeout of the session's settings (`over`: a table's own)."""
    corpus = Corpus.open(setting(request.config, "traces") or str(study.traces))
    time_scale = over.get("time_scale") or setting(request.config, "time_scale", experiment=exp)
    step_timeout = over.get("step_timeout_s") or setting(request.config, "step_timeout", experiment=exp)
    return Bench(workload_cgroup, agentcgroup_tree, agentcgroup_placement, corpus, tmp_path,
                 time_scale=time_scale, step_timeout_s=step_timeout)


def killed(runs: list[AgentRun]) -> str:
    """Which agents the kernel OOM-killed (or the policy killed), e.g. `1:low`."""
    return " ".join(f"{r.agent.index}:{r.agent.priority}" for r in runs if r.oom_kills or r.policy_kills)


def fmt(v, spec=".2f"):
    return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def layout(tree) -> str:
    return f"cgroup {tree.host.mode}, kernel {os.uname().release}"
