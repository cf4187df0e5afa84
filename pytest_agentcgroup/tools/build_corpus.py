"""Build the shipped trace corpus from the agentcgroup-claude-code dataset.

    agentcgroup tools build-corpus SRC_DIR OUT_DIR

SRC_DIR is the dataset root (`<model>/<task>/tool_calls.json` ...); OUT_DIR receives
`claude-code/<model>/<task>.json` (one IR trace each), `manifest.json` and `README.md`.
Everything is deterministic: the same input gives byte-identical output.

Descriptive manifest keys per trace (see `describe`): model, steps, bash_steps, length, category,
kinds, bursty, peak_mb, steps_over_mb, total_step_ms, cpu_ms.

Subsets (see `select_smoke` / `select_dev`): `smoke` (<= 5 traces, <= SMOKE_BUDGET_MS of recorded
step time, includes the largest-peak trace that fits half the budget), `dev` (12-20 traces chosen
facet by facet), `full` (all).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from ..traces import noisy
from ..traces.classify import KINDS, classify_command, dominant_kind
from ..traces.convert import claude_code
from ..traces.corpus import update_manifest
from ..traces.ir import Trace, write_trace
from ..traces.shape import LONG_MIN, SHORT_MAX, is_bursty, length_class, step_peaks
from ..traces.sweep import paper_subset

THRESHOLDS_MB = (128, 256, 512, 1024)
BIG_STEP_MB = 150.0                     # README lists every step above this (MiB)
SMOKE_MAX, SMOKE_BUDGET_MS = 5, 600_000.0
SMOKE_MIN_STEPS, SMOKE_MIN_BASH = 10, 3
DEV_MAX = 20


def describe(trace: Trace, file: str) -> dict[str, Any]:
    bash = [s for s in trace.steps if s.tool == "bash"]
    cmds = [s.command or "" for s in bash]
    durs = [s.duration_ms.value if s.duration_ms else 0.0 for s in bash]
    kinds = {k: 0 for k in KINDS}
    for c in cmds:
        kinds[classify_command(c)] += 1
    peaks = step_peaks(trace)
    return {
        "trace_id": trace.trace_id,
        "file": file,
        "model": trace.source.get("model"),
        "steps": len(trace.steps),
        "bash_steps": len(bash),
        "length": length_class(len(trace.steps)),
        "category": dominant_kind(cmds, durs),
        "kinds": {k: v for k, v in kinds.items() if v},
        "bursty": is_bursty(peaks),
        "peak_mb": max(peaks, default=0.0),
        "steps_over_mb": {str(t): sum(p > t for p in peaks) for t in THRESHOLDS_MB},
        "total_step_ms": round(sum(s.duration_ms.value for s in trace.steps if s.duration_ms)),
        "cpu_ms": round(sum(s.profile.cpu_ms.value for s in trace.steps if s.profile.cpu_ms)),
    }


# ---------------------------------------------------------------------------------------------
# Subset selection (deterministic: every ordering ends with trace_id)

def select_smoke(entries: list[dict]) -> list[str]:
    """<= SMOKE_MAX traces with <= SMOKE_BUDGET_MS recorded step time in total.

    1. Anchor: the trace with the largest step peak among those using <= half the budget.
    2. Then, while there is room, add the eligible trace (>= SMOKE_MIN_STEPS steps, >= SMOKE_MIN_BASH
       bash steps, fits the remaining budget) that adds the most of: a new category, a new length
       class, a new model, a bursty trace while fewer than 2 are in; ties go to less recorded time.
    """
    by_id = {e["trace_id"]: e for e in entries}
    fits = [e for e in entries if e["total_step_ms"] <= SMOKE_BUDGET_MS / 2]
    anchor = max(fits, key=lambda e: (e["peak_mb"], -e["total_step_ms"], _neg(e["trace_id"])))
    chosen = [anchor["trace_id"]]
    while len(chosen) < SMOKE_MAX:
        sel = [by_id[t] for t in chosen]
        used = sum(e["total_step_ms"] for e in sel)

        def gain(e: dict) -> int:
            return ((e["category"] not in {x["category"] for x in sel})
                    + (e["length"] not in {x["length"] for x in sel})
                    + (e["model"] not in {x["model"] for x in sel})
                    + (e["bursty"] and sum(x["bursty"] for x in sel) < 2))

        cands = [e for e in entries if e["trace_id"] not in chosen and e["steps"] >= SMOKE_MIN_STEPS
                 and e["bash_steps"] >= SMOKE_MIN_BASH and used + e["total_step_ms"] <= SMOKE_BUDGET_MS]
        if not cands:
            break
        best = min(cands, key=lambda e: (-gain(e), e["total_step_ms"], e["trace_id"]))
        chosen.append(best["trace_id"])
    return chosen


def _neg(s: str) -> tuple:
    return tuple(-ord(c) for c in s)


#: dev facets: (name, how many, filter, sort key). Each facet adds its best traces not yet chosen.
DEV_FACETS: list[tuple[str, int, Any, Any]] = [
    ("large memory step (>= 1 GiB)", 3, lambda e: e["peak_mb"] >= 1024, lambda e: (-e["peak_mb"], e["trace_id"])),
    ("bursty 200 MiB-1 GiB", 2, lambda e: e["bursty"] and 200 <= e["peak_mb"] < 1024,
     lambda e: (-e["peak_mb"], e["trace_id"])),
    ("short (10-20 steps), CPU/test", 2, lambda e: 10 <= e["steps"] <= SHORT_MAX and e["category"] == "test",
     lambda e: (-e["cpu_ms"], e["trace_id"])),
    ("long (50+ steps), CPU/test", 2, lambda e: e["steps"] >= LONG_MIN and e["category"] == "test",
     lambda e: (-e["cpu_ms"] / max(e["total_step_ms"], 1), e["trace_id"])),
    ("install/memory", 2, lambda e: e["kinds"].get("install", 0) >= 3,
     lambda e: (e["category"] != "install", -e["kinds"].get("install", 0), -e["peak_mb"], e["trace_id"])),
    ("IO (search/vcs)", 2, lambda e: e["kinds"].get("search", 0) + e["kinds"].get("vcs", 0) >= 10,
     lambda e: (-(e["kinds"].get("search", 0) + e["kinds"].get("vcs", 0)) / max(e["bash_steps"], 1), e["trace_id"])),
    ("short, other categories", 2, lambda e: 10 <= e["steps"] <= SHORT_MAX and e["category"] != "test",
     lambda e: (-e["bash_steps"], e["trace_id"])),
]


def select_dev(entries: list[dict], smoke: list[str]) -> list[str]:
    """The smoke traces, then each DEV_FACETS facet's best traces not yet chosen (<= DEV_MAX)."""
    chosen = list(smoke)
    for _name, count, keep, key in DEV_FACETS:
        for e in sorted((e for e in entries if keep(e) and e["trace_id"] not in chosen), key=key)[:count]:
            if len(chosen) < DEV_MAX:
                chosen.append(e["trace_id"])
    return chosen


