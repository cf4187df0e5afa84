"""Build the `real` subset: public coding-agent trajectories whose real commands replay in workspaces
built from PyPI.

    agentcgroup tools real-corpus TRAJS_DIR OUT_DIR

TRAJS_DIR holds mini-swe-agent 1.15's run of Gemini 3 Pro on SWE-bench Verified as its repository
keeps it (`<instance>/<instance>.traj.json`; ORIGIN, MIT). The subset takes the run's sympy tasks
from pull request SYMPY_FROM on: sympy 1.7 and later, whose sdists install and import on Python
3.11 as this project's sandbox has it (the earlier ones ran on 3.6-3.9 and need their own
interpreter), and whose environment is the sdist and mpmath. Each is converted
(traces/convert/mini_swe_agent.py), stamped with its origin and licence, and written to
OUT/mini-swe-agent/<instance>.json; OUT/manifest.json lists them as the subset `real` (other
families kept) and OUT/mini-swe-agent/README.md says where they came from. Deterministic: the same
input gives byte-identical output.

The workspaces are pinned afterwards, with network (the release each trajectory's views agree with
best, workspaces/choose.py):

    agentcgroup traces lock OUT/mini-swe-agent -o OUT/workspaces.lock.json
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..traces.convert import mini_swe_agent
from ..traces.convert._common import SAMPLE_SOURCES
from ..traces.corpus import read_manifest, update_manifest
from ..traces.error import TraceError
from ..traces.ir import Trace, write_trace

FAMILY = "mini-swe-agent"
RUN = "swebench_results/20251118_gemini-3-pro-74pct/trajs"
ORIGIN = SAMPLE_SOURCES[FAMILY]["origin"]          # gruckion/mini-swe-agent@<commit>
SYMPY = re.compile(r"^sympy__sympy-(\d+)$")
SYMPY_FROM = 20000


def chosen(trajs: Path) -> list[Path]:
    """The run's trajectories the subset takes (module docstring), in instance order."""
    out = []
    for d in sorted(trajs.iterdir()) if trajs.is_dir() else []:
        m = SYMPY.match(d.name)
        if m and int(m.group(1)) >= SYMPY_FROM and (d / f"{d.name}.traj.json").is_file():
            out.append(d / f"{d.name}.traj.json")
    return sorted(out, key=lambda p: int(SYMPY.match(p.parent.name).group(1)))


def stamped(trace: Trace, path: Path) -> Trace:
    """`trace` with the origin of its file in the run's repository, and the repository's licence."""
    instance = path.parent.name
    source = {**trace.source, "dataset": SAMPLE_SOURCES[FAMILY]["dataset"], "licence": SAMPLE_SOURCES[FAMILY]["licence"],
              "origin": f"{ORIGIN}:{RUN}/{instance}/{path.name}", "path": f"{RUN}/{instance}/{path.name}"}
    return dataclasses.replace(trace, source=source)


def build(trajs: Path, out: Path) -> list[dict]:
    """Convert, stamp and write the subset (module docstring); its manifest entries. TraceError
    naming the file for one that does not convert, or for a directory without the run's tasks."""
    files = chosen(trajs)
    if not files:
        raise TraceError(f"no sympy__sympy-N/sympy__sympy-N.traj.json with N >= {SYMPY_FROM} here "
                         f"(expected the run's trajs directory, {RUN})", file=str(trajs))
    traces = []
    for path in files:                  # all converted before anything is written
        results = list(mini_swe_agent.iter_results(path))
        bad = next((r for r in results if isinstance(r, TraceError)), None)
        if bad is not None:
            raise bad
        trace = stamped(results[0], path)
        if trace.trace_id != f"{FAMILY}/{path.parent.name}":
            raise TraceError(f"the trajectory is {trace.trace_id}, not the task its directory names", file=str(path))
        traces.append((path.parent.name, trace))
    (out / FAMILY).mkdir(parents=True, exist_ok=True)
    entries = []
    for instance, trace in traces:
        rel = f"{FAMILY}/{instance}.json"
        write_trace(trace, out / rel)
        entries.append({"trace_id": trace.trace_id, "file": rel, "instance": instance,
                        "steps": len(trace.steps), "bash_steps": sum(s.tool == "bash" for s in trace.steps)})
    written = {out / e["file"] for e in entries}
    for stale in (out / FAMILY).glob("*.json"):         # a task the selection no longer takes
        if stale not in written:
            stale.unlink()
    # written unprofiled: out of `recorded` until `traces profile` puts them back (docs/traces.md)
    recorded = [x for x in (read_manifest(out).get("subsets") or {}).get("recorded") or []
                if not x.startswith(f"{FAMILY}/")]
    update_manifest(out, f"{FAMILY}/", entries, {"real": [e["trace_id"] for e in entries], "recorded": recorded or None})
    (out / FAMILY / "README.md").write_text(readme(entries), encoding="utf-8")
    return entries


def readme(entries: list[dict]) -> str:
    rows = "\n".join(f"| `{e['trace_id']}` | {e['steps']} | {e['bash_steps']} |" for e in entries)
    return README.format(n=len(entries), origin=ORIGIN, run=RUN, sympy_from=SYMPY_FROM, rows=rows)


README = """\
# mini-swe-agent: the `real` subset

Generated by `agentcgroup tools real-corpus TRAJS_DIR traces` (the text lives in
`pytest_agentcgroup/tools/real_corpus.py`); edit that, not this file.

{n} trajectories of mini-swe-agent 1.15 with Gemini 3 Pro on SWE-bench Verified, converted to the
trace IR: the run's sympy tasks from pull request {sympy_from} on (sympy 1.7 and later, which install
and import on the sandbox's Python 3.11).

- **Origin**: `{origin}`, `{run}/<instance>/<instance>.traj.json`; each trace's `source.origin`
  names its file.
- **Licence**: MIT (the repository's `LICENSE.md`, Copyright (c) 2025 Kilian A. Lieret and Carlos E.
  Jimenez). The tasks are SWE-bench Verified's (MIT); sympy itself is BSD-3-Clause.
- **Workspaces**: `traces/workspaces.lock.json` pins each task's sympy sdist and its wheels by
  sha256 (`agentcgroup traces lock traces/mini-swe-agent -o traces/workspaces.lock.json`); the
  release is the one whose files agree best with what the trajectory's shell showed of them
  (`chosen_by` in the lock gives every candidate's figures). The first replay builds them into the
  cache from PyPI; later ones need no network.
- **Recorded**: each step's command, exit code and the head of its output (1,000 characters), as
  the trajectory has them (it has no durations or resource use). This tool writes them so (and
  takes them out of the subset `recorded`); the shipped ones were then profiled here, in their
  workspaces under the `sandbox` executor (subset `recorded`: `agentcgroup traces profile`,
  docs/traces.md, "The recorded corpus"): each executed
  step's duration, the kernel's memory peak, a memory curve sampled every 4 ms, CPU time and
  outcome, `recorded`, with the machine and the command in `source.profiled`.

| trace | steps | bash steps |
|---|---|---|
{rows}
"""
