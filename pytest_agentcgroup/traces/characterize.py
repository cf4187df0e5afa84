"""Characterize a set of IR traces the way the AgentCgroup paper characterizes its agent runs.

    agentcgroup traces characterize [--json] PATHS...

What can be computed depends on what a trace carries (see ir.py and convert/claude_code.py):

* every profiled step has `peak_mb` = memory **over the step's baseline** (the container memory just
  before the call), `ramp_ms` and `cpu_ms`, all `derived` from ~1 Hz container samples, and a
  `recorded` `duration_ms`;
* claude-code traces also carry `source.container` (derived from the same samples: absolute memory
  min/mean/max, the share of samples near the maximum, memory change rates, mean CPU, and each
  step's baseline) and `source.agent_time_s` (recorded: the agent's whole run). Traces of other
  formats, or converted before these existed, have neither: the absolute rows then say "n/a".

Every figure is returned with its provenance: `derived` (computed from recorded data, as all of
ours are) or, for the paper's column, `published` (quoted from the paper, not recomputed here).

Definitions (ours):

* per step kind (classify.step_kind: a shell step's command kind test/install/build/vcs/search/
  fileops/other, else the tool: read/edit/search/python/browser/noop; `search` pools the Grep/Glob
  tools with grep/find commands): P50/P95/max of `peak_mb` over the steps that have one (delta), and
  of baseline + peak_mb (absolute container memory at the step's peak sample);
* `git status`: the same over bash steps whose command runs `git status`;
* peak-to-average per trace: absolute = container max / sample-mean memory; delta = the largest
  step peak / the duration-weighted mean step peak (memory over baseline while tools run);
* memory change rate: |dmem/dt| between consecutive container samples (MiB/s); per step growth =
  peak_mb / ramp_ms (MiB/s) over steps whose peak has a ramp > 0;
* tool time share: sum of step durations / the agent's run time (`agent_time_s`);
* average CPU: the container's sample-mean cpu_percent (100 = one core), and the tools' own
  sum(cpu_ms) / sum(duration_ms);
* static limit at peak: a limit fixed at the trace's absolute maximum stays idle for
  1 - mean/max of it on average (also for CPU, and for one memory limit shared by every trace, set
  at the largest peak); `near_peak_share` = share of samples at >= 90 % of the maximum.
"""
from __future__ import annotations

import re
import statistics
from typing import Any, Iterable, Sequence

from .classify import KINDS, step_kind
from .curves import recorded_figures
from .ir import Trace
from .stats import dist as _dist, quantile

#: The rows, in order: shell-command kinds first, then the non-shell tools.
STEP_KINDS = (*KINDS, "read", "edit", "python", "browser", "noop")
_GIT_STATUS = re.compile(r"(?:^|[\s;&|(])git\s+(?:-C\s+\S+\s+)?status\b")

#: The AgentCgroup paper's published figures (Haiku and GLM runs), with what each measures there.
PAPER = {
    "peak_to_average_max": {"haiku": 15.4, "what": "most extreme task: container peak / average memory"},
    "test_peak_p95_mb": {"haiku": 518.0, "glm": 234.0, "what": "P95 memory spike of pytest calls (MB)"},
    "git_status_peak_mb": {"haiku": 13.5, "what": "typical memory of a `git status` call (MB)"},
    "cpu_percent_mean": {"haiku": 13.2, "glm": 7.6, "what": "average container CPU, % of one core"},
    "static_limit_idle_share": {"haiku": 0.90, "what": "> 90 % of a limit set at the peak is idle"},
    "near_peak_share": {"haiku": 0.02, "what": "peak demand occurs < 2 % of the time"},
    "bursts_in_tool_calls": {"text": "98.5 %", "what": "share of > 300 MB memory bursts that occur inside tool calls"},
    "seconds_changing": {"text": "1.7-3.8 %", "what": "share of seconds whose memory changes by > 100 MB"},
}