# ---------------------------------------------------------------------------------------------

def peak_distribution(traces: Iterable[Trace], *, bash_only: bool = False) -> dict[str, int]:
    peaks = [s.profile.peak_mb.value for t in traces for s in t.steps
             if s.profile.peak_mb is not None and (not bash_only or s.tool == "bash")]
    out = {"steps": len(peaks)}
    out.update({f">{t}MB": sum(p > t for p in peaks) for t in THRESHOLDS_MB})
    return out


def build(src: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    traces: dict[str, Trace] = {}
    entries = []
    for trace in claude_code.convert(src):
        model, task = trace.trace_id.split("/")[1:3]
        rel = f"claude-code/{model}/{task}.json"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        write_trace(trace, out / rel)
        traces[trace.trace_id] = trace
        entries.append(describe(trace, rel))
    entries.sort(key=lambda e: e["trace_id"])
    smoke = select_smoke(entries)
    dev = select_dev(entries, smoke)
    full = [e["trace_id"] for e in entries]
    paper = paper_subset(entries)             # spread of peaks for exp1's frontier (traces/sweep.py)
    noisy_ids = []
    for trace, rel in noisy.write(out):          # synthetic noisy neighbours: their own subset only
        entries.append(describe(trace, rel))
        noisy_ids.append(trace.trace_id)
    subsets = {"smoke": smoke, "dev": dev, "full": full, "noisy": noisy_ids, "paper": paper}
    # Other trace families (browser traces, ...) keep their manifest entries and subsets.
    update_manifest(out, ("claude-code/", "synthetic/"), entries, subsets)
    manifest = {"subsets": subsets,
                "traces": entries}
    stats = {name: {"all": peak_distribution(traces[t] for t in ids),
                    "bash": peak_distribution((traces[t] for t in ids), bash_only=True),
                    "recorded_s": round(sum(next(e for e in entries if e["trace_id"] == t)["total_step_ms"]
                                            for t in ids) / 1000, 1)}
             for name, ids in manifest["subsets"].items() if name != "noisy"}
    top_steps = sorted(((t, s) for t in manifest["subsets"]["full"] for s in traces[t].steps
                        if s.profile.peak_mb is not None and s.profile.peak_mb.value > BIG_STEP_MB),
                       key=lambda ts: (-ts[1].profile.peak_mb.value, ts[0], ts[1].step_id))
    (out / "README.md").write_text(render_readme(manifest, stats, top_steps), encoding="utf-8")
    return {"manifest": manifest, "stats": stats}


def render_readme(manifest: dict, stats: dict, top_steps: list) -> str:
    by_id = {e["trace_id"]: e for e in manifest["traces"]}

    def table(ids: list[str]) -> str:
        rows = ["| trace | steps | bash | length | category | bursty | max step peak MiB | steps "
                + "/".join(f">{t}" for t in THRESHOLDS_MB) + " MiB | recorded s |", "|---|---|---|---|---|---|---|---|---|"]
        for t in ids:
            e = by_id[t]
            o = e["steps_over_mb"]
            rows.append(f"| {t} | {e['steps']} | {e['bash_steps']} | {e['length']} | {e['category']} | "
                        f"{'yes' if e['bursty'] else 'no'} | {e['peak_mb']:.1f} | {'/'.join(str(o[str(t)]) for t in THRESHOLDS_MB)} | "
                        f"{e['total_step_ms'] / 1000:.1f} |")
        return "\n".join(rows)

    over = [f">{t}MB" for t in THRESHOLDS_MB]
    dist = ["| subset | traces | recorded step time s | steps with a peak | " + " | ".join(f"> {t} MiB" for t in THRESHOLDS_MB)
            + " | bash steps | " + " | ".join(f"bash > {t} MiB" for t in THRESHOLDS_MB) + " |",
            "|---" * (4 + 2 * len(THRESHOLDS_MB) + 1) + "|"]
    for name in ("smoke", "dev", "full"):
        a, b = stats[name]["all"], stats[name]["bash"]
        dist.append(f"| {name} | {len(manifest['subsets'][name])} | {stats[name]['recorded_s']} | {a['steps']} | "
                    + " | ".join(str(a[k]) for k in over) + f" | {b['steps']} | "
                    + " | ".join(str(b[k]) for k in over) + " |")
    subsets_of = {t: ",".join(n for n in ("smoke", "dev") if t in manifest["subsets"][n]) or "-" for t in by_id}
    big = ["| trace | step | tool | peak MiB | ramp s | duration s | cpu s | subsets | command |", "|---|---|---|---|---|---|---|---|---|"]
    for t, st in top_steps:
        p = st.profile
        big.append(f"| {t} | {st.step_id} | {st.native_tool} | {p.peak_mb.value:.1f} | {p.ramp_ms.value / 1000:.1f} | "
                   f"{st.duration_ms.value / 1000:.1f} | {p.cpu_ms.value / 1000 if p.cpu_ms else 0:.1f} | {subsets_of[t]} | "
                   f"`{(st.command or '').splitlines()[0][:60] if st.command else ''}` |")
    return README_TEMPLATE.format(n=len(manifest["subsets"]["full"]), origin_commit=claude_code.ORIGIN.split("@")[1],
                                  dist="\n".join(dist), big="\n".join(big), big_mb=BIG_STEP_MB, smoke=table(manifest["subsets"]["smoke"]),
                                  dev=table(manifest["subsets"]["dev"]))


README_TEMPLATE = """\
# Trace corpus

Generated by `agentcgroup tools build-corpus SRC_DIR OUT_DIR`; do not edit by
hand (this README is generated too; the text lives in `pytest_agentcgroup/tools/build_corpus.py`).

## What is here

{n} traces of real Claude Code agent runs on SWE-rebench task containers (model `haiku`, or a
locally served `qwen3` under `local/`), one IR file per run (schema `agentcgroup-trace/1`, see
`pytest_agentcgroup/traces/ir.py`): `claude-code/<model>/<task>.json`, trace id
`claude-code/<model>/<task>`. `manifest.json` lists every trace with descriptive keys (steps,
bash_steps, length, category, kinds, bursty, peak_mb, steps_over_mb, total_step_ms, cpu_ms) and the
subsets `smoke`, `dev`, `paper` (50 traces spread over memory peaks: `traces/sweep.py`) and `full`
(these four: Claude Code traces only) and `noisy`.

`synthetic/noisy-*.json` are noisy neighbours (subset `noisy`; made by
`pytest_agentcgroup/traces/noisy.py`, MIT, every number `synthetic`): `noisy-cpu` (stress-ng CPU
hog on 2 CPUs, 6 s), `noisy-alloc` (stress-ng keeping 768 MiB mapped and rewritten, 6 s),
`noisy-forkbomb` (a shell fork bomb, ended by its 5 s timeout) and `noisy-mix` (cpu, alloc, fork
bomb, cpu, alloc). The commands really run under the `sandbox` or `docker` executor; under
`emulate` the CPU and allocation steps replay their profile. Replay the fork bomb only under an arm
with `pids_max`.

## Origin and licence

- Source: the `agentcgroup-claude-code` dataset, copied byte-identically from
  https://github.com/yunwei37/agentcgroup at commit `{origin_commit}`, paths
  `experiments/all_images_<model>/<task>/attempt_1/{{tool_calls,resources,results}}.json`.
- Licence: the origin repository is GPL-2.0, and these traces are derived from its data, so
  **the files under this directory stay under GPL-2.0** (the package's own code is licensed
  separately). Every trace records `source.origin` and `source.licence`.

## How a trace was derived (short; full rules in `pytest_agentcgroup/traces/convert/claude_code.py`)

- One step per tool call, in order. Bash -> `bash` (command; cwd `/testbed`, which the source does
  not record but the SWE-rebench images use; timeout_ms from the call's timeout; `background` for
  run_in_background calls), Read -> `read`, Edit/Write/MultiEdit -> `edit` in full (the path, the
  texts, the byte size written: a replay applies them), NotebookEdit -> `edit` (the path and the
  byte size written, not applied), Grep/Glob -> `search`, everything else (TodoWrite, Task,
  BashOutput, KillShell, WebFetch, ...) and calls the runtime rejected (InputValidationError) ->
  `noop` with `native_tool` kept. Tool output (`result_preview`) is dropped.
- `duration_ms` (recorded) = end_timestamp - timestamp.
- Profile (derived) from the ~1 Hz container samples (`epoch` only; "0B / 0B" samples of the
  stopped container are ignored; P = median sample gap ~1.04 s; all sizes in MiB, the unit the
  replay allocates in: the source's "MB"/"GB" are decimal, so "2.041GB" is 1946.5 MiB):
  baseline = last sample at or before the step start; `peak_mb` = max(sample memory in
  [start, end + P]) - baseline, floored at 0; `ramp_ms` = start -> peak sample, clamped to
  [0, duration]; `cpu_ms` = integral of cpu_percent/100 over the step (each sample's rate held
  over the interval since the previous sample), capped at duration x CPUs seen. Fields that cannot
  be known are omitted, never invented.
- Caveat: the samples are of the whole container, agent runtime included. Steps shorter than a
  sample period see only the sample after them, so small peaks (tens of MiB, in some local runs up
  to ~200 MiB from the agent process itself) appear on read/edit/noop steps too.
- `source.container` (derived, from the same samples): the whole container's absolute memory
  (min, sample mean, max, MiB), the share of samples at >= 90 % of the maximum, |dmem/dt| between
  consecutive samples (P50/P95/max, MiB/s), the sample mean and max of cpu_percent, and
  `step_baseline_mb` (each step's baseline, so baseline + `peak_mb` is absolute memory).
  `source.agent_time_s` (recorded) is results.json `claude_time`, the agent's whole run. Both feed
  `agentcgroup traces characterize`.
- `category` = the bash-command kind (test/install/build/vcs/search/fileops/other, classifier in
  `pytest_agentcgroup/traces/classify.py`) with the most recorded bash time. `length`: short <= 20
  steps < medium < 50 <= long. `bursty`: some step's peak >= 3x the trace's median step peak and
  >= 100 MiB.

## Other trace families

Other families live in their own directories, each with its own README (origin, licence,
derivation) and builder, and keep their manifest entries when this corpus is rebuilt:
`playwright/` (browser traces, subset `browser`; Apache-2.0 converted + MIT recorded);
`mini-swe-agent/` (public SWE-bench trajectories replayed for real in workspaces pinned in
`workspaces.lock.json`, subsets `real` and `recorded`; MIT); `openhands-rows/` (OpenHands
trajectories on SWE-rebench, subsets `real`, `real-diverging` and `recorded`; CC-BY-4.0);
`claude-code-recorded/` (the Claude Code runs above whose task has a workspace, their commands
profiled here step by step, subset `recorded`; GPL-2.0 as their source). From `recorded`,
`agentcgroup traces sweep traces --from recorded --smoke recorded-smoke` draws `paper-recorded`,
`recorded-smoke` and `recorded-smoke-1hz` (those runs' twins from `claude-code/`, where they
exist) from the traces whose stored faithfulness verdict passes.

## Regenerate

    agentcgroup tools build-corpus /work/shared/datasets/agentcgroup-claude-code traces

Selection is deterministic (rules in `select_smoke` / `select_dev` of build_corpus.py).

## Derived step peaks (for picking a static per-step memory limit)

Counts of steps whose derived `peak_mb` exceeds each threshold. `peak_mb` is memory *over the
step's baseline*: the agent and its container already hold ~180-450 MB before a call, which is not
counted. Recorded step time is the sum of step durations (think time between calls excluded): at a
replay time scale of 0.05, smoke takes about 1/20 of its recorded seconds per arm.

{dist}

Steps over {big_mb:.0f} MiB (whole corpus):

{big}

## Subsets

`smoke` (<= 5 traces, <= 600 s recorded step time in total: the largest-peak trace that fits 300 s,
then traces adding a new category / length class / model / bursty trace, shortest first):

{smoke}

`dev` (12-20 traces: smoke, then facets: steps >= 1 GiB, bursty 200 MiB-1 GiB, short CPU/test, long
CPU/test, install-heavy, IO (search/vcs-heavy), short non-test):

{dev}

`full`: all {n} traces.
"""
