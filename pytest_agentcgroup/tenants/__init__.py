"""Tenants: workloads that run beside a replayed trace rather than as its steps. The browser tenant
(browser.py) replays a Playwright trace in one process per tenant (browser_driver.py: Playwright and
chromium) against the shipped web app (webapp.py), inside the tenant's own cgroup.

May import: traces/, proc, errors, replay/ (StepResult). Never cgroups/ or anything above: a tenant
is handed where to run (a TenantPlace), as replay is handed a Placement.
"""
