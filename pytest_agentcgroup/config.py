"""The experiment configuration file (TOML): defaults, arms and experiments with their budgets.

    traces = "../traces"                 # the corpus, relative to this file
    [defaults]
    executor = "emulate"                 # emulate | sandbox | docker
    time_scale = 0.05                    # replay 20x faster than recorded
    step_timeout_s = 120
    max_divergence = 0.2                 # real commands: share of steps that may end otherwise than recorded
    workspace = "DIR"                    # real commands: the task's working copy (default: a provider's)

    [arms.<name>]                        # see arms.py; policy arms: bpf/controller.py
    [experiments.<name>]
    kind = "replay"                      # the kind of study (studies/kinds.py); replay is the default
    description = "..."
    subset = "smoke"                     # a manifest subset, or comma-separated subsets and trace ids
    arms = ["unlimited", "static-toolcall"]
    time_scale = 0.05                    # overrides [defaults]
    claims = ["agentcgroup.oom_kills < static-toolcall.oom_kills"]   # see studies/claims.py, studies/kinds.py
    [experiments.<name>.budgets.<arm>]   # see studies/budgets.py
    [experiments.<name>.matrix]          # optional sweep: every combination is a test per trace × arm
    seeds = [0, 1]                       # repetitions, recorded as `seed` (the emulator is deterministic)
    ablations = [{ name = "half-limit", arms = { static-toolcall = { memory_max_mb = 256 } } }]
    sizes = [{ name = "quick", time_scale = 0.02 }, { name = "dev", subset = "dev" }]

An ablation or size is a named set of overrides of the experiment: executor, time_scale,
step_timeout_s, subset, and `arms = { <arm> = { <arm key> = value } }`.

An experiment's `kind` says which study it is; `replay` (the default: a trace x arm experiment) is
described above. The others have tables of their own (timescale: burst, probe; multitenant:
tenants, probe; density: density, replication), checked at load by studies/kinds.py, and only the
keys their tests read (kinds.keys: no subset, budgets, matrix, ...); a timescale study's `arms` are
its controllers, and required; a fidelity study reads only its description.

May import: arms (arms and the policy's rules), studies/ (budgets, kinds, claims, tables),
traces.numbers (its memory bound). Read by reports/ and the pytest side.
"""
from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from .arms import Arm, ArmError, Rules
from .metrics.faithfulness import DEFAULT_MAX_DIVERGENCE
from .studies import kinds
from .studies.budgets import BudgetError, validate
from .studies.claims import Claim, ClaimError
from .studies.tables import TableError
from .traces.numbers import MAX_MEMORY_MB

DEFAULTS = {"executor": "emulate", "time_scale": 1.0, "step_timeout_s": 120.0,
            "max_divergence": DEFAULT_MAX_DIVERGENCE, "workspace": None}
