"""The numbers of the trace IR: one rule per key, wherever the key sits in a step (the step, its
profile, its curve's lists, its `original`, its args, its outcome). ir.py applies them on every way
in (parsing JSON and check_trace on objects alike) and names file, step and field; this module only
says what each quantity may be. The upper bounds say what cannot be, so that a trace that validates
is one the replay takes: a step's time at most the emulator's own limit (replay/emulator.c MAX_MS),
what it writes likewise (MAX_BYTES); its memory at most what any machine can address. Whether a step
fits THIS host's memory is asked when a replay starts (harness/fixtures.py).

Imports nothing from the package.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

PROFILE_FIELDS = ("peak_mb", "ramp_ms", "cpu_ms", "io_bytes")          # the Measures of a Profile
MIB = 1 << 20
#: 2^52 bytes (4 PiB) in MiB: x86-64's architectural physical address width is 52 bits (so is
#: arm64's with LPA), so no machine of either can hold more memory than this; a larger peak is a
#: corrupt or mis-scaled figure (a byte count read as MiB, say), not a workload.
MAX_MEMORY_MB = float((1 << 52) // MIB)
#: 1e9 ms (11.6 days): no tool call runs for days (agents' tool timeouts are minutes; the longest step
#: of the shipped corpus is under 3 minutes), and the emulator refuses longer times (emulator.c MAX_MS).
MAX_TIME_MS = 1e9
#: 2^46 bytes (64 TiB): more than one tool call writes, and the emulator's own limit (emulator.c MAX_BYTES).
MAX_IO_BYTES = float(1 << 46)


@dataclass(frozen=True)
class NumberRule:
    """What one number of the IR may be: >= least and <= most (with `why` the upper bound holds)."""
    unit: str
    most: float = math.inf
    why: str = ""
    least: float = 0.0
    integer: bool = False
    nullable: bool = False          # null allowed (where the key may be present without a value)

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        unit = f" {self.unit}" if self.unit else ""
        top = f", at most {self.most:.10g}{unit} ({self.why})" if math.isfinite(self.most) else ""
        return f"{kind} >= {self.least:g}{top}"


_TIME = NumberRule("ms", MAX_TIME_MS, "11.6 days: no tool call lasts that long, and the emulator replays "
                   "nothing longer")
_MEMORY = NumberRule("MiB", MAX_MEMORY_MB, "4 PiB, x86-64's 52-bit physical address limit: more than any "
                     "machine can hold")
_IO = NumberRule("bytes", MAX_IO_BYTES, "64 TiB: more than a tool call writes, and the emulator's limit")

#: key -> its rule: every quantity of the IR. `t_ms` and `mb` are a curve's lists (each item checked).
#: (step_id is a name, not a quantity: any int, unique in its trace.)
NUMBERS: dict[str, NumberRule] = {
    "duration_ms": _TIME, "ramp_ms": _TIME, "cpu_ms": _TIME, "t_ms": _TIME, "timeout_ms": _TIME,
    "peak_mb": _MEMORY, "mb": _MEMORY,
    "io_bytes": _IO,
    "exit_code": NumberRule("", 255, "an exit status is 8 bits (wait(2)); a signal is 128 + its number, or "
                            "minus it as Python's subprocess reports it", least=-255, integer=True, nullable=True),
}


def number_problem(value: Any, key: str) -> str | None:
    """What is wrong with `value` as NUMBERS[key], or None when it follows the rule."""
    rule = NUMBERS[key]
    if value is None and rule.nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int if rule.integer else (int, float)):
        types = ("int" if rule.integer else "int or float") + (" or null" if rule.nullable else "")
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        return f"expected {types}, got {type(value).__name__} {shown}: {key} is {rule.describe()}"
    unit = f" {rule.unit}" if rule.unit else ""
    if not math.isfinite(value) or value < rule.least:
        return f"{value!r}{unit} cannot be: {key} is {rule.describe()}"
    if value > rule.most:
        return f"{value:.6g}{unit} cannot be: {key} is at most {rule.most:.10g}{unit} ({rule.why})"
    return None


def step_numbers(st) -> Iterator[tuple[str, str, Any, int | None]]:
    """(NUMBERS key, field, value, list item or None) of every number an ir.Step holds: what
    ir.check_trace checks, by the same rules ir.parse_step applies to the JSON."""
    if isinstance(st.args, dict) and st.args.get("timeout_ms") is not None:
        yield "timeout_ms", "args.timeout_ms", st.args["timeout_ms"], None
    if st.duration_ms is not None:
        yield "duration_ms", "duration_ms.value", st.duration_ms.value, None
    profiles = [("profile", st.profile)]
    if st.original is not None:
        if st.original.duration_ms is not None:
            yield "duration_ms", "original.duration_ms.value", st.original.duration_ms.value, None
        profiles.append(("original.profile", st.original.profile))
    for name, p in profiles:
        for k in PROFILE_FIELDS:
            if getattr(p, k) is not None:
                yield k, f"{name}.{k}.value", getattr(p, k).value, None
        if p.curve is not None:
            for key in ("t_ms", "mb"):
                for j, v in enumerate(getattr(p.curve, key)):
                    yield key, f"{name}.curve.{key}", v, j
    if st.outcome is not None:
        yield "exit_code", "outcome.exit_code", st.outcome.exit_code, None
    if st.recorded_outcome is not None:
        yield "exit_code", "recorded_outcome.exit_code", st.recorded_outcome.exit_code, None
