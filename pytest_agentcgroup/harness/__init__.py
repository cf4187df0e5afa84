"""The pytest side of the plugin, by role (plugin.py registers the hooks and fixtures):
settings.py, collect.py, fixtures.py, session.py, controller.py, state.py, experiment.py,
environment.py — see plugin.py.

May import everything below it (arms, traces/, proc, errors, replay/, tenants/, engines/, cgroups/, bpf/,
metrics/, studies/, config, reports.table). Imported only by plugin.py (and experiments, for `setting`).
"""
