"""What a study's procedure that runs its arms itself (procedures/: timescale, density; multitenant
through `agentcgroup_arm`) asks of the harness: its settings from the config (a skip naming the
missing section), the arms this session selected, and the outcome of its claims.

May import: config, studies (claims) and the harness's collect, controller and state.
"""
from __future__ import annotations

import pytest

from .. import config as cfgmod
from ..studies import claims as claimlang
from .collect import missing, selected_arms
from .controller import FIGURES
from .state import STATE


def experiment(config: pytest.Config, name: str) -> tuple[cfgmod.Config, cfgmod.Experiment]:
    """The loaded config and its experiment `name`; skips when the config has no such experiment."""
    conf = config.stash[STATE].load_config(config)
    if name not in conf.experiments:
        pytest.skip(missing(conf, name))
    return conf, conf.experiments[name]


def arms(request: pytest.FixtureRequest, conf: cfgmod.Config, exp: cfgmod.Experiment) -> list[str]:
    """The experiment's arms this session runs (--agentcgroup-arms, the marker's arms=, ini), in the
    experiment's order then the selection's; skips when the selection leaves none."""
    chosen, why = selected_arms(request.config, conf, exp, request.node.get_closest_marker("experiment"))
    if why:
        pytest.skip(why)
    return [a for a in exp.arms if a in chosen] + [a for a in chosen if a not in exp.arms]


def not_run(exp: cfgmod.Experiment, ran, skipped: dict[str, str] | None = None, arms=None) -> dict[str, str]:
    """arm -> why it has no figures: skipped in the test (its reason), or not selected. `arms`:
    the arms the test runs (the experiment's when None)."""
    skipped = skipped or {}
    return {a: (f"skipped: {skipped[a]}" if a in skipped else "not selected (--agentcgroup-arms)")
            for a in (exp.arms if arms is None else arms) if a not in ran or a in skipped}


def publish(request: pytest.FixtureRequest, figures: dict) -> None:
    """One arm's claim figures (metric -> number or None), put on the test's report for the claims
    comparing arms that the controller checks at the end of the session (a multitenant study)."""
    request.node.user_properties.append((FIGURES, figures))


def outcome(verdicts: list[claimlang.Verdict], title: str, problems=()) -> None:
    """A test's end: a refuted (or unmeasured) claim, or another problem, fails it with every claim,
    its values and its verdict; else a claim not checked skips it (not checked is never a pass)."""
    lines = [str(v) for v in verdicts]
    if problems or any(v.fails for v in verdicts):
        pytest.fail(f"{title}:\n  " + "\n  ".join([*problems, *lines]), pytrace=False)
    unchecked = [str(v) for v in verdicts if v.state == claimlang.NOT_CHECKED]
    if unchecked:
        pytest.skip(f"{title}: {len(unchecked)} claim(s) not checked: " + "; ".join(unchecked))
