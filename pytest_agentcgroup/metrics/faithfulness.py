"""How faithfully a replay of real commands followed its trace: each executed step's outcome beside
the one the trace recorded (traces/ir.py: the source's `recorded_outcome` and `recorded_output`, else,
in a trace whose source recorded none, the profile's `outcome`), a share of diverging steps per trace × arm, and the line the terminal
prints per trace.

Per step (metrics.jsonl, sandbox and docker executors, steps whose trace recorded an outcome):

    recorded_exit, replayed_exit   the exit codes (null where there is none: an edit, a signal)
    against                        "source" (the trajectory's record: faithfulness) or "profile"
                                   (this machine's own profiling run: reproducibility, not faithfulness)
    diverged                       true | false | null (null: not compared, `divergence` says why)
    divergence                     why it diverged, or why it is not counted
    recorded_head, replayed_head   the first non-empty line of each output (at most 200 characters)

The recorded outcome is the one rule's (metrics/source_faithfulness.py `recorded_outcome`: the
source's, and for mini-swe-agent's submit step its recorded diff as an ok exit 0).
A step diverges when it could not be started, was killed by a signal nobody counted, or ended
otherwise than recorded: another exit code for a command; for an edit (no exit code), applied where
the trajectory's failed or the other way round. Not counted (diverged null): a step the arm killed
on purpose — an OOM kill the kernel counted, a kill by the policy controller — and a step the
trajectory itself recorded as cut short (timeout, oom, error): there is no outcome to compare with.
The share is diverged / compared (steps with diverged true or false); a trace × arm whose share is
above `max_divergence` fails, naming its first diverging step.

The emulate executor runs no recorded command (its exit is the emulator's): nothing is compared there.
A trace whose source recorded no outcome is compared with its profile's: that is this machine's own
earlier run, so the lines and failures say reproducibility, not faithfulness. The faithfulness rule
for stored traces (durations, output, unknown steps, verdicts) is metrics/source_faithfulness.py.
"""
from __future__ import annotations

from ..notes import stopped_note
from ..traces.ir import Step
from .source_faithfulness import recorded_outcome as source_outcome

REAL_EXECUTORS = ("sandbox", "docker")
HEAD_CHARS = 200
MIB = 1024 * 1024
#: The share of compared steps that may diverge before a trace × arm fails (config `max_divergence`).
#: 0.2: a faithful replay runs at least 80 % of its compared steps as the trajectory recorded them.
DEFAULT_MAX_DIVERGENCE = 0.2


def first_line(text: str | None) -> str | None:
    """The first non-empty line of `text`, stripped and cut to HEAD_CHARS; None when there is none.
    A Python traceback's first line says nothing: its last line in the head (the exception) follows it."""
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    if not lines:
        return None
    line = lines[0]
    if line == "Traceback (most recent call last):" and len(lines) > 1 and not lines[-1].startswith("File "):
        line = f"{line} ... {lines[-1]}"
    return line[:HEAD_CHARS - 3] + "..." if len(line) > HEAD_CHARS else line


def arm_kill(result) -> str | None:
    """What the arm did to the step on purpose, if anything: an OOM kill or a policy kill, worded as
    the live runtime tells an agent (notes.py). A timeout is not the arm's: a step that hangs here
    (a download with no network) and ended as recorded there diverged."""
    c = result.counters
    peak = c.get("peak_bytes")
    used = peak / MIB if peak else None
    if c.get("oom_kills", 0) > 0:
        return stopped_note("memory", used_mb=used)
    if c.get("policy_kills", 0) > 0:
        return stopped_note("policy", used_mb=used)
    return None


