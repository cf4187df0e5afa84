"""The results page of a run as MyST Markdown (OUT/results.md), for the documentation: its
provenance (provenance.py: run directory, dates, command, config, commit, machine, kernel, cgroup
layout), the per-arm figures exactly as the run's summary.json holds them, a table per test, the
figures (OUT/figures/*.png) and runs.csv / columns.csv beside it (outputs.py). Every column names
its unit and whether its number is recorded, derived or the trace's own; nothing on the page is
typed by hand.

    from pytest_agentcgroup.reports.markdown import build_page
    build_page(["results/latest"], "page", config="experiments/agentcgroup.toml", title="Experiment 1")
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from pathlib import Path

from .frames import COLUMNS, Results, ResultsError, load
from .frontier import frontier_frame
from .outputs import write_outputs
from .provenance import RunFiles, facts, read_run

PAGE = "results.md"
#: summary.json's columns, in three tables: what ran and how long it took, what the kernel and the
#: policy counted, what the limits reserved. A key of the file in none of them joins the second.
SUMMARY_TABLES = [
    ("Steps and latency", [("traces", "traces"), ("total_steps", "steps"), ("executed_steps", "executed"),
                           ("unstarted_steps", "unstarted"), ("latency_p50_ms", "p50 latency"),
                           ("latency_p95_ms", "p95 latency"), ("latency_p99_ms", "p99 latency"),
                           ("timeouts", "timeouts")]),
    ("Kernel and policy counters", [("oom_kills", "OOM kills"), ("mem_max_events_total", "hard-limit hits"),
                                    ("mem_high_events_total", "soft-limit breaches"),
                                    ("mem_high_steps", "steps above the soft limit"), ("throttles_total", "throttles"),
                                    ("freezes_total", "freezes"), ("policy_kills_total", "policy kills"),
                                    ("pids_max_events_total", "forks refused"),
                                    ("mem_stall_s_total", "waited for memory"),
                                    ("mem_stall_ms_max", "longest wait for memory")]),
    ("Reserved and used memory", [("step_time_s", "tool time"), ("reserved_gib_s", "reserved"),
                                  ("reserved_vs_oracle", "× oracle"), ("oracle_gib_s", "oracle"),
                                  ("ceiling_reserved_gib_s", "reserved at ceiling"),
                                  ("soft_reserved_gib_s", "reserved at soft limit"), ("used_gib_s", "used"),
                                  ("idle_reserved_gib_s", "idle reserved"), ("utilization", "utilization")]),
]
SUMMARY_KEYS = ("experiment", "config", "seed", "params")
#: the per-test table (a row of runs.csv each; every column is in runs.csv)
TEST_COLUMNS = [("total_steps", "steps"), ("failed_steps", "failed"), ("latency_p95_ms", "p95 latency"),
                ("peak_rss_mb", "peak memory"), ("oom_kills", "OOM kills"), ("mem_max_events_total", "hard-limit hits"),
                ("mem_high_events_total", "soft-limit breaches"), ("timeouts", "timeouts"),
                ("reserved_gib_s", "reserved"), ("used_gib_s", "used")]


def build_page(dirs, out: str | Path, *, config: str | Path | None = None, traces: list[str] | None = None,
               defaults: dict | None = None, title: str | None = None, require: tuple[str, ...] = (),
               shown_as: list[str] | None = None) -> Path:
    """Write OUT/results.md (with OUT/figures/, runs.csv, columns.csv) of the runs `dirs` (each a
    run directory or a results directory = its newest run); returns the page's path. `require`:
    further files each run must hold (provenance.PUBLISHED_FILES for a published page);
    `shown_as`: how the page names each run directory (default: its path)."""
    dirs = [dirs] if isinstance(dirs, (str, Path)) else list(dirs)
    if not dirs:
        raise ResultsError("no results directory given")
    runs = [read_run(d, require=require) for d in dirs]
    res = load([r.path for r in runs])
    outs = write_outputs(res, out, config=config, traces=traces, defaults=defaults)
    names = shown_as or [str(r.path) for r in runs]
    page = Path(out) / PAGE
    page.write_text(_page(runs, names, res, outs, config, title), encoding="utf-8")
    return page


# ---------------------------------------------------------------------------------------------
# Markdown

_SPECIAL = set("\\`*_[]<>|")


def text(value) -> str:
    """Plain text inside a line, its inline Markdown escaped (trace ids hold `__`; `|` would split a
    table cell, `<` start raw HTML)."""
    return "".join("\\" + c if c in _SPECIAL else c for c in str(value).replace("\n", " "))


def code(value) -> str:
    """A code span; `|` escaped, as a table cell needs (the span keeps the text literal)."""
    s = str(value).replace("\n", " ").replace("|", "\\|")
    fence = "``" if "`" in s else "`"
    return f"{fence} {s} {fence}" if fence == "``" else f"`{s}`"


def recorded_value(v) -> str:
    """A number as summary.json holds it (JSON's own spelling), null as —."""
    if v is None:
        return "—"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return json.dumps(v)
    return code(json.dumps(v) if isinstance(v, (dict, list)) else v)


def shown_value(v, key: str) -> str:
    """A number of the per-test or sweep tables, rounded as the HTML report rounds it."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return code(v)
    if isinstance(v, float) and (key in ("utilization", "reserved_vs_oracle") or key.endswith("_gib_s")) and abs(v) < 10:
        return f"{v:.3g}"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def heading(key: str, label: str) -> str:
    m = COLUMNS.get(key)
    return text(label) + (f" ({text(m.unit)}, {m.provenance})" if m else "")


def table(heads: list[str], rows: list[list[str]], numeric: list[bool]) -> str:
    align = ["---:" if n else "---" for n in numeric]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _summary_tables(runs: list[RunFiles], names: list[str]) -> str:
    rows = [(name, s) for run, name in zip(runs, names) for s in run.summaries]
    ids = ([("run", "run directory")] if len(runs) > 1 else []) + (
        [("experiment", "experiment")] if len({s.get("experiment") for _, s in rows}) > 1 else []) + [("config", "arm")]
    if any(s.get("seed", 0) != 0 for _, s in rows):
        ids.append(("seed", "seed"))
    if any(s.get("params") for _, s in rows):
        ids.append(("params", "params"))
    placed = {k for _, cols in SUMMARY_TABLES for k, _ in cols} | set(SUMMARY_KEYS)
    extra = [k for _, s in rows for k in s if k not in placed]
    out = []
    for i, (what, cols) in enumerate(SUMMARY_TABLES):
        cols = cols + ([(k, k) for k in dict.fromkeys(extra)] if i == 1 else [])
        cols = [(k, label) for k, label in cols if any(k in s for _, s in rows)]
        if not cols:
            continue
        body = [[code(name) if k == "run" else code(s.get(k) or "-") if k in ("experiment", "config") else
                 recorded_value(s.get(k)) for k, _ in ids] + [recorded_value(s.get(k)) for k, _ in cols]
                for name, s in rows]
        out.append(f"### {what}\n\n" + table([text(label) for _, label in ids] + [heading(k, label) for k, label in cols],
                                             body, [False] * len(ids) + [True] * len(cols)))
    return "\n\n".join(out)


def _facts_list(pairs: list[tuple[str, str]]) -> str:
    return "\n".join(f"- **{text(label)}**: " + (code(value) if label == "command" else text(value))
                     for label, value in pairs)


def _replayed(res: Results) -> list[tuple[str, str]]:
    recs, tests = res.records, res.tests
    axes = res.axes()
    return [("experiments", ", ".join(sorted({r["experiment"] or "-" for r in recs}))),
            ("arms", ", ".join(dict.fromkeys(r["config"] for r in recs))),
            ("traces", f"{tests['trace_id'].nunique()} (count)"),
            ("seeds", ", ".join(map(str, sorted({r["seed"] for r in recs})))),
            ("sweep axes", "; ".join(f"{k} ∈ {v}" for k, v in axes.items()) or "none"),
            ("step records", f"{len(recs)} (count, recorded)"),
            ("executors", ", ".join(sorted({str(r.get("executor")) for r in recs}))),
            ("replayed inputs", ", ".join(f"{k}: {v} steps" for k, v in sorted(Counter(
                str(r.get("profile_source")) for r in recs).items())) + " (provenance of the traces' profiles)")]


def _figure(name: str, caption: str) -> str:
    """A MyST figure directive; its fence longer than any run of backticks in the caption (a trace
    id could hold some), the alt text on one line."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", caption)), default=0))
    alt = " ".join(caption.split())
    return f"{fence}{{figure}} figures/{name}\n:alt: {alt}\n\n{text(caption)}\n{fence}"


