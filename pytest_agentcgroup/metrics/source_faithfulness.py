"""The one faithfulness rule: did a step replayed here do the work its source recorded, and does a
trace pass. Pure: it reads IR steps (traces/ir.py), wherever they were replayed (`traces profile`
stores `outcome` and `duration_ms` with the profile; the source's own figures are
`recorded_outcome`, `recorded_output` and `original.duration_ms`).

A step replayed here (it has an `outcome`) is *faithful* when both hold:

(a) **exit** — it ended as the source recorded: the same exit code where the source records one;
    else the same status (ok / failed / timeout / oom / error); an edit or another tool the agent
    runtime performs counts as ok when applied here, failed when refused, against the runtime's
    own success or refusal. The submit step of mini-swe-agent (the command holds SUBMIT_MARKER)
    records no exit code, only the submission: a recorded output starting with "diff --git" is
    an ok exit 0 (git diff ran and printed the change).
(b) **work** — it did comparable work:
    - where the source records a duration (`original.duration_ms`, recorded or derived): the
      replayed duration <= factor x recorded + slack (default 3 x recorded + 1 s); only the upper
      bound: a step that ends sooner here is judged by (a);
    - else where the source records output and the step's `output` here is kept (`traces profile`
      keeps its head, OUTPUT_KEPT characters, beside a `recorded_output`):
      the outputs agree (`output_agrees`): for a submit step, the same files in `diff --git`
      lines and the same `@@` hunk headers, over the part both show; else, when both hold a
      pytest summary line (`=== 3 failed, 10 passed in 2.1s ===`), the same counts (warnings
      aside); else the same first non-empty line (both empty agree), compared with every number
      (decimal, or hex with a digit) read as one and blanks as one space (sizes, addresses and
      times differ by machine);
    - else (b) is not checked, and the step is judged by (a) alone (`unchecked`).

Three values, no guess: a step that breaks (a) or (b) is *unfaithful* (by each rule it breaks:
exit, duration, output); one whose source recorded no outcome and that breaks nothing is *unknown*
(counted apart, never faithful); the others are faithful. *Compared* = faithful + unfaithful.
A step not replayed here (no `outcome`: read, search, noop) is not counted at all.

A trace is *unverified* (never passing) with fewer than MIN_COMPARED compared steps or more unknown
than compared steps; else it *passes* when unfaithful / compared <= threshold (0.2), and *fails*
otherwise. A check of a replay against this machine's own earlier run (the profile's `outcome`)
is reproducibility, not faithfulness: metrics/faithfulness.py names it so where it prints one.

`RULE_VERSION` names this rule in what is stored (`source.faithfulness`, `stored`).

What experiments take (`left_out`, used by `traces sweep` and `traces select`): a trace whose
profile was measured here by replaying its commands (`source.profiled`) only when its stored
verdict, by this rule's version, is pass; a trace not replayed here (its profile is its source's
own: derived from 1 Hz samples, or synthetic) has no replay to judge and is taken as it is.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..traces.ir import Outcome, Step, Trace

RULE_VERSION = "faithful/1"
FACTOR = 3.0
SLACK_S = 1.0
THRESHOLD = 0.2
MIN_COMPARED = 5
#: what `traces profile` keeps of a step's output here (`output`) where its source recorded one
OUTPUT_KEPT = 1000
RULES = ("exit", "duration", "output")
VERDICTS = ("pass", "fail", "unverified")
#: why `left_out` leaves a trace out of an experiment's subsets
LEFT_OUT = ("unfaithful", "unverified")
SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT"
#: tools the agent runtime performs itself: judged by applied (ok) or refused (failed)
RUNTIME_TOOLS = ("edit", "read", "search", "browser")

_SUMMARY = re.compile(r"^=+ (.+?) in [0-9.]+ ?s(?: \([^)]*\))? =+$")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected|rerun)")
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)", re.M)
_HUNK = re.compile(r"^@@ [^@]* @@", re.M)


@dataclass(frozen=True)
class StepVerdict:
    step_id: int
    verdict: str                      # faithful | unfaithful | unknown
    broke: tuple[str, ...] = ()       # the RULES it broke
    unchecked: bool = False           # (b) not checked: no recorded duration, no comparable output
    why: str = ""


@dataclass(frozen=True)
class TraceVerdict:
    trace_id: str
    verdict: str                      # one of VERDICTS
    compared: int
    faithful: int
    unknown: int
    by_rule: dict[str, int]
    unchecked: int
    steps: tuple[StepVerdict, ...] = field(default=(), repr=False)
    why: str = ""

    @property
    def unfaithful(self) -> int:
        return self.compared - self.faithful

    def stored(self, factor: float = FACTOR, slack_s: float = SLACK_S, threshold: float = THRESHOLD) -> dict:
        """What `source.faithfulness` holds: the counts, the verdict and the rule that gave them."""
        return {"rule": RULE_VERSION, "factor": factor, "slack_s": slack_s, "threshold": threshold,
                "compared": self.compared, "faithful": self.faithful, "unknown": self.unknown,
                **{f"unfaithful_{r}": self.by_rule[r] for r in RULES}, "work_unchecked": self.unchecked,
                "verdict": self.verdict, **({"why": self.why} if self.why else {})}


def left_out(trace: Trace) -> str | None:
    """Why an experiment's subset leaves `trace` out (module docstring): "unfaithful" (profiled here,
    stored verdict fail), "unverified" (profiled here, stored verdict unverified, missing, or by
    another rule version, or none of its commands has a recorded outcome: then what passed was its
    edits, not its work); None when it is taken."""
    src = trace.source if isinstance(trace.source, dict) else {}
    if "profiled" not in src:
        return None
    stored = src.get("faithfulness")
    if not isinstance(stored, dict) or stored.get("rule") != RULE_VERSION:
        return "unverified"
    commands = [s for s in trace.steps if s.tool == "bash"]
    if commands and all(recorded_outcome(s) is None for s in commands):
        return "unverified"
    return {"pass": None, "fail": "unfaithful"}.get(stored.get("verdict"), "unverified")


def recorded_outcome(step: Step) -> Outcome | None:
    """How the source recorded the step to end: its `recorded_outcome`, or for a submit step whose
    recorded output is a diff, ok exit 0; None when the source does not show it."""
    if step.recorded_outcome is not None:
        return step.recorded_outcome
    if is_submit(step) and (step.recorded_output or "").startswith("diff --git"):
        return Outcome("ok", 0)
    return None


def is_submit(step: Step) -> bool:
    return SUBMIT_MARKER in str(step.args.get("command") or "")


def _said(o: Outcome) -> str:
    return f"exit {o.exit_code}" if o.exit_code is not None else o.status


def exit_agrees(step: Step, rec: Outcome, got: Outcome) -> bool:
    """(a): the same exit code where both have one, else the same status; a runtime tool by
    applied (ok) or refused (anything else)."""
    if step.tool in RUNTIME_TOOLS:
        return (got.status == "ok") == (rec.status == "ok")
    if rec.exit_code is not None and got.exit_code is not None:
        return rec.exit_code == got.exit_code
    return rec.status == got.status


def pytest_counts(text: str | None) -> dict[str, int] | None:
    """The counts of the last pytest summary line in `text` ({"passed": 3, "failed": 1}), or None."""
    lines = [x.strip() for x in (text or "").splitlines() if _SUMMARY.match(x.strip())]
    if not lines:
        return None
    body = _SUMMARY.match(lines[-1]).group(1)
    counts: dict[str, int] = {}
    for n, what in _COUNT.findall(body):
        key = "errors" if what.startswith("error") else what
        counts[key] = counts.get(key, 0) + int(n)
    return counts


def _first(text: str | None) -> str:
    line = next((x.strip() for x in (text or "").splitlines() if x.strip()), "")
    return re.sub(r"\s+", " ", re.sub(r"(0x)?[0-9a-f]*[0-9][0-9a-f]*", "N", line))


def output_agrees(step: Step, recorded: str, replayed: str) -> tuple[bool, str]:
    """(b) by output (module docstring): (agrees, which comparison and, when not, what differs)."""
    if is_submit(step) or recorded.startswith("diff --git"):
        a_files, b_files = _DIFF_FILE.findall(recorded), _DIFF_FILE.findall(replayed)
        a_hunks, b_hunks = _HUNK.findall(recorded), _HUNK.findall(replayed)
        n, m = min(len(a_files), len(b_files)), min(len(a_hunks), len(b_hunks))
        # the recorded output is a head: compare what both show, and a diff against none differs
        same = (bool(a_files) == bool(b_files) and a_files[:n] == b_files[:n] and a_hunks[:m] == b_hunks[:m])
        return same, ("diff: the same files and hunks" if same else
                      f"diff: recorded {len(a_files)} file(s) {len(a_hunks)} hunk(s), replayed {len(b_files)} "
                      f"file(s) {len(b_hunks)} hunk(s), differing")
    a, b = pytest_counts(recorded), pytest_counts(replayed)
    if a is not None and b is not None:
        return a == b, f"pytest counts: recorded {a}, replayed {b}"
    fa, fb = _first(recorded), _first(replayed)
    return fa == fb, f"first line: recorded {fa[:80]!r}, replayed {fb[:80]!r}"


def judge_step(step: Step, *, factor: float = FACTOR, slack_s: float = SLACK_S) -> StepVerdict | None:
    """The step's verdict by the rule (module docstring), None for a step not replayed here."""
    got = step.outcome
    if got is None:
        return None
    broke, why = [], []
    rec = recorded_outcome(step)
    if rec is not None and not exit_agrees(step, rec, got):
        broke.append("exit")
        if step.tool in RUNTIME_TOOLS:
            why.append(f"{'applied' if got.status == 'ok' else 'not applied'} here ({_said(got)}), "
                       f"{'applied' if rec.status == 'ok' else 'refused'} there")
        else:
            why.append(f"ended {_said(got)}, recorded {_said(rec)}")
    rec_ms = step.original.duration_ms if step.original is not None else None
    unchecked = False
    if rec_ms is not None and rec_ms.provenance != "synthetic":
        here = step.duration_ms.value if step.duration_ms is not None else 0.0
        bound = factor * rec_ms.value + slack_s * 1000.0
        if here > bound:
            broke.append("duration")
            why.append(f"ran {here / 1000:.1f} s, recorded {rec_ms.value / 1000:.1f} s (bound {bound / 1000:.1f} s)")
    elif step.recorded_output is not None and step.output is not None:
        same, how = output_agrees(step, step.recorded_output, step.output)
        if not same:
            broke.append("output")
            why.append(how)
    else:
        unchecked = True
    if broke:
        return StepVerdict(step.step_id, "unfaithful", tuple(broke), unchecked, "; ".join(why))
    if rec is None:
        return StepVerdict(step.step_id, "unknown", (), unchecked, "the source recorded no outcome")
    return StepVerdict(step.step_id, "faithful", (), unchecked)


