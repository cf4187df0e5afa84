"""What every report writes beside its page (the HTML report's index.html, the Markdown results
page's results.md): OUT/runs.csv (a row per trace × arm × seed × params), OUT/columns.csv (each
column's unit, direction and provenance) and OUT/figures/*.png with their captions.

    outs = write_outputs(load("results"), "report", config="experiments/agentcgroup.toml")
    outs.figures        # [(file name, caption)], in the order a page shows them
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from . import figures, frontier
from .frames import COLUMNS, Results, ResultsError, ablation_deltas


@dataclass
class Outputs:
    figures: list[tuple[str, str]]      # (file name under OUT/figures/, caption)
    deltas: object                      # frames.ablation_deltas (a DataFrame; empty without sweep axes)
    reserve: object                     # frontier.reservation_frame (a DataFrame)


def arm_limits(config_path: str | Path | None) -> dict[str, dict]:
    """arm -> its limits (memory_max_mb, memory_high_mb, …) from an experiment config file."""
    if config_path is None:
        return {}
    from ..config import ConfigError, load as load_config
    try:
        return {name: arm.limits for name, arm in load_config(config_path).arms.items()}
    except ConfigError as exc:
        raise ResultsError(str(exc)) from None


def memory_traces(tests, n: int = 3) -> list[str]:
    """The traces worth a memory-vs-limit figure: most OOM kills, then most hard-limit hits, then
    the largest peak."""
    per = tests.groupby("trace_id", sort=False).agg(oom=("oom_kills", "sum"), hits=("mem_max_events_total", "sum"),
                                                     peak=("peak_rss_mb", "max"))
    return list(per.sort_values(["oom", "hits", "peak"], ascending=False).index[:n])


def check_traces(res: Results, traces: list[str] | None) -> None:
    """Every trace asked for a figure is in the results (checked before an earlier report's files
    are replaced)."""
    known = {r["trace_id"] for r in res.records}
    for t in traces or []:
        if t not in known:
            some = sorted(known)
            raise ResultsError(f"--trace {t}: not in the results (traces: {', '.join(some[:5])}"
                               f"{', …' if len(some) > 5 else ''})")


def write_outputs(res: Results, out: str | Path, *, config: str | Path | None = None,
                  traces: list[str] | None = None, defaults: dict | None = None) -> Outputs:
    """runs.csv, columns.csv and the figures of `res` into `out` (figures of an earlier report
    there are removed first: a rebuild never shows another run's figure). `config` gives the arms'
    limits for the memory figures, `traces` those figures' traces (default: memory_traces),
    `defaults` each sweep axis's default value for the ablation deltas."""
    if not res.records:
        raise ResultsError(f"{', '.join(map(str, res.sources))}: no step records")
    check_traces(res, traces)
    limits = arm_limits(config)
    out = Path(out)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    for old in (out / "figures").glob("*.png"):
        old.unlink()
    steps, tests = res.steps, res.tests
    tests.to_csv(out / "runs.csv", index=False)
    write_columns(out / "columns.csv", tests.columns)

    figs = [("latency_cdf.png", figures.latency_cdf(steps),
             "Empirical CDF of each executed step's wall-clock latency (ms, recorded), per arm; log scale."),
            ("kills_breaches.png", figures.kills_and_breaches(tests),
             "OOM kills, hard-limit hits and soft-limit breaches per arm, each a kernel counter (count, "
             "recorded), summed over the arm's traces (the mean over its sweep points where it ran at several).")]
    for t in traces or memory_traces(tests):
        figs.append((f"memory_{slug(t)}.png", figures.memory_vs_limit(steps, t, limits),
                     f"{t}: each step's measured memory peak (MiB, recorded) per arm, the trace's own peak "
                     "(MiB, provenance as given by the trace), OOM-killed steps (×) and "
                     + ("each arm's limits from the config file (MiB)." if limits else
                        "no limit lines (no experiment config file given: --config).")))
    reserve = frontier.reservation_frame(tests)
    if frontier.has_frontier(reserve):
        figs.append(("frontier.png", figures.frontier(frontier.frontier_frame(reserve)),
                     "OOM kills (count, recorded) against the memory each arm's limits reserved (GiB·s, derived: "
                     "∫ limit dt over the steps' recorded durations, summed over traces), one point per sweep value; "
                     "where the run replayed both recorded and 1 Hz-derived profiles, one series per arm and corpus "
                     "(filled: recorded, hollow: derived) and an arrow from each derived point to its recorded one."))
    deltas = ablation_deltas(tests, defaults)
    if not deltas.empty:
        figs.append(("ablation.png", figures.ablation_deltas(deltas),
                     "Per sweep value: mean over traces × seeds minus the mean at the axis's default value (derived)."))
    for name, fig, _ in figs:
        figures.save(fig, out / "figures" / name)
    return Outputs([(name, caption) for name, _, caption in figs], deltas, reserve)


def slug(text: str) -> str:
    """A file name made of `text` (letters, digits, . _ -)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:80]


def write_columns(path: Path, columns) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["column", "unit", "better", "provenance", "source"])
        for c in columns:
            m = COLUMNS.get(c)
            w.writerow([c, m.unit, m.better, m.provenance, m.source] if m else [c, "", "", "", "key"])