MATRIX_AXES = ("ablations", "sizes")                # besides `seeds`; axis name in params: singular
OVERRIDE_KEYS = (*DEFAULTS, "subset", "arms")
EXPERIMENT_KEYS = ("description", "subset", "arms", "budgets", "matrix", "claims", *DEFAULTS)   # kind replay


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file and the key."""


EXECUTORS = ("emulate", "sandbox", "docker")          # replay.make_executor's names


@dataclass(frozen=True)
class Number:
    """What a number of the configuration may be: > least (strict) or >= least, at most `most`."""
    least: float = 0.0
    strict: bool = False
    most: float = math.inf
    integer: bool = False
    why: str = ""           # what the key is, said with a value below `least` or not a number
    cap: str = ""           # why nothing above `most` can be

    def problem(self, val) -> str | None:
        """What is wrong with `val` (None: nothing)."""
        why = f" ({self.why})" if self.why else ""
        if isinstance(val, bool) or not isinstance(val, int if self.integer else (int, float)) \
                or not (val > self.least if self.strict else val >= self.least):
            kind = "integer" if self.integer else "number"
            low = f"a positive {kind}" if self.strict and self.least == 0 else \
                f"{'an' if self.integer else 'a'} {kind} {'>' if self.strict else '>='} {self.least:g}"
            return f"expected {low}, got {val!r}{why}"
        if not math.isfinite(val):
            return f"{val} cannot be a setting; expected a finite number"
        if val > self.most:
            return f"{val!r} is above {self.most:.10g}, the most it can be ({self.cap})"
        return None


_CAP = "MiB: 4 PiB, x86-64's 52-bit physical address limit; no machine has more"
_MEMORY = Number(0, strict=True, most=MAX_MEMORY_MB, why="MiB", cap=_CAP)
_ROOM = Number(0, most=MAX_MEMORY_MB, why="MiB", cap=_CAP)
_HOLD = Number(0, why="ms of recorded time")

#: Every number of the file that has a rule, by its key, wherever the key sits: [defaults], an
#: experiment, a matrix point's overrides, an arm, an arm's rules, an ablation's arm overrides, an
#: experiment's own tables. check_numbers() applies them in one pass over the whole file before
#: anything else reads it, so an impossible value is one ConfigError naming the file and the key's
#: full path (not a failure in each test's setup); and every number of the file must be finite (TOML
#: has nan and inf, which no setting means). What a key needs beyond its range (a cpu_max string, a
#: high limit under the max) the parsers check: arms.py, metrics/.
NUMBERS: dict[str, Number] = {
    "time_scale": Number(0, strict=True, why="recorded durations are multiplied by it: 0 would replay every step "
                         "in no time, a negative one before it started"),
    "step_timeout_s": Number(0, strict=True, why="seconds a step may run before it is killed"),
    "max_divergence": Number(0, most=1, why="the share of a replay's compared steps that may end otherwise than "
                             "its trace recorded", cap="a share: 1 lets every step diverge"),
    "memory_max_mb": _MEMORY, "memory_high_mb": _MEMORY,
    "raise_step_mb": _ROOM, "raise_max_mb": _ROOM,
    "margin_mb": _ROOM,          # an arm's room above each step's limit (limit_from)
    "floor_mb": _ROOM, "cold_start_mb": _MEMORY, "oom_min_bump_mb": _ROOM,     # limit_from's knobs (arms.py)
    "pids_max": Number(1, integer=True, most=4194304, why="processes", cap="the kernel's PID_MAX_LIMIT on 64-bit"),
    "hold_ms": _HOLD, "freeze_hold_ms": _HOLD,
    "window_ms": Number(0, strict=True, why="the window throttles are counted in: an empty one counts none, so "
                        "freeze_after could never be reached"),
}


def check_numbers(raw, where: str = "") -> None:
    """ConfigError (without the file: load() adds it) for the first number of `raw` (the parsed TOML,
    walked whole) that is not finite or breaks its key's NUMBERS rule, naming the key's path."""
    items = raw.items() if isinstance(raw, dict) else enumerate(raw) if isinstance(raw, list) else ()
    for key, val in items:
        path = (f"{where}.{key}" if where else str(key)) if isinstance(raw, dict) else f"{where}[{key}]"
        if isinstance(val, (dict, list)):
            check_numbers(val, path)
            continue
        if isinstance(val, float) and not math.isfinite(val):
            raise ConfigError(f"{path}: {val} cannot be a setting; expected a finite number")
        rule = NUMBERS.get(key) if isinstance(raw, dict) else None
        if rule is None:
            continue
        problem = rule.problem(val)
        if problem:
            raise ConfigError(f"{path}: {problem}")


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    subset: str
    arms: tuple[str, ...]
    settings: dict                      # executor, time_scale, step_timeout_s (file-level values)
    budgets: dict[str, dict] = field(default_factory=dict)
    matrix: tuple["Variant", ...] = ()
    # the kind's own tables, checked at load (timescale, multitenant, density; studies/kinds.py)
    tables: dict = field(default_factory=dict)
    claims: tuple[Claim, ...] = ()      # parsed and checked at load (studies/claims.py)
    kind: str = kinds.REPLAY            # which study it is (studies/kinds.py KINDS)

    def variants(self, arms: dict[str, Arm]) -> list[tuple["Variant", "Experiment", dict[str, Arm]]]:
        """(variant, the experiment with its overrides, the arms with theirs) for every point of
        the matrix; one point (seed 0, no params) without a matrix."""
        out = []
        for v in self.matrix or (Variant(),):
            exp = replace(self, subset=v.overrides.get("subset", self.subset),
                          settings={k: v.overrides.get(k, val) for k, val in self.settings.items()})
            changed = dict(arms)
            for name, over in v.overrides.get("arms", {}).items():
                changed[name] = swept_arm(arms[name], over, f"experiments.{self.name}.matrix")   # checked at load
            out.append((v, exp, changed))
        return out


def swept_arm(arm: Arm, over: dict, where: str) -> Arm:
    """`arm` with a matrix point's overrides, checked like an arm of its own (ConfigError naming `where`)."""
    try:
        swept = Arm.from_dict(arm.name, {**arm.as_written, **over}, where=f"{where}.arms")
        if swept.policy is not None:
            Rules.from_arm(swept)            # an ablated rule is checked like the arm's own
    except ArmError as exc:
        raise ConfigError(f"{where}.arms.{arm.name}: {exc}" if not str(exc).startswith(where) else str(exc)) from None
    return swept


