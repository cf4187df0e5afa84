"""Procedures: what each kind of study does when its test runs, one module or package per kind,
named as the kind (`kind = "timescale"` in the experiment's config table runs timescale/). The
declarations they run against — settings tables, the metrics claims read — are studies/'s, checked
when the config loads; the checkout's experiments/test_*.py are each a marker, one call of the
`agentcgroup_study` fixture (study.py: the experiment's kind picks its procedure) and the assertion
(outcome.py).

    timescale/     controllers against the same memory burst (bursts, controllers, the printed table,
                   and the burst worker and sleep probe: programs of their own, started by path)
    multitenant/   three tenants at once, one test per arm (tenants, table)
    density/       agents under one memory budget: the K ramp and AgentCgroup's set-up (agents,
                   ramp, replication)
    fidelity.py    the emulator against the recorded-here corpus

May import: everything below the entry points (the harness included); only plugin.py imports
procedures/ (the fixture).
"""