def _limits_from(config, runs: list[RunFiles]) -> str:
    """Where the figures' limit lines come from, and whether that file is the one the run read
    (the sha256 run.json recorded)."""
    if config is None:
        return "not drawn (no config given)"
    try:
        digest = hashlib.sha256(Path(config).read_bytes()).hexdigest()
    except OSError as exc:
        raise ResultsError(f"{config}: cannot read: {exc.strerror}") from None
    recorded = {(r.run or {}).get("config_sha256") for r in runs}
    if recorded == {digest}:
        return f"{config}, the file the run read (the same sha256)"
    if None in recorded:
        return f"{config} (whether the run read this file is not recorded)"
    return f"{config}, which differs from the file the run read (sha256 {digest}): the lines show today's limits"


def _tests_table(res: Results, several: bool) -> str:
    tests = res.tests
    ids = ([("run", "run directory")] if several else []) + [("trace_id", "trace"), ("config", "arm")]
    if tests["seed"].nunique() > 1:
        ids.append(("seed", "seed"))
    if res.axes():
        ids.append(("params", "params"))
    if tests["profiles"].nunique() > 1:
        ids.append(("profiles", "step profiles"))
    rows = [[(code(r[k]) if r[k] != "" else "-") if k != "seed" else str(r[k]) for k, _ in ids] + [shown_value(r[k], k) for k, _ in TEST_COLUMNS]
            for r in tests.to_dict("records")]
    return table([text(label) for _, label in ids] + [heading(k, label) for k, label in TEST_COLUMNS], rows,
                 [k == "seed" for k, _ in ids] + [True] * len(TEST_COLUMNS))


