"""Metrics: step records (each metric with unit, direction, provenance), the results store (runs
never overwritten), budgets, the regression gate, the benchmark JSON format, the environment snapshot.

May import: replay/ (StepResult), cgroups/, bpf/ (features), traces/, programs (git, for the
checkout's commit). Never config, reports/ or the pytest side.
"""
