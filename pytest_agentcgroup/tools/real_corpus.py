"""Build the `real` subset: public coding-agent trajectories whose real commands replay in workspaces
built from PyPI.

    agentcgroup tools real-corpus TRAJS_DIR OUT_DIR [--openhands-rows FILE]

TRAJS_DIR holds mini-swe-agent 1.15's run of Gemini 3 Pro on SWE-bench Verified as its repository
keeps it (`<instance>/<instance>.traj.json`; ORIGIN, MIT). The tool takes the run's sympy tasks
(their environment is the sdist and mpmath): each is converted (traces/convert/mini_swe_agent.py),
stamped with its origin and licence, and written to OUT/mini-swe-agent/<instance>.json. Those from
pull request SYMPY_FROM on (sympy 1.7 and later, whose sdists install and import on the host's
Python 3.11) are the subset `real`; the earlier ones ran on Python 3.9 and are locked on a Debian
bullseye root's (workspaces/roots.py). FILE: the Agent Data Protocol's sample of
nebius/SWE-rebench-openhands-trajectories (ROWS_ORIGIN, CC-BY-4.0), whose rows go to
OUT/openhands-rows/<instance>/<row>.json; those whose source a PyPI sdist is go in `real`, the others
(DIVERGING says why) in `real-diverging`. OUT/manifest.json lists them (other families and their
subset members kept); each family's README.md says where it came from. Deterministic: the same input
gives byte-identical output.

The workspaces are pinned afterwards, with network (the release each trajectory's views agree with
best, workspaces/choose.py; those of Python 3.9 first, as the lock keeps what it has):

    agentcgroup traces lock OUT/mini-swe-agent/sympy__sympy-1*.json OUT/openhands-rows --python 3.9 -o OUT/workspaces.lock.json
    agentcgroup traces lock OUT/mini-swe-agent -o OUT/workspaces.lock.json

The tasks of `real` are then locked again as git checkouts of their base commits, from the store
the corpus ships (traces/sources/README.md gives the command and where each commit came from).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..traces.convert import mini_swe_agent, openhands_rows
from ..traces.convert._common import SAMPLE_SOURCES
from ..traces.corpus import read_manifest, update_manifest
from ..traces.error import TraceError
from ..traces.ir import Trace, write_trace

FAMILY = "mini-swe-agent"
RUN = "swebench_results/20251118_gemini-3-pro-74pct/trajs"
ORIGIN = SAMPLE_SOURCES[FAMILY]["origin"]          # gruckion/mini-swe-agent@<commit>
SYMPY = re.compile(r"^sympy__sympy-(\d+)$")
SYMPY_FROM = 20000
ROWS = "openhands-rows"
ROWS_SOURCE = SAMPLE_SOURCES["openhands-swe-rebench-row"]
ROWS_ORIGIN = ROWS_SOURCE["origin"]                # neulab/agent-data-protocol@<commit>
ROWS_PATH = "datasets/nebius_SWE-rebench-openhands-trajectories/sample_raw.json"
#: the rows whose task's source no PyPI sdist is, and why (measured: docs/workspaces.md): `real-diverging`
DIVERGING = {
    "PyPSA__linopy-79": "its task's commit lies between releases: no 0.0.x sdist takes any of the 5 edits "
                        "the trajectory made of existing files, and its later scripts fail on that",
    "tianocore__edk2-pytool-library-372": "the sdist has no tests.unit/, the directory the trajectory ran "
                                          "and grepped its tests in",
}


def chosen(trajs: Path) -> list[Path]:
    """The run's sympy trajectories (module docstring), in instance order."""
    out = []
    for d in sorted(trajs.iterdir()) if trajs.is_dir() else []:
        if SYMPY.match(d.name) and (d / f"{d.name}.traj.json").is_file():
            out.append(d / f"{d.name}.traj.json")
    return sorted(out, key=lambda p: int(SYMPY.match(p.parent.name).group(1)))


