"""Run-vs-run comparison: do two runs agree, test by test (trace × arm × seed × params), within a
tolerance per metric? The reproducibility check of a seed: run twice, compare.

This is the comparison core (metrics/compare.py) on two run directories: the rules, their syntax
(docs/gate.md, "Tolerances"), the metrics and their directions (metrics/registry.py) and the treatment of
a test in one run only are the core's, shared with the regression gate. By default every difference
beyond tolerance counts, and a test in one run only (a reproducibility check); `only_worse` counts
only the worse direction, exactly as the gate does (a regression check). Needs no pandas: the runs
are read with frames.load's checks, but not as DataFrames.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..metrics import compare as core
from ..metrics import gate
from ..metrics.registry import REGISTRY
from .frames import ResultsError, load


@dataclass(frozen=True)
class Difference:
    """One row of the core's comparison, named for A (the base) and B (the new run)."""
    row: core.Row

    key = property(lambda self: core.describe_key(self.row.key))
    metric = property(lambda self: self.row.metric)     # a metric name, or "test" for a test in one run only
    a = property(lambda self: self.row.base)
    b = property(lambda self: self.row.new)
    delta = property(lambda self: self.row.delta)
    allowed = property(lambda self: self.row.allowed)
    verdict = property(lambda self: self.row.verdict)
    beyond = property(lambda self: self.row.counts)     # counted: the check fails on it
    rule = property(lambda self: self.row.rule)


@dataclass
class Comparison:
    a: Path
    b: Path
    rules: list[core.Rule]
    only_worse: bool = False
    tests: int = 0                                     # tests present on both sides
    differences: list[Difference] = field(default_factory=list)   # every row that is not `same`

    @property
    def beyond(self) -> list[Difference]:
        return [d for d in self.differences if d.beyond]

    def format(self, show_all: bool = False) -> str:
        rows = [d for d in self.differences if show_all or d.beyond]
        heads = ["experiment", "trace", "arm", "seed", "params", "metric", "A", "B", "Δ", "allowed", "verdict"]
        cells = []
        for d in rows:
            k = d.row.key
            m = REGISTRY.get(d.metric)
            cells.append([k[0] or "-", k[2], k[1], str(k[3]), "-" if k[4] == "{}" else k[4],
                          d.metric + (f" ({m.unit}, {m.provenance})" if m else ""),
                          _num(d.a), _num(d.b), _num(d.delta, sign=True),
                          _num(d.allowed, prefix="+" if self.only_worse else "±"), d.verdict])
        lines = [f"A = {self.a}", f"B = {self.b}"]
        if cells:
            widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
            lines += ["  ".join(h.ljust(w) for h, w in zip(heads, widths)),
                      "  ".join("-" * w for w in widths),
                      *("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells)]
        within = len(self.differences) - len(self.beyond)
        lines.append(f"{self.tests} test(s) in both; {len(self.beyond)} difference(s) beyond tolerance"
                     + (" in the worse direction" if self.only_worse else "")
                     + (f", {within} within or not counted" if within else "")
                     + "; rules: " + ",".join(str(r) for r in self.rules))
        return "\n".join(lines)


def _num(x, sign: bool = False, prefix: str = "") -> str:
    if x is None:
        return "-"
    s = f"{x:+.3g}" if sign else f"{x:.6g}"
    return prefix + s


def compare(a: str | Path, b: str | Path, rules: str | list | None = None, only_worse: bool = False) -> Comparison:
    """Compare run B against run A, test by test (either may also be a baseline file, as the gate
    reads it). `rules` is rule text (docs/gate.md, "Tolerances") or
    parsed rules; None takes the core's defaults for the check (every metric with a default
    tolerance; with `only_worse`, the gate's). Raises ResultsError on unreadable input and
    metrics.compare.RuleError (a ValueError) on a bad rule."""
    if rules is None:
        rules = core.default_rules(worse_only=only_worse)
    if not isinstance(rules, list) or not all(isinstance(r, core.Rule) for r in rules):
        rules = core.parse_rules(rules)
    values = []
    for d in (a, b):
        if Path(d).is_file():                  # a baseline file or benchmark JSON, as the gate reads it
            try:
                values.append(gate.load(d))
            except gate.GateError as exc:
                raise ResultsError(str(exc)) from None
            continue
        records = load(d).records
        if not records:
            raise ResultsError(f"{d}: no step records")
        values.append(core.test_values(records))
    c = core.compare_tests(values[0], values[1], rules, worse_only=only_worse)
    return Comparison(Path(a), Path(b), rules, only_worse, c.tests,
                      [Difference(r) for r in c.rows if r.verdict != "same"])
