"""Parsing helpers shared by the converters (not a format of its own).

Decisions that hold for every converter (they are documented here once, and the tests pin them):

* **Errors.** Bad input raises :class:`TraceError` naming file, record (array index, JSONL line number
  or parquet row), step (index of the IR step being built) and field (a path into the source record,
  e.g. ``trajectory[37].tool_calls[0].function.arguments``). Nothing else escapes a converter.
* **Per-record errors.** Each converter module has ``iter_results(path)`` yielding a ``Trace`` or a
  ``TraceError`` per record, so a batch tool can report a bad record and still convert the rest of the
  file; ``convert(path)`` is the strict form that raises at the first bad record. A file that cannot
  be read or parsed at all (truncated JSON array, bad zip) raises from both.
* **Size caps.** Any string kept in a step's args (a command, code, a path, an edit's text) must be at
  most :data:`MAX_ARG_BYTES` (1 MiB, UTF-8). A 10 MB command is **refused** with a TraceError naming
  the field: agents' tool calls are orders of magnitude smaller, Linux refuses a single ``bash -c``
  argument above 128 KiB anyway, and replaying a multi-megabyte "command" would measure the
  replayer, not the agent (an edit text too big for an argument: its size, claude_code_edits.py).
  Whole-file JSON inputs are capped at :data:`MAX_JSON_FILE_BYTES`, one JSONL line at :data:`MAX_JSONL_LINE_BYTES`.
* **NUL bytes.** A raw NUL byte in a JSON file is reported as such (it is never valid JSON). A NUL
  inside a kept string (``"\\u0000"`` in a command or path) is refused: ``execve`` cannot pass it and
  no file name can hold it; NULs in text we do not keep (tool output) are ignored.
* **Numbers.** JSON ``NaN``/``Infinity`` and negative values are refused where we use a number
  (timeouts, durations).
* **Source and ids.** ``source.path`` is ``<parent folder>/<file name>`` (stable across machines).
  ``trace_id`` is ``<format>/<instance or file stem>[/<record index>]``; instance ids are sanitised to
  ``[A-Za-z0-9._-]`` and capped at 200 characters. Multi-record files (JSON arrays, JSONL, parquet)
  always carry the record index, so ids are unique within a file even when an instance repeats.
* **Licence and origin.** The public datasets' licences are taken from their READMEs (see
  ``shared/datasets``). A file converted from one of those sample folders (its folder's README.md names
  it) gets that folder's origin ``owner/repo@commit``; an HF-row file from anywhere gets the HF dataset's
  licence (CC-BY-4.0); any other file (your own OpenHands, SWE-agent or Playwright run) gets
  ``licence: "unknown"`` and ``origin: "unknown"``: a trace you recorded is not under the tool's licence.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..ir import Measure, Step, Trace, TraceError, check_trace
from ..task import Task

#: Largest string (UTF-8 bytes) kept in a step's args.
MAX_ARG_BYTES = 1 << 20
#: Largest JSON file loaded whole (JSON arrays, .traj, event-stream arrays).
MAX_JSON_FILE_BYTES = 512 << 20
#: Largest single JSONL line.
MAX_JSONL_LINE_BYTES = 128 << 20
#: How much of a file `sniff` reads.
SNIFF_BYTES = 1 << 20
#: How much of a step's recorded output a trace keeps (its head, in characters).
RECORDED_OUTPUT_CHARS = 1000

Where = dict  # {"file": str, "record": int | str | None}


def fail(message: str, where: Where, *, step: int | None = None, field: str | None = None) -> TraceError:
    """A TraceError at `where` (file/record), optionally naming step and field. Raise it."""
    return TraceError(message, file=where.get("file"), record=where.get("record"), step=step, field=field)


def short_path(path: Path) -> str:
    return f"{path.parent.name}/{path.name}" if path.parent.name else path.name


# ---------------------------------------------------------------------------------------------
# Reading files

def read_bytes(path: Path, *, limit: int = MAX_JSON_FILE_BYTES) -> bytes:
    name = str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}", file=name) from None
    if len(data) > limit:
        raise TraceError(f"file is over the {limit >> 20} MiB limit for a whole-file JSON input "
                         "(use JSONL or parquet for large row sets)", file=name)
    return data


def decode(data: bytes, where: Where) -> str:
    nul = data.find(b"\x00")
    if nul >= 0:
        raise fail(f"contains a NUL byte at byte offset {nul}", where)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"not UTF-8 text ({exc.reason} at byte {exc.start})", where) from None


def loads(text: str, where: Where) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail(f"invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", where) from None
    except RecursionError:
        raise fail("invalid JSON: nested too deeply", where) from None


def load_json_file(path: Path) -> Any:
    where = {"file": str(path)}
    return loads(decode(read_bytes(path), where), where)


def iter_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, decoded object or TraceError) for each non-blank line; file errors raise."""
    name = str(path)
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}", file=name) from None
    with fh:
        lineno = 0
        while True:
            try:
                line = fh.readline(MAX_JSONL_LINE_BYTES + 1)
            except OSError as exc:
                raise TraceError(f"cannot read: {exc.strerror or exc}", file=name) from None
            if not line:
                return
            lineno += 1
            where = {"file": name, "record": lineno}
            if len(line) > MAX_JSONL_LINE_BYTES and not line.endswith(b"\n"):
                # Skip the rest of the oversized line, then report it.
                while line and not line.endswith(b"\n"):
                    line = fh.readline(1 << 20)
                yield lineno, fail(f"line is over the {MAX_JSONL_LINE_BYTES >> 20} MiB limit", where)
                continue
            if not line.strip():
                continue
            try:
                yield lineno, loads(decode(line, where), where)
            except TraceError as exc:
                yield lineno, exc