#: Why our figure differs from the paper's even on the same runs (printed beside each row).
DIFFERENCES = {
    "test_peak_p95_mb": "ours: peak over the step's baseline (MiB, 2^20 B) from the samples in [start, end + 1 "
                        "period]; the paper's spike is in decimal MB; our data is a ~40 % subset of its tasks",
    "git_status_peak_mb": "ours is the delta over baseline: a ~1 s sample after a 50 ms call mostly shows the "
                          "agent runtime's own moves, not git's",
    "peak_to_average_max": "same definition (absolute, per task, most extreme task); our tasks are a subset",
    "cpu_percent_mean": "same samples; ours is the mean over traces of each trace's sample mean",
    "static_limit_idle_share": "ours: mean over traces of 1 - mean/max absolute memory of that trace (the rows "
                               "below: CPU; one limit for all traces at the largest peak); which resource and "
                               "limit the paper's > 90 % refers to we could not pin down",
    "near_peak_share": "ours: share of samples at >= 90 % of the trace's maximum (the paper's threshold "
                       "is not stated in what we read)",
}

#: The same for the figures taken from recorded step curves (traces/curves.py): tool time only, the
#: tools' own memory (their cgroup), sampled every few ms; the paper's: the whole container, ~1 Hz.
RECORDED_DIFFERENCES = {
    "peak_to_average_max": "ours: the tools' own memory (their cgroup, recorded curves) over tool time; the "
                           "paper's: the container's (agent runtime included) over the whole run, ~1 Hz",
    "near_peak_share": "ours: share of tool time at >= 90 % of the trace's largest recorded point, mean over "
                       "traces (P50 beside); the paper's threshold is not stated in what we read",
    "seconds_changing": "ours: 1 s windows over tool time (every trace), and the same seconds over the whole "
                        "agent run of the traces that record its length (no tool runs between calls); `1 s "
                        "readings` as a 1 Hz sampler, `within` the curve's range inside the second",
    "bursts_in_tool_calls": "ours records tool calls only, so every recorded burst is inside one by construction: "
                            "the count says how many there are, and how many the source's 1 Hz figures also saw",
}


def _container(trace: Trace) -> dict | None:
    c = trace.source.get("container")
    return c if isinstance(c, dict) and isinstance(c.get("mem_mb_max"), (int, float)) else None


def _baselines(trace: Trace) -> list:
    c = _container(trace)
    b = c.get("step_baseline_mb") if c else None
    return b if isinstance(b, list) and len(b) == len(trace.steps) else [None] * len(trace.steps)


