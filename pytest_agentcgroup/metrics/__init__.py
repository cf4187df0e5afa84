"""Metrics: the one metric type (unit, direction, provenance), step records, the metric registry,
the results store (runs never overwritten), the comparison core and the regression gate, the
benchmark JSON format, the emulator's fidelity against recorded steps.

May import: traces/ (the IR). Never replay/ or cgroups/ (the metric core reads what they produce:
profile/ and the pytest side run them), nor studies/, config, reports/ or the pytest side.
"""
