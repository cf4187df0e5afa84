"""The static report: OUT/index.html with a summary, the figures and a sortable table of runs;
OUT/runs.csv (a row per trace × arm × seed × params), OUT/columns.csv (each column's unit,
direction and provenance), OUT/figures/*.png, OUT/assets/ (CSS, a small sortable-table script).
No network: everything is local files.

    from pytest_agentcgroup.reports import build_report
    build_report("results", "report", config="experiments/agentcgroup.toml")
"""
from __future__ import annotations

import datetime as dt
import html
import json
import shutil
from collections import Counter
from pathlib import Path

from ..metrics.records import summarize
from .frames import COLUMNS, Results, ResultsError, load
from .outputs import arm_limits, memory_traces, write_outputs

ASSETS = Path(__file__).with_name("assets")
#: Columns of the per-arm summary: (key of metrics.records.summarize, heading)
SUMMARY = [("traces", "traces"), ("total_steps", "steps"), ("latency_p50_ms", "p50 latency"),
           ("latency_p95_ms", "p95 latency"), ("latency_p99_ms", "p99 latency"), ("oom_kills", "OOM kills"),
           ("mem_max_events_total", "hard-limit hits"), ("mem_high_events_total", "soft-limit breaches"),
           ("timeouts", "timeouts"), ("throttles_total", "throttles"), ("freezes_total", "freezes"),
           ("policy_kills_total", "policy kills"), ("pids_max_events_total", "forks refused"),
           ("mem_stall_s_total", "waited for memory")]
HEADINGS = {"run": "results dir", "experiment": "experiment", "trace_id": "trace", "config": "arm",
            "seed": "seed", "params": "params", "executor": "executor", "profiles": "step profiles",
            "total_steps": "steps",
            "executed_steps": "executed", "failed_steps": "failed", "latency_p50_ms": "p50 latency",
            "latency_p95_ms": "p95 latency", "latency_p99_ms": "p99 latency", "latency_total_ms": "total latency",
            "cpu_total_ms": "CPU time", "peak_rss_mb": "peak memory", "mem_high_events_total": "soft-limit breaches",
            "mem_max_events_total": "hard-limit hits", "oom_kills": "OOM kills", "timeouts": "timeouts",
            **{k: h for k, h in SUMMARY if k.endswith("_total")},
            "step_time_s": "tool time", "reserved_gib_s": "reserved", "ceiling_reserved_gib_s": "reserved at ceiling",
            "soft_reserved_gib_s": "reserved at soft limit", "used_gib_s": "used", "utilization": "utilization",
            "idle_reserved_gib_s": "idle reserved", "oracle_gib_s": "oracle", "reserved_vs_oracle": "× oracle"}


def build_report(dirs, out: str | Path = "report", *, config: str | Path | None = None,
                 traces: list[str] | None = None, defaults: dict | None = None,
                 characterize: list[str | Path] | None = None) -> Path:
    """Build the report of one or more results directories into `out`; returns index.html's path.
    `config` (an experiment config file) gives the arms' limits for the memory figure; `traces`
    picks that figure's traces (default: the three with most OOM kills / limit hits / memory);
    `defaults` names each sweep axis's default value for the ablation deltas. A second page,
    OUT/characterization.html, characterizes the IR traces at `characterize` (files or
    directories), else the config's corpus; with neither there is no such page."""
    res = load(dirs)
    outs = write_outputs(res, out, config=config, traces=traces, defaults=defaults)
    out = Path(out)
    (out / "assets").mkdir(exist_ok=True)
    for asset in ("sortable.js", "report.css"):
        shutil.copyfile(ASSETS / asset, out / "assets" / asset)
    char_from = [Path(p) for p in characterize] if characterize else (
        [_config_corpus(config)] if config is not None else [])
    char_page = out / "characterization.html"
    if char_page.exists():
        char_page.unlink()                           # never leave an earlier report's page behind
    if char_from:
        char_page.write_text(_characterization_page(char_from, out), encoding="utf-8")
    index = out / "index.html"
    index.write_text(_page(res, res.tests, outs.figures, outs.deltas, config, char_from, outs.reserve),
                     encoding="utf-8")
    return index


def _config_corpus(config: str | Path) -> Path:
    from ..config import ConfigError, load as load_config
    try:
        return load_config(config).traces
    except ConfigError as exc:
        raise ResultsError(str(exc)) from None