def head(path: Path, n: int = SNIFF_BYTES) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(n)
    except OSError:
        return b""


def tail(path: Path, n: int = 4096) -> bytes:
    """The last `n` bytes of `path` (b"" when unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - n))
            return fh.read(n)
    except OSError:
        return b""


def iter_json_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """Rows of a JSON array file (index, row), a JSONL file (line number, row or TraceError), or a
    single JSON object (0, obj). A file-level problem raises."""
    if path.suffix == ".jsonl":
        yield from iter_jsonl(path)
        return
    data = load_json_file(path)
    if isinstance(data, list):
        yield from enumerate(data)
    elif isinstance(data, dict):
        yield 0, data
    else:
        raise TraceError(f"expected a JSON array of rows or an object, got {type(data).__name__}", file=str(path))


# ---------------------------------------------------------------------------------------------
# Checking values

def need(obj: Any, key: str, types, where: Where, *, step=None, field: str | None = None, prefix: str = "") -> Any:
    """obj[key], checked to be of `types` (bool never counts as a number)."""
    fname = field or f"{prefix}{key}"
    if not isinstance(obj, dict):
        raise fail(f"expected an object, got {type(obj).__name__}", where, step=step, field=prefix.rstrip(".") or None)
    if key not in obj:
        raise fail("missing", where, step=step, field=fname)
    return check_type(obj[key], types, where, step=step, field=fname)


def check_type(val: Any, types, where: Where, *, step=None, field=None) -> Any:
    types_t = types if isinstance(types, tuple) else (types,)
    if not isinstance(val, types_t) or (isinstance(val, bool) and bool not in types_t):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types_t)
        got = "null" if val is None else type(val).__name__
        raise fail(f"expected {names}, got {got}", where, step=step, field=field)
    return val


def need_items(doc: Any, key: str, where: Where, *, what: str, empty: str) -> list:
    """`doc[key]`, a non-empty list, of `doc` (which must be `what`); else one error naming the field."""
    if not isinstance(doc, dict):
        raise fail(f"expected {what}, got {type(doc).__name__}", where)
    items = need(doc, key, list, where)
    if not items:
        raise fail(empty, where, field=key)
    return items


def row_trajectory(row: Any, where: Where, *, empty: str) -> tuple[list, str | None]:
    """A row's `trajectory` (a list, or it as a JSON string as some exports store it) and `instance_id`."""
    if not isinstance(row, dict):
        raise fail(f"expected a row object, got {type(row).__name__}", where)
    traj = need(row, "trajectory", (list, str), where)
    if isinstance(traj, str):
        traj = check_type(loads(traj, where), list, where, field="trajectory")
    if not traj:
        raise fail(f"empty trajectory: {empty}", where, field="trajectory")
    if (instance := row.get("instance_id")) is not None:
        check_type(instance, str, where, field="instance_id")
    return traj, instance


