"""The predictive arm's model (arms.py limit_from = "predict"): each step's recorded peak by its
command class (traces/classify.py command_class), from a corpus, with the folds that say which
traces train the limits a held-out trace is replayed under. A small JSON file:

    {"schema": "agentcgroup-predict-model/1",
     "command": "agentcgroup predict train traces --subset recorded -o ...",   # how it was made
     "corpus": {"root": "traces", "subset": "recorded", "traces": 64, "steps": 2918,
                "left_out": [...], "provenance": "recorded"},   # left out: not faithful (cli --include-unfaithful)
     "folds": {"task": {"task-1": {"groups": ["RDFLib__rdflib-1117", ...], "traces": [...]}, ...},
               "repository": {"RDFLib/rdflib": {"groups": ["RDFLib/rdflib"], "traces": [...]}, ...}},
     "traces": {"<trace_id>": {"task": "RDFLib__rdflib-1117", "repository": "RDFLib/rdflib",
                               "steps": [["git diff", "vcs", 3.1, 120.0], ...]}}}   # class, kind, MiB, ms

Only peaks the profile recorded train it (IR provenance `recorded`: the kernel's peak of the step's
own cgroup); a derived peak (from ~1 Hz container samples) or a synthetic one is left out, and so is
a trace with none. Folds, two schemes: `task` groups the traces by the task they ran (a task run by
two models or agents is one group; traces/task.py task_of, else the trace id) into TASK_FOLDS folds
(tasks ordered by the SHA-256 of their name, dealt round); `repository` holds out one repository per
fold. A trace is replayed under the fold that holds out its group (its task, or its repository), so
no step of its task (repository) trains its limits; a trace whose group the corpus does not have
(another corpus) is predicted from the whole corpus ("all"), which holds nothing of it either.

May import: traces/ (classify, corpus, task, ir).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..traces.classify import classify_command, command_class
from ..traces.corpus import Corpus
from ..traces.task import task_of

SCHEMA = "agentcgroup-predict-model/1"
TASK_FOLDS = 5
SCHEMES = ("task", "repository")
ALL = "all"                       # the fold of a trace whose group no fold holds: the whole corpus


class ModelError(ValueError):
    """A model file that cannot be used; names the file and what is wrong."""


def step_kind_of(step) -> str:
    return classify_command(step.command) if step.tool == "bash" and step.command else step.tool


def samples(trace) -> list[list]:
    """[class, kind, peak MiB, duration ms] of each step of `trace` whose peak the profile recorded."""
    out = []
    for s in trace.steps:
        peak = s.profile.peak_mb
        if peak is None or peak.provenance != "recorded":
            continue
        dur = s.duration_ms.value if s.duration_ms is not None else 0.0
        out.append([command_class(s), step_kind_of(s), round(float(peak.value), 3), round(float(dur), 1)])
    return out


def groups(trace) -> dict:
    """{"task": ..., "repository": ...}: the groups `trace` belongs to (module docstring)."""
    task = task_of(trace)
    name = task.instance_id if task is not None and task.instance_id else trace.trace_id
    repo = task.repository if task is not None and task.repository else name
    return {"task": name, "repository": repo}


def train(root: str | Path, subset: str, *, k: int = TASK_FOLDS, command: str = "", keep=None) -> dict:
    """The model (module docstring) of the traces of `subset` of the corpus at `root` that
    `keep(trace)` takes (default: all); the model names the ones it left out."""
    corpus = Corpus.open(root)
    traces, left = {}, []
    for tid in corpus.ids(subset):
        trace = corpus.load(tid)
        if keep is not None and not keep(trace):
            left.append(tid)
            continue
        steps = samples(trace)
        if steps:
            traces[tid] = {**groups(trace), "steps": steps}
    tasks = sorted({t["task"] for t in traces.values()}, key=lambda g: hashlib.sha256(g.encode()).hexdigest())
    task_fold = {g: f"task-{i % k + 1}" for i, g in enumerate(tasks)}
    folds: dict = {"task": {}, "repository": {}}
    for tid, t in sorted(traces.items()):
        for scheme, name in (("task", task_fold[t["task"]]), ("repository", t["repository"])):
            fold = folds[scheme].setdefault(name, {"groups": [], "traces": []})
            if t[scheme] not in fold["groups"]:
                fold["groups"].append(t[scheme])
            fold["traces"].append(tid)
    return {"schema": SCHEMA, "command": command,
            "corpus": {"root": str(root), "subset": subset, "traces": len(traces), "left_out": left,
                       "steps": sum(len(t["steps"]) for t in traces.values()), "provenance": "recorded"},
            "folds": {s: dict(sorted(f.items())) for s, f in folds.items()}, "traces": traces}


def write(model: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(model, separators=(",", ":"), sort_keys=False) + "\n", encoding="utf-8")


_LOADED: dict[str, "Model"] = {}


class Model:
    """A model file, read and checked once (ModelError naming the file)."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelError(f"{path}: no such model file (make it: agentcgroup predict train CORPUS -o {path})") from None
        except (OSError, ValueError) as exc:
            raise ModelError(f"{path}: not a model file: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ModelError(f"{path}: schema: expected {SCHEMA!r}")
        for key in ("corpus", "folds", "traces"):
            if not isinstance(data.get(key), dict):
                raise ModelError(f"{path}: {key}: expected an object")
        for tid, t in data["traces"].items():
            ok = isinstance(t, dict) and isinstance(t.get("steps"), list) and all(
                isinstance(s, list) and len(s) == 4 and all(isinstance(x, str) for x in s[:2])
                and all(isinstance(x, (int, float)) and x >= 0 for x in s[2:]) for s in t["steps"])
            if not ok or not all(isinstance(t.get(g), str) for g in SCHEMES):
                raise ModelError(f"{path}: traces.{tid}: expected task, repository and steps [class, kind, MiB, ms]")
        for scheme in SCHEMES:
            if not isinstance(data["folds"].get(scheme), dict):
                raise ModelError(f"{path}: folds.{scheme}: expected an object of folds")
            for name, fold in data["folds"][scheme].items():
                if not isinstance(fold, dict) or not isinstance(fold.get("groups"), list) \
                        or not all(isinstance(g, str) for g in fold["groups"]):
                    raise ModelError(f"{path}: folds.{scheme}.{name}.groups: expected a list of group names")
        if not data["traces"]:
            raise ModelError(f"{path}: traces: the model holds no trace to take limits from")
        self.data = data
        self._fold_of = {s: {g: name for name, f in data["folds"][s].items() for g in f["groups"]} for s in SCHEMES}

    @classmethod
    def load(cls, path: str | Path) -> "Model":
        """The model at `path`, read once per process."""
        key = str(Path(path).resolve())
        if key not in _LOADED:
            _LOADED[key] = cls(path)
        return _LOADED[key]

    def fold_for(self, scheme: str, group: str) -> str:
        """The fold that holds `group` (a task or a repository) out; ALL when none does."""
        return self._fold_of[scheme].get(group, ALL)

    def training(self, scheme: str, fold: str) -> list[str]:
        """The trace ids that train `fold`: every trace the fold does not hold out."""
        held = set(self.data["folds"][scheme][fold]["traces"]) if fold != ALL else set()
        return [t for t in self.data["traces"] if t not in held]