def characterize(traces: Iterable[Trace]) -> dict[str, Any]:
    traces = list(traces)
    delta: dict[str, list[float]] = {k: [] for k in STEP_KINDS}
    absolute: dict[str, list[float]] = {k: [] for k in STEP_KINDS}
    git_delta: list[float] = []
    git_abs: list[float] = []
    growth: list[float] = []
    p2a_delta: list[float] = []
    tool_share: list[float] = []
    tool_cpu = [0.0, 0.0]                                  # cpu_ms, duration_ms over steps with both
    containers = []
    profiled = 0
    synthetic = 0
    peak_provenance: dict[str, int] = {}                   # the step peaks counted, by where they came from
    for t in traces:
        c = _container(t)
        if c:
            containers.append(c)
        peaks, weights = [], []
        for step, base in zip(t.steps, _baselines(t)):
            p = step.profile.peak_mb
            dur = step.duration_ms.value if step.duration_ms else None
            if step.profile.provenance() != "none":
                profiled += 1
            if step.profile.cpu_ms is not None and dur:
                tool_cpu[0] += step.profile.cpu_ms.value
                tool_cpu[1] += dur
            if p is None:
                continue
            if p.provenance == "synthetic":       # a made-up profile (noisy neighbours) is no observation
                synthetic += 1
                continue
            peak_provenance[p.provenance] = peak_provenance.get(p.provenance, 0) + 1
            kind = step_kind(step)
            kind = kind if kind in delta else "other"
            delta[kind].append(p.value)
            is_git_status = step.tool == "bash" and bool(_GIT_STATUS.search(step.command or ""))
            if is_git_status:
                git_delta.append(p.value)
            if isinstance(base, (int, float)):
                absolute[kind].append(base + p.value)
                if is_git_status:
                    git_abs.append(base + p.value)
            ramp = step.profile.ramp_ms
            if ramp is not None and ramp.value > 0 and p.value > 0:
                growth.append(p.value / (ramp.value / 1000.0))
            if dur is not None:
                peaks.append(p.value)
                weights.append(max(dur, 1.0))
        if peaks and max(peaks) > 0:
            mean = sum(p * w for p, w in zip(peaks, weights)) / sum(weights)
            if mean > 0:
                p2a_delta.append(max(peaks) / mean)
        agent = t.source.get("agent_time_s")
        if isinstance(agent, dict) and isinstance(agent.get("value"), (int, float)) and agent["value"] > 0:
            tool_ms = sum(s.duration_ms.value for s in t.steps if s.duration_ms)
            tool_share.append(min(1.0, tool_ms / 1000.0 / agent["value"]))

    p2a_abs = [c["mem_mb_max"] / c["mem_mb_mean"] for c in containers if c.get("mem_mb_mean")]
    idle = [1 - c["mem_mb_mean"] / c["mem_mb_max"] for c in containers if c.get("mem_mb_max")]
    near = [c["near_peak_share"] for c in containers if isinstance(c.get("near_peak_share"), (int, float))]
    cpu = [c["cpu_percent_mean"] for c in containers if isinstance(c.get("cpu_percent_mean"), (int, float))]
    cpu_idle = [1 - c["cpu_percent_mean"] / c["cpu_percent_max"] for c in containers
                if isinstance(c.get("cpu_percent_max"), (int, float)) and c["cpu_percent_max"] > 0]
    top = max((c["mem_mb_max"] for c in containers), default=0.0)
    pooled_idle = [1 - c["mem_mb_mean"] / top for c in containers] if top > 0 else []
    rate_max = [c["mem_rate_mb_s_max"] for c in containers if isinstance(c.get("mem_rate_mb_s_max"), (int, float))]
    rate_p95 = [c["mem_rate_mb_s_p95"] for c in containers if isinstance(c.get("mem_rate_mb_s_p95"), (int, float))]

    def mean(v, nd=3):
        return {"value": round(statistics.fmean(v), nd) if v else None, "n": len(v), "provenance": "derived"}

    models = sorted({str(t.source.get("model", "?")) for t in traces})
    return {
        "traces": len(traces), "steps": sum(len(t.steps) for t in traces), "profiled_steps": profiled,
        "traces_with_container": len(containers), "models": models, "synthetic_steps": synthetic,
        "peak_provenance": dict(sorted(peak_provenance.items())),
        "by_kind": {k: {"delta_mb": _dist(delta[k]), "absolute_mb": _dist(absolute[k])}
                    for k in STEP_KINDS if delta[k]},
        "git_status": {"delta_mb": _dist(git_delta), "absolute_mb": _dist(git_abs)},
        "peak_to_average": {"absolute": {**_dist(p2a_abs, 2), "mean": mean(p2a_abs, 2)["value"]},
                            "delta": {**_dist(p2a_delta, 2), "mean": mean(p2a_delta, 2)["value"]}},
        "mem_change_rate_mb_s": {"samples_max": _dist(rate_max, 1), "samples_p95_per_trace": _dist(rate_p95, 1),
                                 "step_growth": _dist(growth, 1)},
        "tool_time_share": mean(tool_share),
        "cpu_percent_mean": mean(cpu, 2),
        "tool_cpu_percent": {"value": round(100.0 * tool_cpu[0] / tool_cpu[1], 2) if tool_cpu[1] else None,
                             "provenance": "derived"},
        "static_limit_idle_share": mean(idle),
        "static_limit_idle_share_cpu": mean(cpu_idle),
        "static_limit_idle_share_one_limit": mean(pooled_idle),
        "near_peak_share": mean(near, 4),
        "recorded_curves": recorded_figures(traces),
        "paper": PAPER, "differences": DIFFERENCES,
    }


def paper_column(key: str, models: Sequence[str]) -> str:
    """The paper's figure for `key`, for the model family of these traces (haiku, else the GLM run
    that the upstream `local` runs are, else both)."""
    p = PAPER.get(key)
    if not p:
        return "-"
    if "text" in p:
        return p["text"]
    fams = {"haiku" if "haiku" in m.lower() else "glm" for m in models}
    shown = (lambda v: f"{_BOUNDS[key]} {100 * v:g} %") if key in _BOUNDS else (lambda v: f"{v:g}")
    vals = [f"{shown(p[f])} ({f})" for f in ("haiku", "glm") if f in p and (f in fams or not fams)]
    return ", ".join(vals) if vals else "-"


#: The paper's figures that are bounds on a share, as it states them.
_BOUNDS = {"static_limit_idle_share": ">", "near_peak_share": "<"}


def _f(v, unit=""):
    return "n/a" if v is None else f"{v:g}{unit}"