@dataclass(frozen=True)
class Variant:
    """One point of an experiment's matrix: a seed and the names of its ablation/size overrides."""
    seed: int = 0
    params: dict = field(default_factory=dict)         # axis (ablation, size) -> override name
    overrides: dict = field(default_factory=dict)

    def id(self, with_seed: bool) -> str:
        """The test-id suffix, `:seed1:half-limit:quick` (empty without a matrix); made only of
        characters `-k` accepts, so `-k "seed1 and half-limit"` selects it."""
        parts = ([f"seed{self.seed}"] if with_seed else []) + list(self.params.values())
        return "".join(":" + p for p in parts)


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
        check_numbers(raw)
        return _parse(raw, path)
    except (ArmError, BudgetError, TableError, ClaimError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except ConfigError as exc:
        if str(exc).startswith(f"{path}: "):
            raise
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
    _check_executor(defaults["executor"], f"{path}: defaults.executor")
    defaults["workspace"] = _workspace(defaults["workspace"], path, f"{path}: defaults.workspace")
    arms = {name: Arm.from_dict(name, _model_path(spec, path)) for name, spec in (raw.get("arms") or {}).items()}
    for arm in arms.values():
        if arm.policy is not None:
            Rules.from_arm(arm)          # a bad rule is a config error now, not a failure mid-run
    experiments = {}
    for name, spec in (raw.get("experiments") or {}).items():
        where = f"experiments.{name}"
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: {where}: expected a table")
        kind = kinds.check_kind(spec.get("kind", kinds.REPLAY), f"{where}.kind")     # TableError
        allowed = kinds.keys(kind, EXPERIMENT_KEYS)
        extra = set(spec) - set(allowed)
        if extra:      # a key this experiment would not read is a mistake, not a setting ignored
            other = kinds.kind_of_tables(extra)
            hint = f" ({', '.join(sorted(extra))}: tables of kind = \"{other}\")" if other and other != kind else ""
            raise ConfigError(f"{path}: {where}: unknown key(s) {', '.join(sorted(extra))}; {name} reads "
                              f"{', '.join(allowed)}{hint}")
        if "arms" in spec and (not isinstance(spec["arms"], list) or not all(isinstance(a, str) for a in spec["arms"])):
            raise ConfigError(f"{path}: {where}.arms: expected a list of names, got {spec['arms']!r}")
        if "arms" not in spec and kinds.own_arms(kind):       # [arms] are no controllers: no default
            raise ConfigError(f"{path}: {where}: missing key arms: the controllers to compare")
        arm_names = tuple(spec.get("arms") or arms) if kinds.has_arms(kind) else ()
        kinds.check_arms(kind, arm_names, f"{where}.arms", arms)                     # TableError
        budgets = {}
        if not isinstance(spec.get("budgets", {}), dict):
            raise ConfigError(f"{path}: {where}.budgets: expected a table of [{where}.budgets.<arm>] tables, "
                              f"got {spec['budgets']!r}")
        for arm, budget in (spec.get("budgets") or {}).items():
            if arm not in arms:
                raise ConfigError(f"{path}: {where}.budgets.{arm}: no arm of that name")
            if not isinstance(budget, dict):
                raise ConfigError(f"{path}: {where}.budgets.{arm}: expected a table of counter = budget, got {budget!r}")
            budgets[arm] = validate(budget, f"{where}.budgets.{arm}")
        settings = {k: spec.get(k, defaults[k]) for k in DEFAULTS}
        if "workspace" in spec:
            settings["workspace"] = _workspace(spec["workspace"], path, f"{path}: {where}.workspace")
        if "executor" in spec:
            _check_executor(spec["executor"], f"{path}: {where}.executor")
        tables = kinds.validate_tables(kind, spec, where, arms)
        experiments[name] = Experiment(name=name, description=spec.get("description", ""),
                                       subset=spec.get("subset", "smoke"), arms=arm_names,
                                       settings=settings, budgets=budgets,
                                       matrix=_matrix(spec.get("matrix"), f"{path}: {where}.matrix", arms),
                                       tables=tables, kind=kind,
                                       claims=kinds.parse_claims(kind, spec.get("claims"), f"{where}.claims",
                                                                 arm_names, tables))
    traces = (path.parent / raw.get("traces", "../traces")).resolve()
    return Config(path=path, traces=traces, arms=arms, experiments=experiments)


def _matrix(raw, where: str, arms: dict[str, Arm]) -> tuple[Variant, ...]:
    """Every combination of seeds × ablations × sizes, in the order written."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a table with seeds, {', '.join(MATRIX_AXES)}")
    unknown = set(raw) - {"seeds", *MATRIX_AXES}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected seeds, {', '.join(MATRIX_AXES)}")
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or any(isinstance(x, bool) or not isinstance(x, int) for x in seeds) \
            or len(set(seeds)) != len(seeds):
        raise ConfigError(f"{where}.seeds: expected a non-empty list of distinct integers, got {seeds!r}")
    axes, names = [], []
    for axis in MATRIX_AXES:
        entries = raw.get(axis)
        if entries is None:
            continue
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{where}.{axis}: expected a non-empty list of tables with a name")
        for i, entry in enumerate(entries):
            here = f"{where}.{axis}[{i}]"
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
                raise ConfigError(f"{here}: expected a table with a non-empty `name`")
            if entry["name"] in names or not all(c.isalnum() or c in "-_." for c in entry["name"]) \
                    or entry["name"].startswith("seed"):
                raise ConfigError(f"{here}.name: {entry['name']!r} is repeated (names are unique across axes), "
                                  "starts with 'seed', or is not made of letters, digits, -_.")
            names.append(entry["name"])
            bad = set(entry) - {"name", *OVERRIDE_KEYS}
            if bad:
                raise ConfigError(f"{here}: unknown override(s) {', '.join(sorted(bad))}; expected {', '.join(OVERRIDE_KEYS)}")
            if "executor" in entry:
                _check_executor(entry["executor"], f"{here}.executor")
            for arm, over in (entry.get("arms") or {}).items():
                if arm not in arms or not isinstance(over, dict):
                    raise ConfigError(f"{here}.arms.{arm}: no arm of that name (or not a table)")
                swept_arm(arms[arm], over, here)
        axes.append([(axis[:-1], e["name"], {k: v for k, v in e.items() if k != "name"}) for e in entries])
    out = []
    for seed in seeds:
        for combo in itertools.product(*axes):
            overrides: dict = {}
            for _axis, _name, over in combo:        # later axes win; arm overrides merge per key
                arms_so_far = overrides.pop("arms", {})
                overrides.update({k: v for k, v in over.items() if k != "arms"})
                for a, o in over.get("arms", {}).items():
                    arms_so_far[a] = {**arms_so_far.get(a, {}), **o}
                if arms_so_far:
                    overrides["arms"] = arms_so_far
            params = {axis: name for axis, name, _ in combo}
            for a, o in overrides.get("arms", {}).items():    # each axis alone was fine; together?
                swept_arm(arms[a], o, f"{where} point {', '.join(f'{k}={n}' for k, n in params.items())}")
            out.append(Variant(seed, params, overrides))
    return tuple(out)


def _model_path(spec, path: Path):
    """An arm's table with its `model` (limit_from = "predict": a file) relative to the config file."""
    if isinstance(spec, dict) and isinstance(spec.get("model"), str) and spec["model"].strip():
        return {**spec, "model": str((path.parent / spec["model"]).resolve())}
    return spec


def _workspace(value, path: Path, where: str) -> str | None:
    """A `workspace` setting: "empty", or a directory (relative to the config file), as a string."""
    if value is None or value == "empty":
        return value
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a directory or \"empty\", got {value!r}")
    return str((path.parent / value).resolve())


def _check_executor(name, where: str) -> None:
    if name not in EXECUTORS:
        raise ConfigError(f"{where}: unknown executor {name!r}; expected one of {', '.join(EXECUTORS)}")
