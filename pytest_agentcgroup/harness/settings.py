"""The plugin's settings and the one precedence rule between their sources.

Settings (each is a command-line option, an ini key and, where it makes sense, a marker keyword;
`setting()` is the one place that decides which wins: option > marker > ini > config file > default):

    --agentcgroup-config FILE      agentcgroup_config       experiments/agentcgroup.toml
    --agentcgroup-out DIR          agentcgroup_out          results
    --agentcgroup-traces DIR       agentcgroup_traces       `traces` of the config file
    --agentcgroup-subset NAME      agentcgroup_subset       the experiment's subset      (marker: subset=)
    --agentcgroup-arms A,B         agentcgroup_arms         the experiment's arms        (marker: arms=)
    --agentcgroup-executor NAME    agentcgroup_executor     emulate (emulate | sandbox | docker)
    --agentcgroup-time-scale X     agentcgroup_time_scale   the experiment's time_scale
    --agentcgroup-step-timeout S   agentcgroup_step_timeout the experiment's step_timeout_s
    --agentcgroup-max-divergence X agentcgroup_max_divergence the experiment's max_divergence (0.2)
    --agentcgroup-workspace DIR    agentcgroup_workspace    the experiment's workspace (a provider's)
    --agentcgroup-resume           agentcgroup_resume       off: skip tests already complete in the results
    --agentcgroup-isolate          agentcgroup_isolate      off: a disjoint cpuset + memory share per xdist worker
    --agentcgroup-baseline PATH    agentcgroup_baseline     none: the regression gate's baseline
    --agentcgroup-gate-rules R     agentcgroup_gate_rules   metrics/gate.py DEFAULT_RULES
    --agentcgroup-save-baseline P  agentcgroup_save_baseline  none: write this run's baseline to P
    --agentcgroup-shard K/N        agentcgroup_shard        none: run only shard K of N (by a hash of each test id)

May import: config (the experiment model), metrics.gate (its default rules) and pytest.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from .. import config as cfgmod
from ..metrics import gate

# name -> (help, default, type, marker keyword or None)
SETTINGS = {
    "config": ("experiment configuration file (TOML: arms, experiments, budgets)", "experiments/agentcgroup.toml", str, None),
    "out": ("results directory: each run writes its own NNNN_<time>/ (metrics.jsonl, a line per step, and "
            "summary.json); `latest` points at the newest", "results", str, None),
    "traces": ("trace corpus directory (holding manifest.json); default: the config file's `traces`", None, str, None),
    "subset": ("manifest subset, or comma-separated subsets and trace ids, to replay, for every experiment", None, str,
               "subset"),
    "arms": ("comma-separated arm names to run: each experiment runs those it can (exp2: its controllers); "
             "an experiment left with none skips", None, str, "arms"),
    "executor": ("how steps run: emulate (reproduce the recorded profile), sandbox (real command under bubblewrap) or docker (real command in a container)", None, str, None),
    "time_scale": ("multiply recorded durations by this factor when replaying (emulate executor only; "
                   "policy timers follow it)", None, float, None),
    "step_timeout": ("per-step timeout in seconds", None, float, None),
    "max_divergence": ("real commands (sandbox, docker): the share of a trace x arm's steps with a recorded outcome "
                       "that may end otherwise than recorded before its test fails", cfgmod.DEFAULTS["max_divergence"], float, None),
    "workspace": ("real commands: the directory copied in as the working copy of every trace's task (a user's own "
                  "checkout), or 'empty' to replay in an empty directory; default: the trace's image, or the "
                  "workspace lock of its corpus (workspaces.lock.json)", None, str, None),
    "resume": ("continue the newest run when it did not finish: skip every trace x arm (x seed x params) "
               "already complete in it, redo partial ones (a finished newest run: start a new run)", False, bool, None),
    "isolate": ("under xdist, give each worker a disjoint cpuset and an equal share of the memory", False, bool, None),
    "baseline": ("regression gate: compare this run with a baseline (file, run directory, or results "
                 "directory = its newest run); "
                 "a regression fails the run", None, str, None),
    "gate_rules": ("regression gate rules, METRIC=TOLERANCE comma-separated (docs/gate.md, 'Tolerances')", gate.DEFAULT_RULES, str, None),
    "save_baseline": ("write this run's results as a baseline file", None, str, None),
    "shard": ("run only shard K of N (K/N, 1 <= K <= N): each test is in one shard, chosen by a hash of its id, "
              "whatever else is selected; claims comparing arms are checked by `agentcgroup merge` of the N "
              "shards' runs", None, str, None),
}
_PATH_SETTINGS = ("config", "out", "traces", "baseline", "save_baseline", "workspace")
#: settings that are a number of the config file: the file's rule for that key (config.NUMBERS)
#: holds whichever source the value comes from
NUMBER_SETTINGS = {"time_scale": "time_scale", "step_timeout": "step_timeout_s", "max_divergence": "max_divergence"}


def add_options(parser: pytest.Parser) -> None:
    """Every setting as a command-line option and an ini key (plugin.py's pytest_addoption)."""
    group = parser.getgroup("agentcgroup", "trace-driven cgroup experiments")
    for name, (help_, default, type_, _marker) in SETTINGS.items():
        flag = "--agentcgroup-" + name.replace("_", "-")
        extra = {"action": "store_const", "const": True} if type_ is bool else {}
        group.addoption(flag, dest=f"agentcgroup_{name}", default=None, help=f"{help_} (ini: agentcgroup_{name})", **extra)
        parser.addini(f"agentcgroup_{name}", help_, default=None)


def setting(config: pytest.Config, name: str, *, marker=None, experiment: cfgmod.Experiment | None = None):
    """The one precedence rule: command line > marker keyword > ini > config file > built-in default."""
    _help, default, type_, marker_kw = SETTINGS[name]
    value, base = config.getoption(f"agentcgroup_{name}"), Path.cwd()
    if value is None and marker is not None and marker_kw and marker_kw in marker.kwargs:
        value = marker.kwargs[marker_kw]
    if value is None:
        value, base = config.getini(f"agentcgroup_{name}"), config.rootpath
    if value in (None, "", []) and experiment is not None:
        value = {"subset": experiment.subset, "arms": ",".join(experiment.arms),
                 "executor": experiment.settings["executor"], "time_scale": experiment.settings["time_scale"],
                 "step_timeout": experiment.settings["step_timeout_s"],
                 "max_divergence": experiment.settings.get("max_divergence"),
                 "workspace": experiment.settings.get("workspace")}.get(name)
    if value in (None, "", []):
        value, base = default, config.rootpath
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = ",".join(value)
    try:
        value = _boolean(value) if type_ is bool else type_(value)
    except (TypeError, ValueError):
        raise pytest.UsageError(f"agentcgroup_{name}: expected {type_.__name__}, got {value!r}") from None
    if name in _PATH_SETTINGS and value != "empty":
        value = str((base / value).resolve())
    if name in NUMBER_SETTINGS:
        problem = cfgmod.NUMBERS[NUMBER_SETTINGS[name]].problem(value)
        if problem:
            raise pytest.UsageError(f"--agentcgroup-{name.replace('_', '-')} (ini agentcgroup_{name}): {problem}")
    return value


def check_numbers(config: pytest.Config) -> None:
    """The numeric settings given on the command line or in the ini file, checked once when pytest
    starts (UsageError naming the option); those of the config file are checked when it is loaded."""
    for name in NUMBER_SETTINGS:
        setting(config, name)


def shard(config: pytest.Config) -> tuple[int, int] | None:
    """(K, N) of --agentcgroup-shard K/N (ini agentcgroup_shard), None when the run is not
    sharded; a value that is not K/N with 1 <= K <= N is a UsageError naming the option."""
    value = setting(config, "shard")
    if value is None or not value.strip():
        return None
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", value)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise pytest.UsageError(f"--agentcgroup-shard (ini agentcgroup_shard): expected K/N, shard K of N with "
                                f"1 <= K <= N (e.g. 1/4), got {value!r}")
    return int(m[1]), int(m[2])


def _boolean(value) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)
