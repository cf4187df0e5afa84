"""SWE-agent rows of HF `nebius/SWE-agent-trajectories` -> trace IR.

Input: a JSON array of rows, JSONL, or parquet (needs pyarrow). A row has `instance_id` and
`trajectory`, a list of turns with `role` system/user/ai and `text` (the system turn has
`system_prompt` instead). Each `ai` turn is one step; its command is the **last fenced block** of the
text (SWE-agent's own parsing rule, nested fences respected). An `ai` turn without a fenced block is
kept as a `noop` step with `native_tool` "(no command)": SWE-agent answered it with a format error
and ran nothing.

What a command does (see `_swe_agent.aci_step_fields`): `open`/`goto`/`scroll_up`/`scroll_down` ->
`read`; `create`/`edit N:M ... end_of_edit` -> `edit`; `search_dir`/`search_file`/`find_file` ->
`search`; `submit` -> `noop`; anything else -> `bash` with the block as `command`. ACI steps keep the
raw text in `args.action` (never `args.command`: they are SWE-agent tools, not shell commands) plus
`op`, `path` (the open file for `edit`) and `start_line`/`end_line`; an edit also in the replay
editor's terms (SWE-agent 0.x's: the dataset's runs are of that series), the user turn after it (its
tool's answer) saying whether it applied there.

Working directory: every user turn ends with SWE-agent's prompt footer `(Open file: ...)` /
`(Current directory: ...)`, the state the *next* command runs in. So a step's `cwd` is the footer of
the user turn before it (the task turn for the first step, the previous command's output after
that), and the directory a command leaves behind is carried to the following steps. Rows have no
timestamps, so steps have no duration.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

from ..ir import Step, Trace, TraceError
from ._common import (check_str, fail, finish, head, id_part, iter_row_results, make_trace_id,
                      need, parquet_columns, parquet_schema_text, row_trajectory, strict)
from ._swe_agent import last_fenced_block, swe_agent_step, swe_footer

FORMAT = "swe-agent-rows"
COLUMNS = ("instance_id", "model_name", "trajectory")
_AI = re.compile(r'"role"\s*:\s*"ai"')


def sniff(path: Path) -> bool:
    path = Path(path)
    if path.suffix == ".parquet":
        cols = parquet_columns(path)
        return bool(cols) and "trajectory" in cols and "tool_calls" not in parquet_schema_text(path)
    if path.suffix not in (".json", ".jsonl"):
        return False
    text = head(path).decode("utf-8", "replace")
    return '"trajectory"' in text and _AI.search(text) is not None


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    """A Trace or a TraceError per row; a file that cannot be read at all raises."""
    return iter_row_results(path, FORMAT, COLUMNS, convert_row)


def convert_row(row: Any, where: dict, source: dict, rec: int) -> Trace:
    traj, instance = row_trajectory(row, where, empty="no turns")
    steps: list[Step] = []
    cwd: str | None = None
    open_file: str | None = None
    pending: tuple | None = None        # an ai turn's command, made a step once its answer is read

    def flush(observation: str | None) -> None:
        block, idx, tf, at_cwd, at_open = pending
        steps.append(swe_agent_step(block, idx, where, f"{tf}.text", cwd=at_cwd, open_file=at_open,
                                    observation=observation, v0=True))

    for ti, turn in enumerate(traj):
        tf = f"trajectory[{ti}]"
        if not isinstance(turn, dict):
            raise fail(f"expected a turn object, got {type(turn).__name__}", where, field=tf)
        role = need(turn, "role", str, where, prefix=f"{tf}.")
        if role == "user":
            text = turn.get("text")
            if pending is not None:
                flush(text if isinstance(text, str) else None)
                pending = None
            if isinstance(text, str):
                new_cwd, opened = swe_footer(text)
                if new_cwd is not None:
                    cwd = check_str(new_cwd, where, step=len(steps), field=f"{tf}.text")
                if "(Open file:" in text:
                    open_file = opened
            continue
        if role != "ai":
            continue
        if pending is not None:
            flush(None)
            pending = None
        idx = len(steps)
        text = need(turn, "text", str, where, step=idx, prefix=f"{tf}.")
        block = last_fenced_block(text)
        if block is None:
            steps.append(Step(step_id=idx, tool="noop", native_tool="(no command)", args={}))
            continue
        pending = (block.strip("\n"), idx, tf, cwd, open_file)
    if pending is not None:
        flush(None)
    if not steps:
        raise fail("empty trajectory: no ai turns", where, field="trajectory")
    return finish(make_trace_id(FORMAT, id_part(instance, f"row{rec}"), rec), source, steps, where)