def check_str(val: Any, where: Where, *, step=None, field=None) -> str:
    """A string we keep in step args: str, no NUL, at most MAX_ARG_BYTES."""
    check_type(val, str, where, step=step, field=field)
    if "\x00" in val:
        raise fail(f"contains a NUL character at offset {val.index(chr(0))}", where, step=step, field=field)
    if len(val) > MAX_ARG_BYTES:  # even one byte per character is too many
        raise fail(f"is over {MAX_ARG_BYTES:,} bytes, the limit for one step argument ({len(val):,} characters)",
                   where, step=step, field=field)
    try:
        size = len(val.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise fail(f"contains an unpaired surrogate at offset {exc.start}", where, step=step, field=field) from None
    if size > MAX_ARG_BYTES:
        raise fail(f"is {size:,} bytes, over the {MAX_ARG_BYTES:,}-byte limit for one step argument",
                   where, step=step, field=field)
    return val


def check_number(val: Any, where: Where, *, step=None, field=None, allow_str: bool = False) -> float:
    """A finite number >= 0 (a numeric string too when `allow_str`)."""
    if allow_str and isinstance(val, str):
        try:
            val = float(val.strip())
        except ValueError:
            raise fail(f"expected a number, got {val[:40]!r}", where, step=step, field=field) from None
    check_type(val, (int, float), where, step=step, field=field)
    if not math.isfinite(val) or val < 0:
        raise fail(f"expected a finite number >= 0, got {val!r}", where, step=step, field=field)
    return float(val)


def check_bool(val: Any, where: Where, *, step=None, field=None) -> bool:
    """A JSON bool, or the strings 'true'/'false' (OpenHands sends enums as strings)."""
    if isinstance(val, bool):
        return val
    if isinstance(val, str) and val.strip().lower() in ("true", "false"):
        return val.strip().lower() == "true"
    raise fail(f"expected true or false, got {val!r:.40}", where, step=step, field=field)


def recorded_ms(seconds: float) -> Measure:
    return Measure(round(seconds * 1000.0, 3), "recorded")


def output_head(text: str) -> str:
    """The first RECORDED_OUTPUT_CHARS characters of a recorded output, writable as UTF-8 (an
    unpaired surrogate, which JSON can carry and UTF-8 cannot, becomes '?')."""
    return text[:RECORDED_OUTPUT_CHARS].encode("utf-8", "replace").decode("utf-8")


# ---------------------------------------------------------------------------------------------
# Building traces

_ID_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def id_part(value: Any, fallback: str) -> str:
    s = value if isinstance(value, str) else ""
    s = _ID_BAD.sub("_", s).strip("_.")[:200]
    return s or fallback


def make_trace_id(fmt: str, name: str, record: int | None = None) -> str:
    return f"{fmt}/{name}" if record is None else f"{fmt}/{name}/{record}"


#: What the public datasets' READMEs say, keyed by the sample folder in shared/datasets.
SAMPLE_SOURCES = {
    "openhands-swe-rebench-row": {
        "dataset": "nebius/SWE-rebench-openhands-trajectories", "licence": "CC-BY-4.0",
        "origin": "neulab/agent-data-protocol@57c3046fb43ac059e7a52b7dea8016caabe6cb07"},
    "swe-agent-hf-rows": {
        "dataset": "nebius/SWE-agent-trajectories", "licence": "CC-BY-4.0",
        "origin": "zhu-yiqi/agent-data-protocol@05546b4fc77edbd6adeb297721592bb64dd03d02"},
    "openhands-events": {
        "dataset": "All-Hands-AI/OpenHands test fixtures and evaluation examples", "licence": "MIT",
        "origin": "All-Hands-AI/OpenHands@156d0686c46aafb0fa9d291da6421fb6f64dddc0"},
    "swe-agent-traj": {
        "dataset": "SWE-agent/SWE-agent demonstrations and test data", "licence": "MIT",
        "origin": "SWE-agent/SWE-agent@3ea751c087f32b16e039a2233dd6eefecef325d5"},
    "playwright-trace": {
        "dataset": "microsoft/playwright test assets", "licence": "Apache-2.0",
        "origin": "microsoft/playwright@d4e1023f6c03a8dced50eb3db88c2217e7c1a86a"},
    "mini-swe-agent": {
        "dataset": "mini-swe-agent 1.15 + Gemini 3 Pro on SWE-bench Verified (swebench_results)", "licence": "MIT",
        "origin": "gruckion/mini-swe-agent@d12a71affd95403b036b2bdbd827349b77bfffb9"},
}

#: Per-format defaults for files from anywhere else.
FORMAT_SOURCES = {
    "openhands-rows": {"dataset": "nebius/SWE-rebench-openhands-trajectories", "licence": "CC-BY-4.0",
                       "origin": "hf:nebius/SWE-rebench-openhands-trajectories"},
    "swe-agent-rows": {"dataset": "nebius/SWE-agent-trajectories", "licence": "CC-BY-4.0",
                       "origin": "hf:nebius/SWE-agent-trajectories"},
    "openhands-events": {"dataset": "OpenHands event stream", "licence": "unknown", "origin": "unknown"},
    "openhands-resolver": {"dataset": "OpenHands resolver output", "licence": "unknown", "origin": "unknown"},
    "swe-agent-traj": {"dataset": "SWE-agent trajectory", "licence": "unknown", "origin": "unknown"},
    "playwright": {"dataset": "Playwright trace", "licence": "unknown", "origin": "unknown"},
    "atif": {"dataset": "ATIF trajectory", "licence": "unknown", "origin": "unknown"},
    "mini-swe-agent": {"dataset": "mini-swe-agent trajectory", "licence": "unknown", "origin": "unknown"},
}

_README_CACHE: dict[Path, str] = {}


def _readme_mentions(path: Path) -> bool:
    readme = path.parent / "README.md"
    text = _README_CACHE.get(readme)
    if text is None:
        try:
            text = readme.read_text(encoding="utf-8", errors="replace")[:200_000]
        except OSError:
            text = ""
        _README_CACHE[readme] = text
    return path.name in text


def make_source(fmt: str, path: Path) -> dict:
    sample = SAMPLE_SOURCES.get(path.parent.name)
    base = sample if sample is not None and _readme_mentions(path) else FORMAT_SOURCES[fmt]
    return {"format": fmt, "dataset": base["dataset"], "path": short_path(path),
            "licence": base["licence"], "origin": base["origin"]}


def finish(trace_id: str, source: dict, steps: list[Step], where: Where, *, what: str = "trajectory",
           task: Task | None = None) -> Trace:
    """The Trace, checked against the IR schema (so a converter never emits an invalid trace)."""
    if not steps:
        raise fail("empty trajectory: no steps", where, field=what)
    trace = Trace(trace_id=trace_id, source=source, steps=tuple(steps), task=task)
    return check_trace(trace, file=where.get("file"), record=where.get("record"))


def guard(where: Where, fn: Callable[[], Trace]) -> Trace | TraceError:
    """Run one record's conversion, returning its TraceError instead of raising it. Any other
    exception is a converter bug and propagates (the fuzz tests rely on that)."""
    try:
        return fn()
    except TraceError as exc:
        return exc
    except RecursionError:
        return fail("input nested too deeply", where)


def iter_file_result(path: Path, fmt: str, convert_doc: Callable[[Any, Where, dict], Trace]
                     ) -> Iterator[Trace | TraceError]:
    """The one Trace (or its TraceError) of a whole-file JSON input, made by `convert_doc(data, where,
    source)`; a file unreadable as a whole raises."""
    path = Path(path)
    data = load_json_file(path)
    where = {"file": str(path)}
    yield guard(where, lambda: convert_doc(data, where, make_source(fmt, path)))


def strict(results: Iterable[Trace | TraceError]) -> Iterator[Trace]:
    for r in results:
        if isinstance(r, TraceError):
            raise r
        yield r


# ---------------------------------------------------------------------------------------------
# Parquet (optional: needs pyarrow, the `convert` extra)

PARQUET_MAGIC = b"PAR1"


def parquet_columns(path: Path) -> list[str] | None:
    """Column names of a parquet file, or None when it is not one / pyarrow is absent."""
    if head(path, 4) != PARQUET_MAGIC:
        return None
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    try:
        return list(pq.ParquetFile(path).schema_arrow.names)
    except Exception:  # any pyarrow failure here just means "not mine"
        return None


def parquet_schema_text(path: Path) -> str:
    try:
        import pyarrow.parquet as pq
        return str(pq.ParquetFile(path).schema_arrow)
    except Exception:
        return ""


def iter_parquet(path: Path, columns: Iterable[str], *, batch_size: int = 256) -> Iterator[tuple[int, Any]]:
    """(row index, row dict) from a parquet file, a batch of rows at a time (bounded memory)."""
    name = str(path)
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceError("reading parquet needs pyarrow: pip install 'pytest-agentcgroup[convert]'", file=name) from None
    errors = (pyarrow.ArrowException, OSError, ValueError, TypeError)
    try:
        pf = pq.ParquetFile(path)
        names = set(pf.schema_arrow.names)
    except errors as exc:
        raise TraceError(f"not a readable parquet file: {exc}", file=name) from None
    cols = [c for c in columns if c in names]
    row = 0
    try:
        for batch in pf.iter_batches(batch_size=batch_size, columns=cols):
            for rec in batch.to_pylist():
                yield row, rec
                row += 1
    except errors as exc:
        raise TraceError(f"parquet data unreadable: {exc}", file=name, record=row) from None


def iter_row_results(path: Path, fmt: str, columns: Iterable[str],
                     convert_row: Callable[[Any, Where, dict, int], Trace]) -> Iterator[Trace | TraceError]:
    """A Trace or a TraceError per row of a dataset export (parquet, a JSON array or JSONL), each
    row converted by `convert_row(row, where, source, record)`; a file unreadable as a whole raises."""
    path = Path(path)
    rows = iter_parquet(path, columns) if path.suffix == ".parquet" else iter_json_rows(path)
    return record_results(rows, str(path), make_source(fmt, path), convert_row)


def record_results(rows: Iterable[tuple[int, Any]], name: str, source: dict,
                   convert_row: Callable[[Any, Where, dict, int], Trace]) -> Iterator[Trace | TraceError]:
    """`convert_row(row, where, source, record)` guarded per (record, row); a TraceError row passes."""
    for rec, row in rows:
        if isinstance(row, TraceError):
            yield row
            continue
        where = {"file": name, "record": rec}
        yield guard(where, lambda: convert_row(row, where, source, rec))