def kind_rows(res: dict[str, Any]) -> list[tuple[str, dict, dict]]:
    """(step kind, delta distribution, absolute distribution) rows, `git status` last."""
    rows = [(k, d["delta_mb"], d["absolute_mb"]) for k, d in res["by_kind"].items()]
    return rows + [("git status", res["git_status"]["delta_mb"], res["git_status"]["absolute_mb"])]


def comparison_rows(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, ours, the paper's, difference in definition) rows."""
    f = _f
    models = res["models"]
    g = res["git_status"]
    test = res["by_kind"].get("test", {"delta_mb": {"p95": None}, "absolute_mb": {"p95": None}})
    p2a = res["peak_to_average"]
    rate = res["mem_change_rate_mb_s"]
    rows = [
        ("peak_to_average_max", "memory peak/average, most extreme trace",
         f"{f(p2a['absolute']['max'], 'x')} abs, {f(p2a['delta']['max'], 'x')} delta"),
        (None, "memory peak/average, median trace",
         f"{f(p2a['absolute']['p50'], 'x')} abs, {f(p2a['delta']['p50'], 'x')} delta"),
        ("test_peak_p95_mb", "test-run (pytest...) peak P95, MiB",
         f"{f(test['delta_mb']['p95'])} delta, {f(test['absolute_mb']['p95'])} abs"),
        ("git_status_peak_mb", "git status peak P50, MiB",
         f"{f(g['delta_mb']['p50'])} delta, {f(g['absolute_mb']['p50'])} abs"),
        (None, "memory change rate, MiB/s: max", f"{f(rate['samples_max']['max'])} samples"),
        (None, "memory change rate, MiB/s: P95 (median trace)", f"{f(rate['samples_p95_per_trace']['p50'])} samples"),
        (None, "step memory growth peak/ramp, MiB/s: P50/P95",
         f"{f(rate['step_growth']['p50'])} / {f(rate['step_growth']['p95'])}"),
        (None, "share of agent run time spent in tools",
         f"{f(_pct(res['tool_time_share']['value']), '%')} (n={res['tool_time_share']['n']})"),
        ("cpu_percent_mean", "average CPU, % of one core (container)", f"{f(res['cpu_percent_mean']['value'], '%')}"),
        (None, "CPU while tools run, % of one core", f"{f(res['tool_cpu_percent']['value'], '%')}"),
        ("static_limit_idle_share", "idle share of a static limit at the peak",
         f"{f(_pct(res['static_limit_idle_share']['value']), '%')}"),
        (None, "  same, CPU limit at each trace's CPU peak", f"{f(_pct(res['static_limit_idle_share_cpu']['value']), '%')}"),
        (None, "  same, one memory limit at the set's peak",
         f"{f(_pct(res['static_limit_idle_share_one_limit']['value']), '%')}"),
        ("near_peak_share", "share of time near the peak (>= 90 %)",
         f"{f(_pct(res['near_peak_share']['value'], 2), '%')}"),
    ]
    out = []
    recorded = "derived" not in (res.get("peak_provenance") or {})
    for key, label, ours in rows:
        paper = paper_column(key, models) if key else "-"
        diff = DIFFERENCES.get(key, "") if key else ""
        if recorded and key in ("test_peak_p95_mb", "git_status_peak_mb"):     # profiled traces: no baseline
            ours = ours.replace(" delta", " own")
            diff = "ours: the kernel's peak of the step's own cgroup (recorded, MiB, 2^20 B); the paper's is in MB"
        out.append((label, ours, paper, diff))
    return out


def recorded_rows(res: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """The (figure, ours, the paper's, difference) rows taken from recorded step curves, [] without."""
    rc = res.get("recorded_curves")
    if not rc:
        return []
    f, models = _f, res["models"]
    p2a, near, sec = rc["peak_to_average"], rc["near_peak_share"], rc["seconds_changing"]
    rows = [
        ("peak_to_average_max", "memory peak/average, most extreme trace",
         f"{f(p2a['max'], 'x')} (median {f(p2a['p50'], 'x')})"),
        ("near_peak_share", "share of tool time near the peak (>= 90 %)",
         f"{f(_pct(near['mean'], 2), '%')} (P50 {f(_pct(near['p50'], 2), '%')})"),
        ("seconds_changing", f"seconds changing by > {rc['change_mb']:g} MiB, 1 s readings",
         f"{f(_pct(sec['ticks'], 2), '%')} of tool time, {f(_pct(sec['agent_ticks'], 3), '%')} of agent time "
         f"(n={sec['agent_traces']})"),
        ("seconds_changing", "  same, range within the second",
         f"{f(_pct(sec['within'], 2), '%')} of tool time, {f(_pct(sec['agent_within'], 3), '%')} of agent time "
         f"(n={sec['agent_traces']})"),
        ("bursts_in_tool_calls", f"bursts > {rc['burst_mb']:g} MiB inside tool calls",
         f"{rc['bursts']} step(s); 1 Hz saw {rc['bursts_seen_at_1hz']}"),
    ]
    return [(label, ours, paper_column(key, models), RECORDED_DIFFERENCES[key]) for key, label, ours in rows]


def recorded_heading(res: dict[str, Any]) -> str:
    rc = res["recorded_curves"]
    return (f"From the recorded step curves ({rc['curves']} steps of {rc['traces']} traces, every few ms, "
            "the tools' own memory over tool time; derived):")


def header(res: dict[str, Any]) -> list[str]:
    models = res["models"]
    skipped = (f"; {res['synthetic_steps']} step(s) with synthetic profiles left out"
               if res.get("synthetic_steps") else "")
    return [f"{res['traces']} trace(s), {res['steps']} step(s), {res['profiled_steps']} with a profile; "
            f"{res['traces_with_container']} with whole-container samples; models: {', '.join(models) or '-'}"
            + skipped,
            _peaks_said(res.get("peak_provenance") or {}) + " Our figures are computed from those (derived); the "
            "paper's are published figures, quoted. Paper column: its Haiku run for haiku traces, its GLM "
            "(local-model) run for the others (the upstream `local` runs, whose results.json says model qwen3)."]


def _peaks_said(counts: dict[str, int]) -> str:
    """Where the step peaks came from, as the traces say (Measure provenance)."""
    said = {"derived": "derived (memory over the step's baseline, from 1 Hz container samples)",
            "recorded": "recorded (the kernel's peak of the step's own cgroup, `agentcgroup traces profile`)"}
    parts = [f"{n} {said.get(k, k)}" for k, n in counts.items()]
    return f"Step peaks: {'; '.join(parts)}." if parts else "No step peaks."


def _peak_label(res: dict[str, Any]) -> str:
    kinds = set(res.get("peak_provenance") or {})
    return ("delta over baseline" if kinds == {"derived"} else "the step's own peak" if kinds == {"recorded"}
            else "step peak (derived: over baseline; recorded: own cgroup)")


def format_table(res: dict[str, Any]) -> str:
    """The characterization as text: our figure, its provenance, the paper's, and the definition gap."""
    f = _f
    lines = header(res) + ["", f"Memory peak per step kind (MiB)      {_peak_label(res)}: P50 / P95 / max (n)   |  "
                               "absolute: P50 / P95 / max"]
    for kind, a, b in kind_rows(res):
        lines.append(f"  {kind:<10} {f(a['p50']):>7} / {f(a['p95']):>7} / {f(a['max']):>7}  ({a['n']:>4})"
                     f"        |  {f(b['p50'])} / {f(b['p95'])} / {f(b['max'])}")
    lines.append("")
    if res.get("recorded_curves"):
        lines.append(f"From the step peaks above and the sources' ~1 Hz container samples "
                     f"({res['traces_with_container']} traces):")
    lines.append(f"{'figure':<46} {'ours (derived)':<26} {'paper (published)':<22} difference in definition")
    for label, ours, paper, diff in comparison_rows(res):
        lines.append(f"{label:<46} {ours:<26} {paper:<22} {diff}")
    if res.get("recorded_curves"):
        lines += ["", recorded_heading(res)]
        for label, ours, paper, diff in recorded_rows(res):
            lines.append(f"{label:<46} {ours:<48} {paper:<14} {diff}")
    return "\n".join(lines)


def load_traces(paths: Iterable) -> tuple[list[Trace], list[str]]:
    """IR traces from files and directories (corpus.ir_files), and an error line per file that did
    not read."""
    from .corpus import ir_files
    from .ir import TraceError, read_traces
    traces, errors = [], []
    for f in ir_files(paths):
        try:
            traces.extend(read_traces(f))
        except TraceError as exc:
            errors.append(str(exc))
    return traces, errors


def _pct(v, nd=1):
    return None if v is None else round(100.0 * v, nd)