def stamped(trace: Trace, path: Path) -> Trace:
    """`trace` with the origin of its file in the run's repository, and the repository's licence."""
    instance = path.parent.name
    source = {**trace.source, "dataset": SAMPLE_SOURCES[FAMILY]["dataset"], "licence": SAMPLE_SOURCES[FAMILY]["licence"],
              "origin": f"{ORIGIN}:{RUN}/{instance}/{path.name}", "path": f"{RUN}/{instance}/{path.name}"}
    return dataclasses.replace(trace, source=source)


def _converted(results: list) -> list[Trace]:
    bad = next((r for r in results if isinstance(r, TraceError)), None)
    if bad is not None:
        raise bad
    return results


def build(trajs: Path, out: Path, rows: Path | None = None) -> list[dict]:
    """Convert, stamp and write the families (module docstring); their manifest entries. TraceError
    naming the file for one that does not convert, or for a directory without the run's tasks.
    Everything is converted before anything is written."""
    files = chosen(trajs)
    if not files:
        raise TraceError(f"no sympy__sympy-N/sympy__sympy-N.traj.json here (expected the run's trajs directory, {RUN})",
                         file=str(trajs))
    traces = []
    for path in files:
        trace = stamped(_converted(list(mini_swe_agent.iter_results(path)))[0], path)
        if trace.trace_id != f"{FAMILY}/{path.parent.name}":
            raise TraceError(f"the trajectory is {trace.trace_id}, not the task its directory names", file=str(path))
        traces.append((path.parent.name, trace))
    row_traces = []
    if rows is not None:
        for i, trace in enumerate(_converted(list(openhands_rows.iter_results(rows)))):
            instance = trace.trace_id.split("/")[1]
            source = {**trace.source, "dataset": ROWS_SOURCE["dataset"], "licence": ROWS_SOURCE["licence"],
                      "origin": f"{ROWS_ORIGIN}:{ROWS_PATH}#row{i}", "path": f"{ROWS_PATH}#row{i}"}
            row_traces.append((instance, dataclasses.replace(trace, source=source)))
    entries = _write(out, FAMILY, traces, real={t.trace_id for n, t in traces if int(SYMPY.match(n).group(1)) >= SYMPY_FROM})
    (out / FAMILY / "README.md").write_text(readme(entries), encoding="utf-8")
    if rows is not None:
        row_entries = _write(out, ROWS, row_traces, real={t.trace_id for n, t in row_traces if n not in DIVERGING},
                             diverging={t.trace_id for n, t in row_traces if n in DIVERGING})
        (out / ROWS / "README.md").write_text(rows_readme(row_entries), encoding="utf-8")
        entries += row_entries
    return entries


def _write(out: Path, family: str, traces: list[tuple[str, Trace]], *, real: set[str],
           diverging: set[str] | None = None) -> list[dict]:
    """Write one family's traces and its part of the manifest (its members of `real` and, given,
    `real-diverging`; out of `recorded` until profiled); its entries."""
    (out / family).mkdir(parents=True, exist_ok=True)
    entries = []
    for instance, trace in traces:
        rel = f"{trace.trace_id}.json"          # where `traces profile` writes it too (OUT/<trace_id>.json)
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        write_trace(trace, out / rel)
        entries.append({"trace_id": trace.trace_id, "file": rel, "instance": instance,
                        "steps": len(trace.steps), "bash_steps": sum(s.tool == "bash" for s in trace.steps)})
    written = {out / e["file"] for e in entries}
    for stale in (out / family).rglob("*.json"):        # a task the selection no longer takes
        if stale not in written:
            stale.unlink()
    old = read_manifest(out).get("subsets") or {}
    others = lambda name: [x for x in old.get(name) or [] if not x.startswith(f"{family}/")]    # noqa: E731
    # written unprofiled: out of `recorded` until `traces profile` puts them back (docs/traces.md)
    subsets = {"real": sorted([*others("real"), *real]), "recorded": others("recorded") or None}
    if diverging is not None:
        subsets["real-diverging"] = sorted([*others("real-diverging"), *diverging]) or None
    update_manifest(out, f"{family}/", entries, subsets)
    return entries


def readme(entries: list[dict]) -> str:
    rows = "\n".join(f"| `{e['trace_id']}` | {e['steps']} | {e['bash_steps']} |" for e in entries)
    return README.format(n=len(entries), origin=ORIGIN, run=RUN, sympy_from=SYMPY_FROM, rows=rows)