def _characterization_page(paths: list[Path], out: Path) -> str:
    """OUT/characterization.html: `traces characterize` of the traces at `paths`, as HTML tables,
    and, for profiled traces that keep their source's 1 Hz profile, `traces sampling` with its
    figure (OUT/figures/sampling_peaks.png)."""
    from ..traces.characterize import (characterize, comparison_rows, header, kind_rows, load_traces,
                                       recorded_heading, recorded_rows)
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        raise ResultsError(f"characterization: no such file or directory: {', '.join(missing)}")
    traces, errors = load_traces(paths)
    if errors:
        raise ResultsError(f"characterization: {errors[0]}")
    res = characterize(traces)

    def f(v):
        return "n/a" if v is None else f"{v:g}"
    kinds = "".join(f"<tr><td>{e(k)}</td><td>{a['n']}</td><td>{f(a['p50'])}</td><td>{f(a['p95'])}</td>"
                    f"<td>{f(a['max'])}</td><td>{b['n']}</td><td>{f(b['p50'])}</td><td>{f(b['p95'])}</td>"
                    f"<td>{f(b['max'])}</td></tr>" for k, a, b in kind_rows(res))
    def beside_paper(rows, table_id: str) -> str:
        body = "".join("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in rows)
        return (f'<table id="{table_id}"><thead><tr><th>figure</th><th>ours (derived)</th><th>paper (published)</th>'
                f'<th>difference in definition</th></tr></thead><tbody>{body}</tbody></table>')
    comp = beside_paper(comparison_rows(res), "paper")
    rec = recorded_rows(res)
    rec = (f'<h3>From recorded step curves</h3>\n<p class="note">{e(recorded_heading(res))}</p>\n'
           + beside_paper(rec, "paper-recorded")) if rec else ""
    hz = _sampling_section(traces, out)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>pytest-agentcgroup: trace characterization</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="assets/report.css">
</head><body>
<h1>Trace characterization</h1>
<p><a href="index.html">back to the report</a></p>
<dl class="facts"><dt>traces from</dt><dd>{e(", ".join(map(str, paths)))}</dd></dl>
{"".join(f'<p class="note">{e(line)}</p>' for line in header(res))}
<h2>Memory peak per step kind (MiB, derived)</h2>
<p class="note">delta = the step's peak_mb, memory over the container's memory just before the call; absolute =
that baseline + peak_mb (only for traces whose source carries the container summary).</p>
<table id="kinds"><thead><tr><th>kind</th><th>delta n</th><th>P50</th><th>P95</th><th>max</th>
<th>absolute n</th><th>P50</th><th>P95</th><th>max</th></tr></thead><tbody>{kinds}</tbody></table>
<h2>Beside the AgentCgroup paper</h2>
{comp}
{rec}
{hz}
</body></html>
"""


def _sampling_section(traces, out: Path) -> str:
    """The derived (1 Hz) against recorded section: '' when no step has both profiles."""
    from ..traces.sampling import MISSED_MB, compare, format_table, peaks
    from .figures import sampling_peaks, save
    res = compare(traces)
    if res["steps"] == 0:
        return ""
    (out / "figures").mkdir(parents=True, exist_ok=True)
    save(sampling_peaks(peaks(traces), MISSED_MB), out / "figures" / "sampling_peaks.png")
    return (f'<h2>What 1 Hz sampling hid (recorded here against derived from the source\'s samples)</h2>\n'
            f'<p><img src="figures/sampling_peaks.png" alt="step peaks, recorded against derived"></p>\n'
            f'<pre id="sampling">{e(format_table(res))}</pre>')


# ---------------------------------------------------------------------------------------------
# HTML

e = html.escape


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _th(key: str, heading: str, numeric: bool) -> str:
    kind = ' data-type="number"' if numeric else ""
    m = COLUMNS.get(key)
    if m is None:
        return f"<th{kind}>{e(heading)}</th>"
    return (f'<th{kind} title="{e(m.source)}; {e(m.better)} is better">{e(heading)}'
            f'<span class="unit">{e(m.unit)} · {e(m.provenance)}</span></th>')


def _td(value, key: str, numeric: bool) -> str:
    if value is None or value != value:          # None or NaN
        return '<td class="num" data-value=""></td>' if numeric else "<td></td>"
    if not numeric:
        return f"<td>{e(str(value))}</td>"
    shown = f"{value:.1f}" if isinstance(value, float) else str(value)
    if isinstance(value, float) and (key in ("utilization", "reserved_vs_oracle") or key.endswith("_gib_s")) \
            and abs(value) < 10:
        shown = f"{value:.3g}"                   # small GiB·s and ratios: 3 significant digits, not 0.0
    bad = " bad" if key in ("oom_kills", "failed_steps", "timeouts", "policy_kills_total") and value else ""
    return f'<td class="num{bad}" data-value="{value}">{e(shown)}</td>'


def _table(rows: list[dict], keys: list[str], headings: dict[str, str], table_id: str) -> str:
    """A sortable table; a column whose values are all numbers (or empty) sorts numerically."""
    numeric = {k: all(_is_number(r.get(k)) or r.get(k) is None for r in rows) for k in keys}
    head = "".join(_th(k, headings.get(k, k), numeric[k]) for k in keys)
    body = "\n".join("<tr>" + "".join(_td(r.get(k), k, numeric[k]) for k in keys) + "</tr>" for r in rows)
    return f'<table class="sortable" id="{table_id}"><thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody></table>'


def arm_summaries(res: Results) -> list[dict]:
    """metrics.records.summarize per results dir × experiment × arm (seeds and params pooled)."""
    groups: dict[tuple, list[dict]] = {}
    for r in res.records:
        groups.setdefault((r["run"], r["experiment"], r["config"]), []).append(r)
    return [{"run": run, "experiment": exp, **summarize(recs, cfg),
             "points": len({json.dumps(r["params"], sort_keys=True) for r in recs})} for (run, exp, cfg), recs in groups.items()]


BASELINE_ARM = "unlimited"


def _headlines(summaries: list[dict]) -> str:
    """One line per arm: what it cost against the unlimited arm of the same run and experiment."""
    base = {(s["run"], s["experiment"]): s for s in summaries if s["config"] == BASELINE_ARM}
    items = []
    for s in summaries:
        b = base.get((s["run"], s["experiment"]))
        text = (f"<b>{e(s['config'])}</b> ({e(s['experiment'] or '-')}): {s['oom_kills']} OOM kill(s), "
                f"{s['mem_max_events_total']} hard-limit hit(s), {s['mem_high_events_total']} soft-limit breach(es) "
                f"(count, derived: sums of the kernel's per-step counts) over {s['traces']} trace(s), {s['total_steps']} step(s)"
                + (f" at {s['points']} sweep points" if s.get("points", 1) > 1 else ""))
        if s["latency_p95_ms"] is not None:
            text += f"; p95 step latency {s['latency_p95_ms']:.1f} ms"
            if b is not None and s is not b and b["latency_p95_ms"] is not None:
                text += f", {s['latency_p95_ms'] - b['latency_p95_ms']:+.1f} ms vs {BASELINE_ARM}"
            text += " (derived)"
        items.append(f"<li>{text}</li>")
    return '<ul class="headlines">' + "".join(items) + "</ul>"


def _reservation_section(reserve) -> str:
    """The per-arm (× sweep point) table of reserved, used, utilization and idle memory."""
    if reserve.empty or reserve["reserved_gib_s"].isna().all():
        return ""
    keys = (["run"] if reserve["run"].nunique() > 1 else []) + ["experiment", "config", "point"] \
        + (["profiles"] if reserve["profiles"].nunique() > 1 else []) + ["traces", "oom_kills",
                                                                   "reserved_gib_s", "reserved_vs_oracle",
                                                                   "oracle_gib_s", "used_gib_s", "utilization",
                                                                   "idle_reserved_gib_s", "ceiling_reserved_gib_s",
                                                                   "soft_reserved_gib_s", "step_time_s"]
    heads = {"run": "results dir", "config": "arm", "point": "sweep point", "profiles": "step profiles",
             "traces": "traces (count)",
             "oom_kills": "OOM kills (count, recorded)", "reserved_gib_s": "reserved (GiB·s)",
             "reserved_vs_oracle": "× oracle (reserved/oracle)", "oracle_gib_s": "oracle (GiB·s)",
             "used_gib_s": "used (GiB·s, sampled)", "utilization": "utilization (used/reserved)",
             "idle_reserved_gib_s": "idle reserved (GiB·s)", "ceiling_reserved_gib_s": "at the ceiling (GiB·s)",
             "soft_reserved_gib_s": "at the soft limit (GiB·s)", "step_time_s": "tool time (s)"}
    return ("<h2>Reserved and used memory per arm</h2>\n" + _table(reserve.to_dict("records"), keys, heads, "reservation")
            + '<p class="note">All derived (metrics/reservation.py), summed over the traces (means over seeds). '
              "Each level is a mean over the replayed step, held for the step's recorded duration (tool time). "
              "reserved = ∫ the arm's committed limit dt: "
              "the hard limit for static arms and bpf-soft (its ceiling), the envelope of the granted soft limit for "
              "agentcgroup (controller grant log), the trace's recorded peak for unlimited and static-high (a soft limit "
              "alone reserves nothing: what a scheduler would reserve); oracle = Σ each step's own recorded peak × its "
              "time, what a policy that knew the future would reserve (the same for every arm); × oracle = reserved / "
              "oracle over the steps with a recorded peak (1 = the oracle; lower is better); "
              "at the ceiling = ∫ memory_max dt; used = ∫ memory.current dt sampled every 20 ms; idle = "
              "Σ max(0, reserved − used) per step. Tool time only: model turns between tool calls are not replayed.</p>")


def _page(res: Results, tests, figs, deltas, config, char_from=(), reserve=None) -> str:
    summaries = arm_summaries(res)
    runs = sorted({r["run"] for r in res.records})
    axes = res.axes()
    seeds = sorted({r["seed"] for r in res.records})
    facts = [("results", ", ".join(runs)),
             ("files read", ", ".join(str(s) for s in res.sources)),
             ("experiments", ", ".join(sorted({r["experiment"] or "-" for r in res.records}))),
             ("arms", ", ".join(dict.fromkeys(r["config"] for r in res.records))),
             ("traces", f'{tests["trace_id"].nunique()} (count)'), ("seeds", ", ".join(map(str, seeds))),
             ("sweep axes", ", ".join(f"{k} ∈ {v}" for k, v in axes.items()) or "none"),
             ("step records", f"{len(res.records)} (count, recorded)"),
             ("executors", ", ".join(sorted({str(r.get("executor")) for r in res.records}))),
             ("replayed inputs", ", ".join(f"{k}: {v} steps" for k, v in sorted(Counter(
                 str(r.get("profile_source")) for r in res.records).items())) + " (provenance of the trace's profiles)"),
             ("arm limits", f"from {config}" if config else "not shown (no --config)"),
             ("trace characterization", f"characterization.html, of {', '.join(map(str, char_from))}" if char_from
              else "none (give --characterize or --config)"),
             ("generated", dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))]
    summary_keys = (["run"] if len(runs) > 1 else []) + ["experiment", "config"] + [k for k, _ in SUMMARY] \
        + (["points"] if any(s["points"] > 1 for s in summaries) else [])        # sums over an arm's sweep points
    run_keys = [k for k in tests.columns if k != "run" or len(runs) > 1]
    if not axes:
        run_keys.remove("params")
    figs_html = "\n".join(f'<figure><img src="figures/{e(n)}" alt="{e(cap)}"><figcaption>{e(cap)}</figcaption></figure>'
                          for n, cap in figs)
    ablation = ""
    if not deltas.empty:
        rows = deltas.to_dict("records")
        ablation = ("<h2>Ablation deltas</h2>\n" + _table(
            [{**r, "value": json.dumps(r["value"]), "default": json.dumps(r["default"]),
              "unit": f"{COLUMNS[r['metric']].unit} · derived"} for r in rows],
            ["axis", "value", "default", "config", "metric", "unit", "default_mean", "mean", "delta", "tests"],
            {"config": "arm", "tests": "tests (count)"}, "ablation")
            + '<p class="note">default_mean, mean, delta: in the unit given, derived: means over traces × seeds '
              "at that value of the axis.</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>pytest-agentcgroup report</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="assets/report.css">
</head><body>
<h1>pytest-agentcgroup report</h1>
<dl class="facts">{"".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in facts)}</dl>
<p class="note">Every number says its unit and provenance: <b>recorded</b> = counted by the kernel or the
wall clock in this run; <b>derived</b> = computed from recorded numbers (percentiles, sums);
<b>trace</b> = the replayed trace's own figure (recorded, derived or synthetic as the trace says).
Hover a column heading for where its number comes from; <a href="columns.csv">columns.csv</a> lists them.</p>
{'<p><a href="characterization.html">Trace characterization</a> (memory peaks per tool kind, beside the AgentCgroup paper)</p>' if char_from else ''}
<h2>Summary per arm</h2>
{_headlines(summaries)}
{_table(summaries, summary_keys, {"config": "arm", "run": "results dir", **dict(SUMMARY), "points": "sweep points (summed)"}, "summary")}
{_reservation_section(reserve) if reserve is not None else ""}
<h2>Figures</h2>
{figs_html}
{ablation}
<h2>Runs</h2>
<p class="note">One row per trace × arm × seed (× sweep params); click a heading to sort.
The same table: <a href="runs.csv">runs.csv</a>.</p>
{_table(tests.to_dict("records"), run_keys, HEADINGS, "runs")}
<script src="assets/sortable.js"></script>
</body></html>
"""


__all__ = ["build_report", "arm_limits", "arm_summaries", "memory_traces"]
