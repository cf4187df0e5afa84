"""Playwright `trace.zip` archives (trace format versions 3 to 10) -> trace IR.

One archive is one trace (id `playwright/<zip stem>`). Its `*.trace` members are NDJSON event files:
the library side writes `trace.trace` or chunks `0-trace.trace`, `1-trace.trace`, ... (merged here,
ordered by start time), each opening with a `context-options` header that carries the format
`version`; the test runner writes `test.trace` (and, in 1.37, a header-less `N-trace.trace`).

Each library API call is one `browser` step: `before`/`after` event pairs matched by `callId`
(versions 4+), the single `action` event of older traces (v4-style `{callId, startTime, endTime,
class, method}` or v3-style `{metadata: {id, type, method, ...}}`). Step args: `method`
("Class.method", e.g. "Frame.goto"), `api` (the user-facing name, e.g. "page.goto") and, when the call
has them, `selector`, `url`, `value` (`value`, or `text` for type/insertText), `key`.
`duration_ms` = endTime - startTime (monotonic ms), `recorded`; a call that never ended has none.

Skipped: the test runner's own steps (class `Test`: hooks, fixtures, `expect`, and a second copy of
every API call), internal calls (v3 `internal: true`) and tracing bookkeeping (`Tracing.*`), none of
which is a browser action.

Zip safety: members are read in chunks and refused past :data:`MAX_MEMBER_BYTES` each and
:data:`MAX_TOTAL_BYTES` in all (counting bytes actually inflated, not the sizes the archive
claims), and archives with more than :data:`MAX_MEMBERS` entries are refused, all with a TraceError
naming the member.
"""
from __future__ import annotations

import json
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterator

from ..ir import Measure, Step, Trace, TraceError
from ._common import check_number, check_str, fail, finish, guard, id_part, make_source, make_trace_id, strict

FORMAT = "playwright"
MIN_VERSION, MAX_VERSION = 3, 10     # 10: Playwright 1.65 (same before/after events, no apiName)
#: Largest `.trace` member inflated (bytes).
MAX_MEMBER_BYTES = 64 << 20
#: Largest sum of inflated `.trace` members (bytes).
MAX_TOTAL_BYTES = 256 << 20
#: Most entries an archive may list.
MAX_MEMBERS = 100_000
_CHUNK = 1 << 16
_SKIP_CLASSES = frozenset({"Test", "Tracing"})


def sniff(path: Path) -> bool:
    path = Path(path)
    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as zf:
            return any(n.endswith(".trace") for n in zf.namelist()[:MAX_MEMBERS])
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError):
        return False


def convert(path: Path) -> Iterator[Trace]:
    return strict(iter_results(path))


def iter_results(path: Path) -> Iterator[Trace | TraceError]:
    path = Path(path)
    where = {"file": str(path)}
    members = _read_members(path, where)
    yield guard(where, lambda: convert_members(members, where, make_source(FORMAT, path),
                                                make_trace_id(FORMAT, id_part(path.stem, "trace"))))


def _read_members(path: Path, where: dict) -> list[tuple[str, str]]:
    """(name, text) of the archive's `.trace` members, library chunks in name order."""
    try:
        zf = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise fail("cannot read: no such file", where) from None
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, NotImplementedError) as exc:
        raise fail(f"not a readable zip archive: {exc}", where) from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_MEMBERS:
            raise fail(f"archive lists {len(infos):,} entries, over the {MAX_MEMBERS:,} limit", where)
        names = sorted((i for i in infos if i.filename.endswith(".trace") and not i.is_dir()),
                       key=lambda i: _chunk_key(i.filename))
        if not names:
            raise fail("no *.trace member: not a Playwright trace archive", where)
        total = 0
        out: list[tuple[str, str]] = []
        for info in names:
            mf = f"zip member {info.filename}"
            if info.file_size > MAX_MEMBER_BYTES:
                raise fail(f"member claims {info.file_size:,} bytes inflated, over the {MAX_MEMBER_BYTES:,}-byte "
                           "limit (zip bomb?)", where, field=mf)
            buf = bytearray()
            try:
                with zf.open(info) as fh:
                    while True:
                        chunk = fh.read(_CHUNK)
                        if not chunk:
                            break
                        buf += chunk
                        total += len(chunk)
                        if len(buf) > MAX_MEMBER_BYTES:
                            raise fail(f"member inflates past the {MAX_MEMBER_BYTES:,}-byte limit (zip bomb?)",
                                       where, field=mf)
                        if total > MAX_TOTAL_BYTES:
                            raise fail(f"archive inflates past the {MAX_TOTAL_BYTES:,}-byte total limit (zip bomb?)",
                                       where, field=mf)
            except TraceError:
                raise
            except (OSError, zipfile.BadZipFile, zlib.error, ValueError, EOFError, NotImplementedError,
                    RuntimeError) as exc:
                raise fail(f"cannot inflate: {exc}", where, field=mf) from None
            if b"\x00" in buf:
                raise fail(f"contains a NUL byte at offset {buf.index(0)}", where, field=mf)
            try:
                out.append((info.filename, buf.decode("utf-8")))
            except UnicodeDecodeError as exc:
                raise fail(f"not UTF-8 text ({exc.reason} at byte {exc.start})", where, field=mf) from None
        return out


