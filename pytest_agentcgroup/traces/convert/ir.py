"""Trace IR files read back (`agentcgroup-trace/1`: a trace, a list of traces, or JSONL), so that
`traces convert --to atif` takes our own traces (the corpus, profiled traces) as well as the public
formats. Each trace is taken as it is; a bad one is a TraceError naming file, record, step and field.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

from ..ir import SCHEMA, Trace, TraceError, parse_trace
from ._common import guard, head, iter_jsonl, load_json_file, strict

FORMAT = "ir"
_SCHEMA = re.compile(r'"schema"\s*:\s*"' + re.escape(SCHEMA) + '"')


def sniff(path: Path) -> bool:
    path = Path(path)
    return path.suffix in (".json", ".jsonl") and _SCHEMA.search(head(path).decode("utf-8", "replace")) is not None


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    path = Path(path)
    name = str(path)
    if path.suffix == ".jsonl":
        rows = iter_jsonl(path)
    else:
        data = load_json_file(path)
        rows = enumerate(data) if isinstance(data, list) else iter([(None, data)])
    for rec, row in rows:
        if isinstance(row, TraceError):
            yield row
            continue
        yield guard({"file": name, "record": rec}, lambda: parse_trace(row, file=name, record=rec))