def _sweep_section(reserve) -> str:
    """Per arm × sweep point × step profiles: what it reserved and used, for the experiments with a
    frontier (frontier.frontier_frame: a sweep, or both recorded and other step profiles)."""
    reserve = frontier_frame(reserve) if not reserve.empty else reserve
    if reserve.empty:
        return ""
    keys = [("reserved_gib_s", "reserved"), ("reserved_vs_oracle", "× oracle"), ("oracle_gib_s", "oracle"),
            ("used_gib_s", "used"), ("utilization", "utilization"), ("idle_reserved_gib_s", "idle reserved"),
            ("step_time_s", "tool time")]
    rows = [[code(r["experiment"] or "-"), code(r["config"]), code(r["point"]), code(r["profiles"]), str(r["traces"]),
             shown_value(r["oom_kills"], "oom_kills")] + [shown_value(r[k], k) for k, _ in keys]
            for r in reserve.to_dict("records")]
    heads = ["experiment", "arm", "sweep point", "step profiles", "traces (count)", "OOM kills (count, recorded)"] + [
        heading(k, label) for k, label in keys]
    return ("## Per sweep point and step profiles\n\nSums over the traces, means over seeds (derived: "
            "metrics/reservation.py). Step profiles: `recorded` where the traces replayed profiles recorded "
            "step by step, `derived` where they replayed profiles derived from 1 Hz samples.\n\n"
            + table(heads, rows, [False] * 4 + [True] * (len(heads) - 4)))


