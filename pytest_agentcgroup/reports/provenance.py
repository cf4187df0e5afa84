"""Where a run's numbers come from, as a results page states it: the run directory, when it ran,
the command, the config file, the checkout's commit, the machine, kernel and cgroup layout — read
from the files the run wrote (metrics/store.py: run.json when it was made, complete.json when its
session ended) — and its per-arm figures as the run wrote them (summary.json).

    run = read_run("results/latest")            # RunFiles; ResultsError naming what is missing
    for label, text in facts(run): ...
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..metrics.store import COMPLETE_FILE, METRICS_FILE, RUN_FILE, SUMMARY_FILE, NoRun, holds_results, resolve_run
from .frames import ResultsError

#: The files a published run must hold: a finished run (complete.json) that recorded how it was
#: made (run.json). A page of any run needs only its records and summary.json.
PUBLISHED_FILES = (RUN_FILE, COMPLETE_FILE)


@dataclass
class RunFiles:
    path: Path                       # the run directory
    summaries: list[dict]            # summary.json: one object per experiment × arm × seed × params
    run: dict | None = None          # run.json, None when the run did not record it
    complete: dict | None = None     # complete.json, None when the run did not finish


def read_run(directory: str | Path, *, require: tuple[str, ...] = ()) -> RunFiles:
    """The provenance files of one run (a run directory, `latest`, or a results directory = its
    newest run). Records and summary.json are needed; `require` names further files that must be
    there (PUBLISHED_FILES for a published page). ResultsError names every missing file at once."""
    try:
        d = resolve_run(directory)
    except NoRun as exc:
        raise ResultsError(str(exc)) from None
    missing = ([] if holds_results(d) else [METRICS_FILE]) + [
        f for f in (SUMMARY_FILE, *require) if not (d / f).is_file()]
    if missing:
        raise ResultsError(f"{d}: no {', '.join(missing)} — a results page is made from a run's "
                           f"{', '.join(dict.fromkeys((METRICS_FILE, SUMMARY_FILE, *require)))} "
                           "(a run writes summary.json as its session ends, complete.json once it ended, "
                           "run.json when it starts)")
    summaries = _json(d / SUMMARY_FILE)
    if not isinstance(summaries, list) or not all(isinstance(s, dict) and "config" in s for s in summaries):
        raise ResultsError(f"{d / SUMMARY_FILE}: expected a list of objects with a `config` (one per experiment × "
                           "arm × seed × params)")
    run = _json(d / RUN_FILE) if (d / RUN_FILE).is_file() else None
    complete = _json(d / COMPLETE_FILE) if (d / COMPLETE_FILE).is_file() else None
    for name, obj in ((RUN_FILE, run), (COMPLETE_FILE, complete)):
        if obj is not None and not isinstance(obj, dict):
            raise ResultsError(f"{d / name}: expected a JSON object, got {type(obj).__name__}")
    return RunFiles(d, summaries, run, complete)


def _json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ResultsError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror}") from None


def _get(obj: dict | None, *keys):
    for k in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(k)
    return obj


NOT_RECORDED = f"not recorded (the run has no {RUN_FILE})"
#: pytest's exit statuses (pytest.ExitCode), as complete.json records them
EXIT_STATUS = {0: "all tests passed", 1: "some tests failed", 2: "interrupted", 3: "internal error",
               4: "usage error", 5: "no tests collected"}


def shell_word(arg) -> str:
    """An argument as a shell would take it: bare when it can be, else in double quotes when
    nothing in it is special there (`-m "experiment(name='exp1')"`), else single-quoted."""
    arg = str(arg)
    if shlex.quote(arg) == arg:
        return arg
    if not any(c in arg for c in '"\\$`!'):
        return f'"{arg}"'
    return shlex.quote(arg)


def facts(rf: RunFiles, shown_as: str | None = None) -> list[tuple[str, str]]:
    """(label, text) of the run's provenance, in the order a page lists them. `shown_as` is how
    the page names the run directory (default: its path)."""
    run, done = rf.run, rf.complete
    out = [("run directory", shown_as or str(rf.path))]
    if run is not None and run.get("run"):
        out.append(("written as", f"{run['run']}, by " + ("agentcgroup merge of the shards below" if run.get("merged_from")
                                                           else f"pytest started in {run.get('cwd')}")))
    if run is not None and isinstance(run.get("merged_from"), list):      # harness/merge.py: a sharded run joined
        out.append(("merged from", "; ".join(f"shard {m.get('shard')}: {m.get('run')} (started {m.get('started')})"
                                             for m in run["merged_from"] if isinstance(m, dict))
                    + (f"; missing: shard(s) {', '.join(run['missing_shards'])}" if run.get("missing_shards") else "")))
    out.append(("started", str(run.get("started")) + " (UTC)" if run is not None and run.get("started") else
                f"{_started_from_name(rf.path.name)}; " + NOT_RECORDED))
    if done is None:
        out.append(("finished", f"no: the run has no {COMPLETE_FILE} (killed, interrupted, or still running)"))
    else:
        status = done.get("exitstatus")
        out.append(("finished", f"{done.get('finished')} (UTC), pytest exit status {status}"
                    + (f" ({EXIT_STATUS[status]})" if status in EXIT_STATUS else "")))
    if run is None:
        out += [(label, NOT_RECORDED) for label in ("command", "config", "commit", "machine", "kernel")]
    else:
        args = run.get("pytest_args")
        out.append(("command", "pytest " + " ".join(map(shell_word, args)) if isinstance(args, list) else "not recorded"))
        sha = run.get("config_sha256")
        out.append(("config", f"{run.get('config')}" + (f" (sha256 {sha})" if sha else "")))
        commit = run.get("checkout")
        out.append(("commit", "not recorded (no git checkout, or no git)" if not commit else
                    f"{commit.get('commit')}" + {True: " with uncommitted changes to tracked files",
                                                  False: " (clean)"}.get(commit.get("dirty"), "")))
        host = run.get("host") or {}
        cpu, mem = host.get("cpu") or {}, host.get("memory_mib")
        out.append(("machine", f"{cpu.get('model') or 'unknown CPU'}, {cpu.get('count')} CPU(s)"
                    + (f", {mem} MiB memory" if mem else "") + f", {_get(host, 'kernel', 'machine') or '?'}"))
        out.append(("kernel", f"{_get(host, 'kernel', 'release')} ({_get(host, 'kernel', 'version')})"))
    out.append(("cgroup layout", _cgroups(run, done)))
    if run is not None:
        host = run.get("host") or {}
        pkgs = host.get("packages") or {}
        out.append(("software", f"Python {host.get('python')}; "
                    + ", ".join(f"{k} {v}" for k, v in pkgs.items() if v)))
    return out


def _cgroups(run: dict | None, done: dict | None) -> str:
    """The host's cgroup mode and controllers (run.json), and those the run's cgroups had and
    lacked with why (complete.json's run_tree)."""
    parts = []
    cg = _get(run, "host", "cgroups")
    if isinstance(cg, dict):
        if cg.get("mode"):
            parts.append(f"{cg['mode']} (v2 at {cg.get('unified')}); host controllers: "
                         f"{', '.join(cg.get('controllers') or []) or 'none'}")
        else:
            parts.append(f"unavailable: {cg.get('unavailable')}")
    tree = _get(done, "run_tree")
    if isinstance(tree, dict):
        refused = tree.get("refused") or {}
        parts.append(f"the run's cgroups had {', '.join(tree.get('controllers') or []) or 'no controller'}"
                     + ("; left out: " + "; ".join(f"{c} ({why})" for c, why in refused.items()) if refused else ""))
    return "; ".join(parts) or NOT_RECORDED


def _started_from_name(name: str) -> str:
    """A run directory's name, NNNN_<UTC start>, as a date."""
    _, _, stamp = name.partition("_")
    if len(stamp) >= 15 and stamp[8] == "T":
        return f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]} UTC (from its name)"
    return "unknown"
