"""`agentcgroup tools recorded-outcomes DATASET CORPUS`: bring shipped IR files up to what their
sources record and the faithfulness rule says, without profiling anything again.

1. Every Claude Code trace under CORPUS (source.format claude-code: traces/claude-code and the
   profiled traces/claude-code-recorded) gets each Bash and edit step's `recorded_outcome` from
   DATASET/<source.path>/tool_calls.json, by the converter's own rule
   (traces/convert/claude_code_outcomes.py; the call at the step's index, whose command must be the
   step's); a step the preview does not tell keeps none (unknown).
2. Every profiled trace under CORPUS (source.profiled) gets `source.faithfulness`: its verdict by
   metrics/source_faithfulness.py, from the outcomes and durations stored with its profile (no
   replayed output is kept in a profiled trace: the output rule is not checked here).

A file is written only when it changes, in the layout it had (indented, or one line as `traces
profile` writes). Deterministic: run twice, the second run writes nothing.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from ..metrics.source_faithfulness import judge_trace
from ..traces.convert.claude_code import recorded_outcome
from ..traces.corpus import ir_files
from ..traces.ir import Trace, TraceError, read_traces, write_trace

TOOL_CALLS = "tool_calls.json"


class DatasetMissing(RuntimeError):
    """The source dataset is not where it was named."""


def _calls(dataset: Path, trace: Trace, cache: dict) -> list:
    rel = trace.source.get("path")
    if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
        raise TraceError(f"source.path {rel!r} does not name a task of the dataset", field="source.path")
    if rel not in cache:
        path = dataset / rel / TOOL_CALLS
        try:
            calls = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise TraceError(f"cannot read: {exc.strerror}", file=str(path)) from None
        except json.JSONDecodeError as exc:
            raise TraceError(f"invalid JSON: {exc.msg} (line {exc.lineno})", file=str(path)) from None
        if not isinstance(calls, list):
            raise TraceError(f"expected a JSON array of tool calls, got {type(calls).__name__}", file=str(path))
        cache[rel] = calls
    return cache[rel]


def with_recorded_outcomes(trace: Trace, calls: list, file: str) -> Trace:
    """`trace` with each Bash and edit step's recorded outcome from its tool call (module docstring)."""
    steps = []
    for s in trace.steps:
        if s.tool in ("bash", "edit"):
            call = calls[s.step_id] if 0 <= s.step_id < len(calls) and isinstance(calls[s.step_id], dict) else None
            inp = (call or {}).get("input")
            if call is None or (s.tool == "bash" and (not isinstance(inp, dict) or inp.get("command") != s.command)):
                raise TraceError(f"tool call {s.step_id} of the dataset is not this step (another command, or none)",
                                 file=file, step=s.step_id, field="args.command")
            s = replace(s, recorded_outcome=recorded_outcome(s.tool, s.args, call.get("result_preview")))
        steps.append(s)
    return replace(trace, steps=tuple(steps))


def with_verdict(trace: Trace) -> Trace:
    """A profiled trace with `source.faithfulness` (its verdict); another unchanged."""
    if not trace.source.get("profiled"):
        return trace
    return replace(trace, source={**trace.source, "faithfulness": judge_trace(trace).stored()})


def update(dataset: Path, corpus: Path) -> dict:
    """Apply 1 and 2 (module docstring) to the IR files under `corpus`; returns {"outcomes": files
    given recorded outcomes, "verdicts": files given a verdict, "written": files changed}. A bad
    file or a task missing from the dataset is a TraceError naming it."""
    if not dataset.is_dir():
        raise DatasetMissing(f"{dataset}: the Claude Code dataset is not there (a directory with "
                             f"<model>/<task>/{TOOL_CALLS})")
    if not corpus.is_dir():
        raise TraceError("not a directory", file=str(corpus))
    cache: dict = {}
    counts = {"outcomes": 0, "verdicts": 0, "written": 0}
    for path in ir_files([corpus]):
        text = path.read_text(encoding="utf-8")
        traces = list(read_traces(path))
        if len(traces) != 1:
            continue                      # the corpus ships one trace per file; others are not ours
        trace = new = traces[0]
        if trace.source.get("format") == "claude-code":
            new = with_recorded_outcomes(new, _calls(dataset, new, cache), str(path))
            counts["outcomes"] += 1
        if new.source.get("profiled"):
            new = with_verdict(new)
            counts["verdicts"] += 1
        if new == trace:
            continue
        if text.startswith("{\n"):
            write_trace(new, path)
        else:
            path.write_text(new.dumps() + "\n", encoding="utf-8")
        counts["written"] += 1
    return counts
