"""The experiment configuration file (TOML): defaults, arms and experiments with their budgets.

    traces = "../traces"                 # the corpus, relative to this file
    [defaults]
    executor = "emulate"                 # emulate | sandbox
    time_scale = 0.05                    # replay 20x faster than recorded
    step_timeout_s = 120

    [arms.<name>]                        # see cgroups/arms.py; policy arms: bpf/controller.py
    [experiments.<name>]
    description = "..."
    subset = "smoke"                     # a manifest subset, or comma-separated trace ids
    arms = ["unlimited", "static-toolcall"]
    time_scale = 0.05                    # overrides [defaults]
    [experiments.<name>.budgets.<arm>]   # see metrics/budgets.py
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .bpf.controller import Rules
from .cgroups.arms import Arm, ArmError
from .metrics.budgets import BudgetError, validate

DEFAULTS = {"executor": "emulate", "time_scale": 1.0, "step_timeout_s": 120.0}


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    subset: str
    arms: tuple[str, ...]
    settings: dict                      # executor, time_scale, step_timeout_s (file-level values)
    budgets: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    path: Path
    traces: Path
    arms: dict[str, Arm]
    experiments: dict[str, Experiment]


def load(path: str | Path) -> Config:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such configuration file (set --agentcgroup-config)") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return _parse(raw, path)
    except (ArmError, BudgetError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _parse(raw: dict, path: Path) -> Config:
    unknown = set(raw) - {"traces", "defaults", "arms", "experiments"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    defaults = dict(DEFAULTS)
    for key, val in (raw.get("defaults") or {}).items():
        if key not in DEFAULTS:
            raise ConfigError(f"{path}: defaults.{key}: unknown; expected one of {', '.join(DEFAULTS)}")
        defaults[key] = val
    arms = {name: Arm.from_dict(name, spec) for name, spec in (raw.get("arms") or {}).items()}
    for arm in arms.values():
        if arm.policy is not None:
            Rules.from_arm(arm)          # a bad rule is a config error now, not a failure mid-run
    experiments = {}
    for name, spec in (raw.get("experiments") or {}).items():
        where = f"experiments.{name}"
        extra = set(spec) - {"description", "subset", "arms", "budgets", *DEFAULTS}
        if extra:
            raise ConfigError(f"{path}: {where}: unknown key(s) {', '.join(sorted(extra))}")
        arm_names = tuple(spec.get("arms") or arms)
        for a in arm_names:
            if a not in arms:
                raise ConfigError(f"{path}: {where}.arms: no arm named {a!r} (defined: {', '.join(arms)})")
        budgets = {}
        for arm, budget in (spec.get("budgets") or {}).items():
            if arm not in arms:
                raise ConfigError(f"{path}: {where}.budgets.{arm}: no arm of that name")
            budgets[arm] = validate(budget, f"{where}.budgets.{arm}")
        settings = {k: spec.get(k, defaults[k]) for k in DEFAULTS}
        experiments[name] = Experiment(name=name, description=spec.get("description", ""),
                                       subset=spec.get("subset", "smoke"), arms=arm_names,
                                       settings=settings, budgets=budgets)
    traces = (path.parent / raw.get("traces", "../traces")).resolve()
    return Config(path=path, traces=traces, arms=arms, experiments=experiments)
