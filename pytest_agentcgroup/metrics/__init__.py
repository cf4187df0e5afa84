"""Metrics: the one metric type (unit, direction, provenance), step records, the metric registry,
the results store (runs never overwritten), the comparison core and the regression gate, the
benchmark JSON format, the emulator's fidelity against recorded steps.

May import: replay/ and cgroups/ (the fidelity runner), traces/. Never studies/, config, reports/
or the pytest side.
"""
