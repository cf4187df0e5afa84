"""Studies: what a study (a config file: docs/configuration.md) declares for each experiment, as
data checked when the config loads — its settings tables (exp2: timescale.py, exp3:
multitenant.py, exp5: density.py; tables.py checks their keys), the metrics its claims read, its
claims (claims.py: the one claim language), its budgets (budgets.py) and which experiment has
which of these (kinds.py). config.py reads them; the experiments' tests (the checkout's
experiments/) and the pytest side check runs against them.

Not named experiments: the checkout's experiments/ holds the experiments' pytest files, and
harness/experiment.py their pytest side.

May import: arms, metrics/ (records, registry, compare: the metric core). Never config, reports/
or the pytest side.
"""