def step_fields(result, step: Step, executor: str, *, source_recorded: bool = False) -> dict:
    """The faithfulness fields of one step's record (module docstring; `result` is a replay
    StepResult, read by its fields); {} when there is nothing to compare (the emulate executor, no
    recorded outcome, a step that executes nothing here). `source_recorded`: the trace's source
    recorded outcomes, so one of its steps without one is not compared with its profile's (that is
    this machine's run, not the trajectory's)."""
    told = source_outcome(step)
    rec = told or (None if source_recorded else step.outcome)
    if executor not in REAL_EXECUTORS or rec is None or not (result.executed or result.error):
        return {}
    out = {"recorded_exit": rec.exit_code, "replayed_exit": result.exit_code,
           "against": "source" if told else "profile",
           "recorded_head": first_line(step.recorded_output if told else None),
           "replayed_head": first_line(result.output)}
    killed = arm_kill(result)
    if killed:
        return {**out, "diverged": None, "divergence": f"not counted: {killed}"}
    if rec.status not in ("ok", "failed"):
        return {**out, "diverged": None, "divergence": f"not compared: the trace recorded it as {rec.status}"}
    why = _divergence(result, step, rec.status, rec.exit_code)
    return {**out, "diverged": why is not None, **({"divergence": why} if why else {})}


def _divergence(result, step: Step, status: str, code: int | None) -> str | None:
    said = f"exit {code}" if code is not None else status
    if result.error:
        return f"could not be started ({result.error}); recorded {said}"
    if result.timed_out:
        return f"killed at its timeout; recorded {said}"
    if result.signal:
        return f"killed by signal {result.signal}; recorded {said}"
    if step.tool == "edit" or code is None:
        applied = result.exit_code == 0
        if applied == (status == "ok"):
            return None
        what = "the edit" if step.tool == "edit" else "the step"
        return f"{what} {'applied' if applied else 'did not apply'} (exit {result.exit_code}); recorded {status}"
    if result.exit_code != code:
        return f"exit {result.exit_code}; recorded exit {code}"
    return None


def tally(records: list[dict]) -> tuple[int, int, int, dict | None]:
    """(compared, diverged, not counted, first diverging record or None) over `records`."""
    compared = [r for r in records if r.get("diverged") is not None]
    bad = [r for r in compared if r["diverged"]]
    skipped = sum(1 for r in records if "diverged" in r and r["diverged"] is None)
    return len(compared), len(bad), skipped, (bad[0] if bad else None)


def _reproducibility(records: list[dict]) -> bool:
    """Were these records compared with this machine's profiling run rather than the source's record?"""
    return any(r.get("against") == "profile" for r in records)


def describe_step(r: dict) -> str:
    """`step 7 (bash: 'python -m pytest --version'): exit 127; recorded exit 0` and both first lines."""
    cmd = str(r.get("cmd"))
    cmd = cmd if len(cmd) <= 80 else cmd[:77] + "..."
    return (f"step {r['step_id']} ({r.get('tool')}: {cmd!r}): {r.get('divergence')}\n"
            f"    recorded: {r.get('recorded_head') or '(no output)'}\n"
            f"    replayed: {r.get('replayed_head') or '(no output)'}")


def failure(records: list[dict], max_share: float) -> str | None:
    """Why this trace × arm's replay is not faithful enough (its diverging share above `max_share`),
    naming the first diverging step with both outputs' first lines; None when it is."""
    compared, diverged, _, first = tally(records)
    if not compared or diverged / compared <= max_share:
        return None
    return (f"{records[0]['trace_id']}: {diverged} of {compared} compared steps diverged from "
            f"{'its profiling run here (reproducibility)' if _reproducibility(records) else 'the trace'} "
            f"({diverged / compared:.0%}, more than max_divergence {max_share:.0%}); the first:\n  "
            + describe_step(first))


def summary_lines(records: list[dict]) -> list[str]:
    """A line per experiment × arm × trace whose records compared anything: how faithful it was."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if "diverged" in r:
            groups.setdefault((r.get("experiment"), r.get("config"), r["trace_id"]), []).append(r)
    lines = []
    for (exp, arm, trace_id), rs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        compared, diverged, skipped, first = tally(rs)
        share = f"{(compared - diverged) / compared:.0%}" if compared else "-"
        as_what = ("as in its profiling run here (reproducibility, not faithfulness)" if _reproducibility(rs)
                   else "as recorded")
        line = (f"{exp}  {arm}  {trace_id}: {compared - diverged}/{compared} compared steps {as_what} ({share})"
                + (f", {skipped} not counted" if skipped else ""))
        ws = next((r["workspace"] for r in rs if r.get("workspace")), None)
        if ws:
            line += f"; workspace {ws}"
        if first is not None:
            line += f"; first divergence: step {first['step_id']}: {first.get('divergence')}"
        lines.append(line)
    return lines