def _folds_section(res: Results, config) -> str:
    """Per arm with a model of command classes (limit_from = "predict") and fold: the traces the run
    replayed under the fold's limits (held out of its training: the records' limit_fold) and, where the
    config names the model, how many traces trained it (limits/model.py training)."""
    steps = res.steps
    if "limit_fold" not in steps or steps["limit_fold"].isna().all():
        return ""
    models = {}
    if config is not None:
        from ..config import ConfigError, load as load_config
        from ..limits.model import Model, ModelError
        try:
            arms = load_config(config).arms
            models = {a.name: (Model.load(a.knobs["model"]), a.knobs["folds"], a.knobs["model"])
                      for a in arms.values() if a.limit_from == "predict"}
        except (ConfigError, ModelError) as exc:
            raise ResultsError(f"{config}: {exc}") from None
    rows = []
    for (arm, fold), sel in steps.dropna(subset=["limit_fold"]).groupby(["config", "limit_fold"], sort=True):
        tested = sorted(sel["trace_id"].unique())
        model = models.get(arm)
        if model is None:
            trained = "(no config given)" if config is None else f"(no predict arm {arm} in {Path(config).name})"
        elif fold not in model[0].data["folds"][model[1]] and fold != "all":
            trained = f"(no fold {fold} in {Path(model[2]).name})"
        else:
            trained = f"{len(model[0].training(model[1], fold))} of {Path(model[2]).name} (by {model[1]})"
        rows.append([code(arm), code(fold), str(len(tested)), trained, ", ".join(code(t) for t in tested)])
    return ("## Held-out folds\n\nEach trace replayed under an arm with a model of command classes took its limits "
            "from the fold that held its task out: the model never saw it (recorded in each step's `limit_fold`).\n\n"
            + table(["arm", "fold", "traces tested (count)", "traces trained (count, model)", "traces tested"], rows,
                    [False, False, True, False, False]))


def _ablation_section(deltas) -> str:
    if deltas.empty:
        return ""
    rows = [[code(r["axis"]), code(json.dumps(r["value"])), code(json.dumps(r["default"])), code(r["config"]),
             code(r["metric"]), text(f"{COLUMNS[r['metric']].unit}, derived"), shown_value(r["default_mean"], r["metric"]),
             shown_value(r["mean"], r["metric"]), shown_value(r["delta"], r["metric"]), str(r["tests"])]
            for r in deltas.to_dict("records")]
    heads = ["axis", "value", "default", "arm", "metric", "unit", "mean at default", "mean", "delta", "tests (count)"]
    return ("## Ablation deltas\n\nMeans over traces × seeds at each value of the axis, minus the mean at its "
            "default value.\n\n" + table(heads, rows, [False] * 6 + [True] * 4))


def _page(runs: list[RunFiles], names: list[str], res: Results, outs, config, title) -> str:
    several = len(runs) > 1
    title = title or (f"Results of run {runs[0].path.name}" if not several else f"Results of {len(runs)} runs")
    parts = [f"# {text(title)}",
             "This page is generated by `agentcgroup report --markdown` from the files of the run "
             + ("directories" if several else "directory") + " named below: every table and figure is "
             "made from them, nothing is typed by hand. Every number says its unit and where it comes from: "
             "**recorded** = counted by the kernel or the wall clock in this run; **derived** = computed from "
             "recorded numbers (percentiles, sums, integrals); **trace** = the replayed trace's own figure "
             "(recorded, derived or synthetic, as the trace says)."]
    for run, name in zip(runs, names):
        parts.append(("## The run" if not several else f"## Run {text(Path(name).name)}")
                     + "\n\n" + _facts_list(facts(run, name)))
    parts.append(("## What it replayed" if not several else "## What they replayed") + "\n\n" + _facts_list(
        _replayed(res) + [("arm limits on the figures", _limits_from(config, runs)),
                          ("files read", ", ".join(str(s) for s in res.sources))]))
    parts.append("## Per arm\n\nAs the run's summary.json holds them: one row per experiment × arm × seed × sweep "
                 "params (a column only where they differ), over every step of the arm's traces.\n\n"
                 + _summary_tables(runs, names))
    sweep = _sweep_section(outs.reserve)
    if sweep:
        parts.append(sweep)
    parts.append("## Figures\n\n" + "\n\n".join(_figure(name, caption) for name, caption in outs.figures))
    folds = _folds_section(res, config)
    if folds:
        parts.append(folds)
    ablation = _ablation_section(outs.deltas)
    if ablation:
        parts.append(ablation)
    parts.append("## Per test\n\nOne row per trace × arm × seed (× sweep params), from the run's metrics.jsonl; "
                 "every column, with its unit and provenance, is in {download}`runs.csv <runs.csv>` "
                 "({download}`columns.csv <columns.csv>` describes them).\n\n" + _tests_table(res, several))
    return "\n\n".join(parts) + "\n"
