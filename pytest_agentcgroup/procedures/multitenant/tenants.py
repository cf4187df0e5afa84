"""The tenants of a multitenant study: each tenant's cgroup, step records and summary (Tenant), the
host probe (a sleeper thread in the pytest process), and one replay of a trace into a tenant.

May import: metrics.records, replay, traces.classify.
"""
from __future__ import annotations

import statistics
import threading
import time

from ...arms import Arm
from ...metrics.records import percentile, step_record
from ...replay import replay
from ...traces.classify import classify_command


class Probe(threading.Thread):
    """Sleeps `period` over and over in the pytest process and records how late it woke up."""

    def __init__(self, period_s: float):
        super().__init__(daemon=True)
        self.period_s, self.late_ms, self.stop = period_s, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            time.sleep(self.period_s)
            self.late_ms.append((time.monotonic() - t - self.period_s) * 1000)


class Tenant:
    """One tenant's cgroup, records and OOM count; `replay_*` run its traces once."""

    def __init__(self, name: str, phase: str, cg, arm: Arm, cpu_weight: int | None = None):
        self.name, self.phase, self.cg, self.arm, self.cpu_weight = name, phase, cg, arm, cpu_weight
        self.records: list[dict] = []
        self.error: str | None = None
        self.raised: BaseException | None = None     # a skip/fail/interrupt in the tenant's thread

    def add(self, result, step, executor: str) -> None:
        rec = step_record(result, step, config=self.arm.name, time_scale=1.0, executor=executor)
        rec.update(tenant=self.name, phase=self.phase)
        self.records.append(rec)

    def summary(self) -> dict:
        done = [r for r in self.records if r["executed"] and r["latency_ms"] is not None]
        lat = [r["latency_ms"] for r in done]
        loads = [r["page_load_ms"] for r in done if r.get("page_load_ms")]
        tests = [r["latency_ms"] for r in done if r["tool"] == "bash" and classify_command(r["cmd"] or "") == "test"]
        c = self.cg.counters()
        return {
            "tenant": self.name, "phase": self.phase, "steps": len(self.records),
            "failed_steps": sum(1 for r in self.records if failed(r)),
            "latency_p50_ms": percentile(lat, 50), "latency_p95_ms": percentile(lat, 95),
            "latency_p99_ms": percentile(lat, 99),
            "page_load_p50_ms": percentile(loads, 50), "page_load_p95_ms": percentile(loads, 95),
            "test_step_stdev_ms": statistics.stdev(tests) if len(tests) > 1 else None,
            "test_step_p95_ms": percentile(tests, 95),
            # the kernel's count: per-step cgroups (in the records) + the tenant cgroup itself
            "oom_kills": sum(r["oom_kills"] for r in self.records if self.name != "A") + c.oom_kills,
            "pids_max_events": sum(r.get("pids_max_events", 0) for r in self.records) + c.pids_max_events,
            "throttles": sum(r.get("throttles", 0) for r in self.records),
            "cpu_s": c.cpu_usec / 1e6 if c.cpu_usec is not None else None, "cpu_weight": self.cpu_weight,
            "error": self.error,
        }


def failed(rec: dict) -> bool:
    """A step that did not complete: a browser action that failed or was never reached (the browser
    died), or a command that could not be started. A command's own non-zero exit is its result."""
    if rec["tool"] == "browser":
        return rec["executed"] and rec["exit_code"] != 0 or (rec.get("error") or "").startswith("the browser")
    return bool(rec.get("error"))


def replay_steps(tenant: Tenant, trace, executor, placement, executor_name: str) -> None:
    steps = {s.step_id: s for s in trace.steps}
    replay(trace, executor, placement, on_step=lambda r: tenant.add(r, steps[r.step_id], executor_name))
