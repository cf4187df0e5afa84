"""What an agent is told when one of its tool calls was stopped: one short, factual sentence, the
same wherever a stop is worded (the live runtime's note appended to the call's output, live/; the
replay's reason for a step its arm killed, metrics/faithfulness.py).

    stopped: this tool call was killed at its 512 MiB memory limit (it had used 512 MiB); the rest
    of the session is unaffected

A bare exit 137 says nothing an agent can act on; the note says what stopped the call, at which
limit, and that the session itself goes on, so the next call can do less at once.

May import: nothing of the package.
"""
from __future__ import annotations

CAUSES = ("memory", "policy", "timeout")
UNAFFECTED = "the rest of the session is unaffected"
STALL_SAID_MS = 100                  # a shorter stall is not what ran a call into its timeout


def _mib(value: float) -> str:
    return f"{value:.0f} MiB"


def stopped_note(cause: str, *, limit_mb: float | None = None, used_mb: float | None = None,
                 scope: str = "step", timeout_s: float | None = None, stall_ms: float | None = None,
                 held: int = 0, background: int = 0) -> str:
    """The note for a call stopped by `cause` (CAUSES): `memory` (killed at its memory limit, the
    kernel's OOM kill), `policy` (the arm's policy killed it after holding it at its soft limit),
    `timeout` (ran past its timeout). `limit_mb`: the limit it hit (None: not known to the caller);
    `used_mb`: its memory peak; `scope` "trace": the limit is the session's, shared by its calls;
    `stall_ms`: time it stalled on memory (PSI), which counted against its timeout (said from
    STALL_SAID_MS on); `held`: times it was held at a soft limit (throttled, frozen: its wall time
    went on, the kernel's stall count does not see a stopped task);
    `background`: processes it left running that were stopped with it."""
    if cause not in CAUSES:
        raise ValueError(f"unknown cause {cause!r}; expected one of {', '.join(CAUSES)}")
    used = f" (it had used {_mib(used_mb)})" if used_mb is not None else ""
    if cause == "memory":
        if scope == "trace":
            where = f"the session's {_mib(limit_mb)} memory limit" if limit_mb is not None else "the session's memory limit"
            text = f"stopped: this tool call was killed at {where}, shared by all its tool calls{used}"
            return text + _background(background)
        where = f"its {_mib(limit_mb)} memory limit" if limit_mb is not None else "its memory limit"
        text = f"stopped: this tool call was killed at {where}{used}"
    elif cause == "policy":
        where = f"its {_mib(limit_mb)} soft memory limit" if limit_mb is not None else "its soft memory limit"
        text = f"stopped: this tool call was held above {where} too long and killed{used}"
    else:
        after = f"its {timeout_s:g} s timeout" if timeout_s is not None else "its timeout"
        stalled = (f" ({stall_ms / 1000:.1f} s of it stalled at a memory limit)" if stall_ms and stall_ms >= STALL_SAID_MS
                   else f" (held at a memory limit {held} time{'s' if held != 1 else ''})" if held else "")
        text = f"stopped: this tool call ran past {after}{stalled} and was killed"
    return f"{text}; {UNAFFECTED}" + _background(background)


def _background(n: int) -> str:
    if not n:
        return ""
    return f"; {n} background process{'es' if n != 1 else ''} it left running {'were' if n != 1 else 'was'} stopped with it"


def background_note(n: int) -> str | None:
    """The note for a call that ended by itself but left `n` processes running (stopped at its end)."""
    if not n:
        return None
    return (f"note: {n} background process{'es' if n != 1 else ''} this tool call left running "
            f"{'were' if n != 1 else 'was'} stopped at its end (each tool call's processes end with it)")
