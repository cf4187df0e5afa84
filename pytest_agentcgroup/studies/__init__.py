"""Studies: what a study (a config file: docs/configuration.md) declares for each experiment, as
data checked when the config loads — its settings tables (one module per kind of study: timescale.py,
multitenant.py, density.py; tables.py checks their keys), the metrics its claims read, its claims
(claims.py: the one claim language), its budgets (budgets.py) and which kind has which of these
(kinds.py, keyed by the experiment's `kind`). config.py reads them; the procedures (procedures/:
what each kind's test does) and the pytest side check runs against them.

Not named experiments: the checkout's experiments/ holds the experiments' pytest files.

May import: arms, metrics/ (records, registry, compare: the metric core). Never config, reports/
or the pytest side.
"""