def judge_trace(trace: Trace, *, factor: float = FACTOR, slack_s: float = SLACK_S,
                threshold: float = THRESHOLD) -> TraceVerdict:
    """The trace's verdict (module docstring)."""
    steps = tuple(v for s in trace.steps if (v := judge_step(s, factor=factor, slack_s=slack_s)))
    compared = [v for v in steps if v.verdict != "unknown"]
    faithful = sum(1 for v in compared if v.verdict == "faithful")
    unknown = len(steps) - len(compared)
    by_rule = {r: sum(1 for v in compared if r in v.broke) for r in RULES}
    unchecked = sum(1 for v in compared if v.unchecked)
    if not steps:
        verdict, why = "unverified", "no step replayed here (not profiled)"
    elif len(compared) < MIN_COMPARED:
        verdict, why = "unverified", f"{len(compared)} compared step(s), fewer than {MIN_COMPARED}"
    elif unknown > len(compared):
        verdict, why = "unverified", f"more unknown ({unknown}) than compared ({len(compared)}) steps"
    elif (len(compared) - faithful) / len(compared) > threshold:
        first = next(v for v in compared if v.verdict == "unfaithful")
        verdict, why = "fail", (f"{len(compared) - faithful} of {len(compared)} compared steps unfaithful, more than "
                                f"{threshold:.0%}; first: step {first.step_id}: {first.why}")
    else:
        verdict, why = "pass", ""
    return TraceVerdict(trace.trace_id, verdict, len(compared), faithful, unknown, by_rule, unchecked, steps, why)


def factor_shift(traces: list[Trace], factor: float, *, base: float = FACTOR, slack_s: float = SLACK_S,
                 threshold: float = THRESHOLD) -> dict:
    """How verdicts move when the duration factor is `factor` instead of `base`: steps and traces
    whose verdict changes, and the traces passing at `factor`."""
    steps = traces_changed = passing = 0
    for t in traces:
        a = judge_trace(t, factor=base, slack_s=slack_s, threshold=threshold)
        b = judge_trace(t, factor=factor, slack_s=slack_s, threshold=threshold)
        steps += sum(1 for x, y in zip(a.steps, b.steps) if x.verdict != y.verdict)
        traces_changed += a.verdict != b.verdict
        passing += b.verdict == "pass"
    return {"factor": factor, "steps_changed": steps, "traces_changed": traces_changed, "traces_passing": passing}
