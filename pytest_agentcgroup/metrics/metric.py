"""The one metric type. Every number the project reports is declared once as a Metric, where the
number is made: per step and per config in records.py, per test in registry.py, per experiment
in its study's tables (studies/timescale.py, studies/multitenant.py, studies/density.py).

A Metric says the number's unit, which direction is better (`lower`, `higher`, or `none`: a
count or a parameter whose change is only a change, compared with `exact`), where it comes from
(`provenance`: `recorded` by the kernel or the wall clock in this run, `derived` from recorded
numbers, `synthetic`, `measured` by a benchmark, or `trace`: the trace's own input) and one line
of what it is read from or how it is computed (`source`). A number a test is compared by also has
its default tolerance (docs/gate.md, "Tolerances") and whether a regression check checks it when
no rules are given (registry.py).

May import: nothing of the package.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    better: str                  # lower | higher | none
    provenance: str              # recorded | derived | synthetic | measured | trace
    source: str                  # what it is read from, or how it is derived
    tolerance: str | None = None     # default tolerance; None: compared only when a rule names the metric
    regression: bool = False         # in the regression check's default rules

    def describe(self, value) -> dict:
        """The value with what it is, as results files carry it."""
        return {"value": value, "unit": self.unit, "better": self.better,
                "provenance": self.provenance, "source": self.source}
