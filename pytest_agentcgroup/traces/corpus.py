"""A trace corpus on disk: a directory of IR files plus `manifest.json` naming subsets.

manifest.json (schema agentcgroup-manifest/1):

    {"schema": "agentcgroup-manifest/1",
     "subsets": {"smoke": ["<trace_id>", ...], "dev": [...], "full": [...]},
     "traces": [{"trace_id": "...", "file": "<path relative to the manifest>", ...descriptive keys}]}

Descriptive keys (steps, category, length, bursty, peak_mb, ...) are for people and for selection
tools; loading needs only `trace_id` and `file`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from .ir import Trace, TraceError, read_traces

MANIFEST = "manifest.json"
MANIFEST_SCHEMA = "agentcgroup-manifest/1"
#: the corpus's workspace lock (workspaces/lock.py): beside the traces, not one
LOCK_FILE = "workspaces.lock.json"


def ir_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """The IR files `paths` name: a file as given; under a directory, its *.json and *.jsonl files,
    sorted, less its manifest and workspace lock and what is under a dot-directory (a cache)."""
    for p in map(Path, paths):
        if not p.is_dir():
            yield p
            continue
        for f in sorted(p.rglob("*")):
            if f.is_file() and f.suffix in (".json", ".jsonl") and f.name not in (MANIFEST, LOCK_FILE) \
                    and not any(part.startswith(".") for part in f.relative_to(p).parts):
                yield f


@dataclass(frozen=True)
class Corpus:
    root: Path
    subsets: dict[str, tuple[str, ...]]
    files: dict[str, Path]          # trace_id -> file holding it

    @classmethod
    def open(cls, root: str | Path) -> "Corpus":
        root = Path(root)
        mpath = root / MANIFEST
        if not mpath.is_file():
            raise TraceError(f"no {MANIFEST} in the trace directory", file=str(root))
        try:
            data = json.loads(mpath.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise TraceError(f"invalid JSON: {exc}", file=str(mpath)) from None
        if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
            raise TraceError(f"expected schema {MANIFEST_SCHEMA!r}", file=str(mpath), field="schema")
        files: dict[str, Path] = {}
        for i, entry in enumerate(data.get("traces") or []):
            if not isinstance(entry, dict) or not isinstance(entry.get("trace_id"), str) \
                    or not isinstance(entry.get("file"), str):
                raise TraceError("each entry needs trace_id and file (strings)", file=str(mpath), record=i, field="traces")
            files[entry["trace_id"]] = root / entry["file"]
        subsets: dict[str, tuple[str, ...]] = {}
        if not isinstance(data.get("subsets") or {}, dict):
            raise TraceError("expected an object {name: [trace ids]}", file=str(mpath), field="subsets")
        for name, ids in (data.get("subsets") or {}).items():
            if not isinstance(ids, list) or not all(isinstance(x, str) for x in ids):
                raise TraceError("a subset is a list of trace ids", file=str(mpath), field=f"subsets.{name}")
            missing = [x for x in ids if x not in files]
            if missing:
                raise TraceError(f"names trace(s) not in 'traces': {', '.join(missing[:3])}",
                                 file=str(mpath), field=f"subsets.{name}")
            subsets[name] = tuple(ids)
        subsets.setdefault("full", tuple(files))
        return cls(root=root, subsets=subsets, files=files)

    def ids(self, subset: str) -> tuple[str, ...]:
        """Trace ids of a subset name, or of a comma-separated list of subset names and trace ids (in
        that order, each id once)."""
        if subset in self.subsets:
            return self.subsets[subset]
        ids: dict[str, None] = {}
        for part in (x.strip() for x in subset.split(",")):
            if not part:
                continue
            if part in self.subsets:
                ids.update(dict.fromkeys(self.subsets[part]))
            elif part in self.files:
                ids[part] = None
            else:
                raise TraceError(f"{part!r} is neither a subset ({', '.join(sorted(self.subsets))}) nor a trace id",
                                 file=str(self.root / MANIFEST))
        return tuple(ids)

    def load(self, trace_id: str) -> Trace:
        path = self.files[trace_id]
        for trace in read_traces(path):
            if trace.trace_id == trace_id:
                return trace
        raise TraceError(f"trace {trace_id!r} listed in the manifest is not in this file", file=str(path))


def read_manifest(root: str | Path) -> dict:
    """`root/manifest.json` as it is ({} when there is none), or a TraceError naming it: invalid JSON,
    not an object of this schema, `traces` not a list or `subsets` not an object. Read before any
    work that will update it, so a bad manifest stops that work before it starts."""
    path = Path(root) / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceError(f"invalid JSON: {exc}", file=str(path)) from None
    except OSError as exc:
        raise TraceError(f"cannot read it: {exc.strerror}", file=str(path)) from None
    if not isinstance(data, dict) or data.get("schema") != MANIFEST_SCHEMA:
        raise TraceError(f"expected an object with schema {MANIFEST_SCHEMA!r}", file=str(path), field="schema")
    if not isinstance(data.get("traces", []), list):
        raise TraceError("expected a list of entries", file=str(path), field="traces")
    if not isinstance(data.get("subsets", {}), dict):
        raise TraceError("expected an object {name: [trace ids]}", file=str(path), field="subsets")
    return data


def update_manifest(root: str | Path, family: str | tuple[str, ...], entries: list[dict],
                    subsets: dict[str, list[str] | None],
                    *, merge: bool = False) -> dict:
    """Write `root/manifest.json` (whole, via a temporary file) with `entries` replacing every entry whose
    trace id starts with `family` (a prefix or a tuple of prefixes, e.g. "claude-code/"), and `subsets`
    replacing those subsets (None: removing one); entries and subsets of other trace families, and the manifest's other
    keys, are kept, so each family's builder can regenerate its own part alone.

    merge=True (a tool adding traces one at a time, e.g. the profiler): nothing is removed; each entry
    is merged into the existing entry of its trace id (its keys win, the others stay), and the ids
    of `subsets` are added to those subsets (sorted). Raises TraceError for a manifest it cannot read
    (read_manifest) and OSError for one it cannot write."""
    path = Path(root) / MANIFEST
    old = read_manifest(root)
    traces = [e for e in old.get("traces") or []]
    if merge:
        new = {e["trace_id"]: e for e in entries}
        for i, e in enumerate(traces):
            tid = e.get("trace_id") if isinstance(e, dict) else None
            if tid in new:
                traces[i] = {**e, **new.pop(tid)}
        traces += new.values()
        merged = {name: list((old.get("subsets") or {}).get(name) or []) for name in subsets}
        for name, ids in subsets.items():       # in id order, not in the order parallel workers finished
            merged[name] = None if ids is None else sorted(set(merged[name]) | set(ids))
        subsets = merged
    else:
        traces = [e for e in traces if not (isinstance(e, dict) and str(e.get("trace_id", "")).startswith(family))]
        traces += entries
    key = lambda e: e.get("trace_id", "") if isinstance(e, dict) else ""    # noqa: E731
    every = {**(old.get("subsets") or {}), **subsets}      # keeps the existing order; None: removed
    manifest = {**old, "schema": MANIFEST_SCHEMA,
                "subsets": {name: ids for name, ids in every.items() if ids is not None},
                "traces": sorted(traces, key=key)}
    tmp = path.with_name(MANIFEST + ".partial")
    tmp.write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return manifest
