"""Budgets: what an experiment expects of an arm, as data, checked against a replay's records.

    [experiments.exp1.budgets.static-toolcall]
    oom_kills = "predicted"          # or a number: at most this many OOM kills in the trace
    mem_high_events = "predicted"    # every step predicted above the soft limit breaches it
    latency_overhead_p95_ms = 250    # p95 of (latency - replayed duration) over executed steps (not
                                     # of real commands: their run-to-run noise is not the harness's)
    latency_overhead_max_ms = 5000   # the worst step (a step parked for good breaks it; of a real
                                     # command, one its trace gives a duration)
    mem_stall_max_ms = 10000         # no step waits longer for memory (PSI: reclaim, memory.high throttling)

    [experiments.exp1.budgets.agentcgroup]    # policy arms (bpf/controller.py) also have
    throttles = "predicted"          # low-priority steps above the soft limit are throttled, no other
    policy_kills = 0                 # at most this many steps killed by the controller in the trace

"predicted" compares step by step with what the trace and the arm's limits imply: a step whose
replayed peak exceeds the hard limit by more than the margin must be OOM-killed, one that stays
below it by more than the margin must not be; steps inside the margin may go either way (the
interpreter, page cache and kernel rounding make a few MiB of difference). For `throttles` the
limit is the soft limit (memory_high_mb) and only steps the policy ranks low priority are expected
to be throttled (the record's `priority`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..arms import Arm
from ..metrics.faithfulness import REAL_EXECUTORS
from ..metrics.records import percentile

BUDGET_KEYS = ("oom_kills", "mem_high_events", "throttles", "policy_kills", "latency_overhead_p95_ms",
               "latency_overhead_max_ms", "mem_stall_max_ms")
_PREDICTABLE = ("oom_kills", "mem_high_events", "throttles")
MARGIN_MB = 32.0           # ± around a limit inside which a prediction is not made
MARGIN_FRACTION = 0.05


class BudgetError(ValueError):
    """A budget that cannot be checked (unknown key, bad value); names experiment, arm and key."""


@dataclass(frozen=True)
class Violation:
    trace_id: str
    step_id: int | None
    counter: str
    observed: float
    budget: str

    def __str__(self) -> str:
        where = f"{self.trace_id} step {self.step_id}" if self.step_id is not None else self.trace_id
        return f"{where}: {self.counter} = {self.observed:g}, budget {self.budget}"


def validate(budget: dict, where: str) -> dict:
    for key, val in budget.items():
        if key not in BUDGET_KEYS:
            raise BudgetError(f"{where}.{key}: unknown budget; expected one of {', '.join(BUDGET_KEYS)}")
        if key.startswith("latency") or key == "mem_stall_max_ms":
            ok = isinstance(val, (int, float)) and not isinstance(val, bool) and val >= 0
        else:
            ok = (val == "predicted" and key in _PREDICTABLE) or (isinstance(val, int) and not isinstance(val, bool) and val >= 0)
        if not ok:
            also = ' or "predicted"' if key in _PREDICTABLE else ""
            raise BudgetError(f"{where}.{key}: expected a number >= 0{also}, got {val!r}")
    return budget


def _limit_mb(arm: Arm, kind: str) -> float | None:
    return arm.memory_max_mb if kind == "max" else arm.memory_high_mb


def predict(peak_mb: float | None, limit_mb: float | None) -> bool | None:
    """True: the step must cross the limit; False: it must not; None: too close to call."""
    if limit_mb is None:
        return False
    if peak_mb is None:
        return None
    margin = max(MARGIN_MB, MARGIN_FRACTION * limit_mb)
    if peak_mb > limit_mb + margin:
        return True
    if peak_mb < limit_mb - margin:
        return False
    return None


def check(records: list[dict], budget: dict, arm: Arm) -> list[Violation]:
    """Every way the records break the budget (empty: within budget)."""
    out: list[Violation] = []
    if not records:
        return out
    trace_id = records[0]["trace_id"]
    for key, kind, counter in (("oom_kills", "max", "oom_kills"), ("mem_high_events", "high", "mem_high_events"),
                               ("throttles", "high", "throttles"), ("policy_kills", None, "policy_kills")):
        want = budget.get(key)
        if want is None:
            continue
        if want == "predicted":
            limit = _limit_mb(arm, kind)
            for r in records:
                expect = predict(r.get("replayed_peak_mb"), limit)
                if counter == "throttles" and r.get("priority") != "low":
                    expect = False            # the policy throttles only low-priority steps
                if expect is None or not r["executed"]:
                    continue
                got = r[counter]
                if expect and got < 1:
                    out.append(Violation(trace_id, r["step_id"], counter, got,
                                         f">= 1 (replayed peak {r['replayed_peak_mb']:g} MiB > {kind} limit {limit:g} MiB)"))
                elif not expect and got > 0:
                    peak = r.get("replayed_peak_mb")
                    why = (f"{r.get('priority')} priority" if counter == "throttles" and r.get("priority") != "low"
                           else f"no {kind} limit" if limit is None
                           else f"replayed peak {peak if peak is not None else 0:g} MiB < {kind} limit {limit:g} MiB")
                    out.append(Violation(trace_id, r["step_id"], counter, got, f"0 ({why})"))
        else:
            total = sum(r.get(counter, 0) for r in records)
            if total > want:
                worst = max(records, key=lambda r: r.get(counter, 0))
                out.append(Violation(trace_id, worst["step_id"] if worst.get(counter) else None, counter, total,
                                     f"<= {want} for the trace"))
    # a step's overhead: its wall time beyond the duration the replay was asked to last. A real
    # command its trace gives no duration has none: its wall time is its own (under emulate such a
    # step is asked to last 0 ms, and all its wall time is overhead)
    ran = [r for r in records if r["executed"] and r["latency_ms"] is not None
           and (r.get("replayed_duration_ms") is not None or r.get("executor") not in REAL_EXECUTORS)]
    overhead = lambda r: r["latency_ms"] - (r.get("replayed_duration_ms") or 0.0)   # noqa: E731
    worst = max(ran, key=overhead, default=None)
    if "latency_overhead_max_ms" in budget and worst is not None:
        if overhead(worst) > budget["latency_overhead_max_ms"]:
            out.append(Violation(trace_id, worst["step_id"], "latency_overhead_ms", round(overhead(worst), 1),
                                 f"<= {budget['latency_overhead_max_ms']} ms (latency_overhead_max_ms)"))
    if "latency_overhead_p95_ms" in budget:
        # a real command's wall time beside another run's recording of it differs by its own
        # run-to-run noise (a cold import: hundreds of ms), not by the harness: only the worst step
        # (a step parked for good) is held to a budget there
        emulated = [r for r in ran if not r["oom_kills"] and r.get("executor") not in REAL_EXECUTORS]
        p95 = percentile([overhead(r) for r in emulated], 95)
        if p95 is not None and p95 > budget["latency_overhead_p95_ms"]:
            out.append(Violation(trace_id, worst["step_id"], "latency_overhead_p95_ms", round(p95, 1),
                                 f"<= {budget['latency_overhead_p95_ms']} ms"))
    if "mem_stall_max_ms" in budget:
        stalled = max((r for r in records if r.get("mem_stall_ms") is not None), key=lambda r: r["mem_stall_ms"], default=None)
        if stalled is not None and stalled["mem_stall_ms"] > budget["mem_stall_max_ms"]:
            out.append(Violation(trace_id, stalled["step_id"], "mem_stall_ms", stalled["mem_stall_ms"],
                                 f"<= {budget['mem_stall_max_ms']} ms (mem_stall_max_ms: the step waited for memory"
                                 + (", then timed out" if stalled.get("timed_out") else "") + ")"))
    return out


def _explained(r: dict) -> str | None:
    """What accounts for a step's abnormal end, if anything the run counted does."""
    if r.get("oom_kills", 0) > 0:
        return "OOM kill"
    if r.get("timed_out"):
        return "timeout"
    if r.get("policy_kills", 0) > 0:
        return "policy kill"
    return None


def harness_failures(records: list[dict], executor: str) -> list[str]:
    """Steps that did not run as the replay asked, whatever the arm's budget says; each line names
    trace, step and what happened. Empty: every step ran as asked.

    * a step that could not be started (its record has `error`), under every executor;
    * `emulate`: the emulator is ours and exits 0 when it has reproduced the profile, so a non-zero
      exit or a signal fails unless an OOM kill the kernel counted, the step's timeout or a kill by
      the policy controller explains it;
    * `sandbox`/`docker`: a real command's own exit status is the command's outcome (a trace's
      failing `pytest` fails again), not the harness's, so only a step that could not start fails.
    """
    out = []
    for r in records:
        where = f"{r['trace_id']} step {r['step_id']} ({r.get('tool')}: {str(r.get('cmd'))[:80]!r})"
        if r.get("error"):
            out.append(f"{where}: could not be started: {r['error']}")
        elif executor == "emulate" and r.get("executed") and (r.get("exit_code") or r.get("signal")) \
                and _explained(r) is None:
            how = f"signal {r['signal']}" if r.get("signal") else f"exit code {r['exit_code']}"
            out.append(f"{where}: the emulator ended with {how}, and no OOM kill, timeout or policy kill "
                       "was counted that would explain it")
    return out
