"""Metrics: step records (each metric with unit, direction, provenance), the results store (runs
never overwritten), the regression gate, the benchmark JSON format, the environment snapshot.

May import: replay/ (StepResult), cgroups/, bpf/ (features), traces/, programs (git, for the
checkout's commit). Never studies/, config, reports/ or the pytest side.
"""