def _chunk_key(name: str) -> tuple:
    base = name.rsplit("/", 1)[-1]
    prefix = base.split("-", 1)[0]
    return (0, int(prefix), name) if prefix.isdigit() and len(prefix) < 10 else (1, 0, name)


def convert_members(members: list[tuple[str, str]], where: dict, source: dict, trace_id: str) -> Trace:
    calls: dict[tuple[str, str], dict] = {}
    order: list[tuple[str, str]] = []
    version: int | None = None
    for name, text in members:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            lf = f"{name} line {lineno}"
            try:
                ev = json.loads(line)
            except json.JSONDecodeError as exc:
                raise fail(f"invalid JSON: {exc.msg} (column {exc.colno})", where, field=lf) from None
            except RecursionError:
                raise fail("invalid JSON: nested too deeply", where, field=lf) from None
            if not isinstance(ev, dict):
                raise fail(f"expected an event object, got {type(ev).__name__}", where, field=lf)
            kind = ev.get("type")
            if kind == "context-options":
                v = ev.get("version")
                if isinstance(v, bool) or not isinstance(v, int):
                    raise fail(f"expected an integer trace format version, got {v!r:.40}", where,
                               field=f"{lf}.version")
                if not MIN_VERSION <= v <= MAX_VERSION:
                    raise fail(f"trace format version {v} is not supported (this reads {MIN_VERSION} to {MAX_VERSION})",
                               where, field=f"{lf}.version")
                version = max(version or v, v)
            elif kind in ("before", "action"):
                call = _call_from(ev, lf, where)
                if call is None:
                    continue
                key = (name, call["id"])
                if key not in calls:
                    order.append(key)
                calls[key] = call
            elif kind == "after":
                cid = ev.get("callId")
                if not isinstance(cid, str):
                    raise fail(f"expected a string callId, got {cid!r:.40}", where, field=f"{lf}.callId")
                call = calls.get((name, cid))
                if call is not None and ev.get("endTime") is not None:
                    call["end"] = check_number(ev["endTime"], where, field=f"{lf}.endTime")
    if version is None:
        raise fail("no context-options header with a format version: not a Playwright library trace", where,
                   field="context-options")
    ordered = sorted((calls[k] for k in order), key=lambda c: c["start"])
    steps: list[Step] = []
    for i, call in enumerate(ordered):
        duration = None
        if call.get("end") is not None and call["end"] >= call["start"]:
            duration = Measure(round(call["end"] - call["start"], 3), "recorded")
        steps.append(Step(step_id=i, tool="browser", native_tool=call["args"]["method"], args=call["args"],
                          duration_ms=duration))
    return finish(trace_id, source, steps, where, what="browser actions")


def _call_from(ev: dict, lf: str, where: dict) -> dict | None:
    """A call record {id, start, end?, args} from a `before` or `action` event; None to skip."""
    meta = ev.get("metadata")
    if ev.get("type") == "action" and isinstance(meta, dict):  # v3: everything under metadata
        if meta.get("internal") is True:
            return None
        src, prefix = meta, f"{lf}.metadata"
        cid, cls = src.get("id"), src.get("type")
    else:
        src, prefix = ev, lf
        cid, cls = ev.get("callId"), ev.get("class")
    if not isinstance(cid, str):
        raise fail(f"expected a string call id, got {cid!r:.40}", where, field=f"{prefix}.callId")
    method = src.get("method")
    if not isinstance(cls, str) or not isinstance(method, str):
        raise fail("a call needs string 'class' and 'method'", where, field=f"{prefix}.method")
    if cls in _SKIP_CLASSES or method.startswith("tracing"):
        return None
    start = check_number(src.get("startTime"), where, field=f"{prefix}.startTime")
    args: dict[str, Any] = {"method": check_str(f"{cls}.{method}", where, field=f"{prefix}.method")}
    api = src.get("apiName") or src.get("title")
    if isinstance(api, str) and api:
        args["api"] = check_str(api, where, field=f"{prefix}.apiName")
    params = src.get("params")
    if isinstance(params, dict):
        for key, names in (("selector", ("selector",)), ("url", ("url",)), ("value", ("value", "text")),
                           ("key", ("key",))):
            for n in names:
                v = params.get(n)
                if isinstance(v, str):
                    args[key] = check_str(v, where, field=f"{prefix}.params.{n}")
                    break
    call = {"id": cid, "start": start, "args": args}
    if ev.get("type") == "action" and src.get("endTime") is not None:
        call["end"] = check_number(src["endTime"], where, field=f"{prefix}.endTime")
    return call