def rows_readme(entries: list[dict]) -> str:
    table = "\n".join(f"| `{e['trace_id']}` | {e['steps']} | {e['bash_steps']} | "
                       f"{'real-diverging: ' + DIVERGING[e['instance']] if e['instance'] in DIVERGING else 'real'} |"
                       for e in entries)
    return ROWS_README.format(n=len(entries), origin=ROWS_ORIGIN, path=ROWS_PATH, rows=table)


README = """\
# mini-swe-agent: SWE-bench Verified's sympy tasks

Generated by `agentcgroup tools real-corpus TRAJS_DIR traces` (the text lives in
`pytest_agentcgroup/tools/real_corpus.py`); edit that, not this file.

{n} trajectories of mini-swe-agent 1.15 with Gemini 3 Pro on SWE-bench Verified, converted to the
trace IR: the run's sympy tasks. Those from pull request {sympy_from} on (sympy 1.7 and later, which
install and import on the host's Python 3.11) are the subset `real`; the earlier ones are locked on
Python 3.9, a Debian bullseye root's, as SWE-bench's images ran them on 3.9.

- **Origin**: `{origin}`, `{run}/<instance>/<instance>.traj.json`; each trace's `source.origin`
  names its file.
- **Licence**: MIT (the repository's `LICENSE.md`, Copyright (c) 2025 Kilian A. Lieret and Carlos E.
  Jimenez). The tasks are SWE-bench Verified's (MIT); sympy itself is BSD-3-Clause.
- **Workspaces**: `traces/workspaces.lock.json` pins each task's source and its wheels by
  sha256 (`agentcgroup traces lock`, docs/workspaces.md). The `real` tasks (sympy 1.7 on) are
  sympy's repository at the task's base commit, with its `.git`, from the shipped store
  `traces/sources/sympy.git` (its README says where each commit came from); the earlier tasks are
  the sympy sdist whose files agree best with what the trajectory's shell showed of them
  (`chosen_by` in the lock gives every candidate's figures). The first replay builds them into the
  cache from the store, PyPI (and Debian, for the bullseye root); later ones need no network.
- **Recorded**: each step's command, exit code and the head of its output (1,000 characters), as
  the trajectory has them (it has no durations or resource use). This tool writes them so (and
  takes them out of the subset `recorded`); the shipped ones were then profiled here, in their
  workspaces under the `sandbox` executor (subset `recorded`: `agentcgroup traces profile`,
  docs/traces.md, "The recorded corpus"): each executed step's duration, the kernel's memory peak,
  a memory curve sampled every 4 ms, CPU time and outcome, `recorded`, with the machine and the
  command in `source.profiled`.

| trace | steps | bash steps |
|---|---|---|
{rows}
"""

ROWS_README = """\
# OpenHands on SWE-rebench: the Agent Data Protocol's three rows

Generated by `agentcgroup tools real-corpus TRAJS_DIR traces --openhands-rows FILE` (the text lives
in `pytest_agentcgroup/tools/real_corpus.py`); edit that, not this file.

{n} trajectories of OpenHands 0.54 with Qwen3-Coder-480B on SWE-rebench tasks: the rows of the
Hugging Face dataset nebius/SWE-rebench-openhands-trajectories that the Agent Data Protocol keeps
as its sample, converted to the trace IR (traces/convert/openhands_rows.py).

- **Origin**: `{origin}`, `{path}`; each trace's `source.origin` names its row.
- **Licence**: CC-BY-4.0 (the dataset's, as the Agent Data Protocol's README for it states).
- **Workspaces**: each task's PyPI sdist and wheels, pinned in `traces/workspaces.lock.json` on
  Python 3.9 (a Debian bullseye root's: the tasks' images ran 3.9), with `--python 3.9`.
- **Subsets**: a row whose workspace is its task's source is in `real`; the others are in
  `real-diverging`, because a replay of them cannot be faithful with a PyPI workspace (the table says
  why). Their replays fail `max_divergence`, naming the first diverging step.

| trace | steps | bash steps | subset |
|---|---|---|---|
{rows}
"""
