"""`agentcgroup traces convert|validate|stats|characterize|fetch`: the trace files' command lines
(convert public formats to the IR, check and summarise IR files, fetch rows from the Hub).
The `traces` group's other commands have modules of their own (subsets.py: select and sweep; profile.py;
fidelity.py)."""
from __future__ import annotations

import json
import re
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Iterator, Sequence

from ..traces import convert as registry
from ..traces.convert.atif import write_atif
from ..traces.corpus import ir_files
from ..traces.ir import PROVENANCES, TOOLS, Trace, TraceError, read_traces, write_trace
from . import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE

_SAFE_PART = re.compile(r"^[A-Za-z0-9._-]+$")
WRITERS = {"ir": write_trace, "atif": write_atif}        # `convert --to`


def add_parsers(tsub) -> None:
    fmts = ", ".join(registry.formats())
    c = tsub.add_parser(
        "convert", help="convert public agent-trace files to the trace IR",
        description="Convert agent-trace files (IR files too) to IR files, or to ATIF with --to atif "
                    "(OUT/<trace_id>.json, one trace each). Each "
                    f"file's format is sniffed unless --format is given (formats: {fmts}). A directory is "
                    "walked recursively; files no converter recognises are skipped there (but a file named "
                    "on the command line must be recognised). A bad file or record is reported on stderr "
                    "(file, record, step, field) and the rest still converts; the exit code is then 1.",
        epilog="Example: agentcgroup traces convert ../shared/datasets -o traces/converted")
    c.add_argument("sources", nargs="+", metavar="SRC", type=Path, help="trace files or directories")
    c.add_argument("-o", "--output", required=True, type=Path, metavar="OUT", help="output directory (created)")
    c.add_argument("-f", "--format", choices=registry.formats(), help="skip sniffing: read every file as this format")
    c.add_argument("--to", choices=tuple(WRITERS), default="ir", help="output format (default: ir, the trace IR; "
                   "atif: Harbor's Agent Trajectory Interchange Format)")
    c.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    c.set_defaults(func=cmd_convert)

    v = tsub.add_parser("validate", help="check IR trace files against the schema",
                        description="Check IR trace files (.json: a trace or a list; .jsonl: a trace per line) "
                                    "against the schema. Directories are walked for *.json and *.jsonl "
                                    "(manifest.json skipped).")
    v.add_argument("files", nargs="+", metavar="FILE", type=Path)
    v.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    v.set_defaults(func=cmd_validate)

    s = tsub.add_parser("stats", help="summarise IR trace files",
                        description="Count traces, steps, tool kinds and timing provenance in IR trace files.")
    s.add_argument("files", nargs="+", metavar="FILE", type=Path)
    s.add_argument("--json", action="store_true", help="print the statistics as JSON on stdout")
    s.set_defaults(func=cmd_stats)

    ch = tsub.add_parser(
        "characterize", help="resource characterization of IR traces, beside the AgentCgroup paper's figures",
        description="Per step kind memory peaks (P50/P95/max, over the baseline and absolute), peak-to-average "
                    "per trace, memory change rates, tool time share, average CPU and the idle share of a static "
                    "limit at the peak, computed from the traces' derived profiles and container summaries, with "
                    "the AgentCgroup paper's published figures beside ours and how the definitions differ.",
        epilog="Example: agentcgroup traces characterize traces/claude-code/haiku")
    _add_selection(ch)
    ch.add_argument("--json", action="store_true", help="print the characterization as JSON on stdout")
    ch.set_defaults(func=cmd_characterize)

    sa = tsub.add_parser(
        "sampling", help="what 1 Hz sampling hid: each step's derived profile against the one recorded here",
        description="For profiled traces that keep their source's profile derived from ~1 Hz container samples "
                    "(`original`, e.g. the Claude Code runs profiled with `traces profile`): per executed step, "
                    "the recorded peak, duration and CPU against the derived ones (P50/P95/max of each, and of "
                    "their ratio), for every step and for those that ended ok here, and the steps whose derived "
                    "peak is under 1 MiB while the recorded one is at least --missed-mb.",
        epilog="Example: agentcgroup traces sampling traces/claude-code-recorded. Exit codes: 0 ok, 1 bad input "
               "or nothing to compare (named on stderr), 2 usage error.")
    _add_selection(sa)
    sa.add_argument("--missed-mb", type=float, default=50.0, metavar="MB",
                    help="a step is missed by the samples when its recorded peak is at least this (default 50)")
    sa.add_argument("--json", action="store_true", help="print the comparison as JSON on stdout")
    sa.set_defaults(func=cmd_sampling)
    _add_fetch(tsub)


def _add_selection(p) -> None:
    p.add_argument("files", nargs="*", metavar="FILE", type=Path, help="IR trace files or directories of them")
    p.add_argument("--subset", metavar="NAME", help="the traces of this subset of the corpus (e.g. recorded)")
    p.add_argument("--traces", type=Path, default=Path("traces"), metavar="DIR",
                   help="the corpus --subset is read from (default traces)")


def _add_fetch(tsub) -> None:
    from ..traces import fetch as F
    f = tsub.add_parser(
        "fetch", help="fetch N trajectories from a Hugging Face dataset without downloading all of it",
        description="Read only the parquet row groups that hold the first N rows of a Hugging Face dataset "
                    "(through the Hub filesystem, at a pinned revision) into a local cache, a chunk file per "
                    "row group. An interrupted fetch resumes: run the same command again. With --source, "
                    "read a local parquet file instead (no network). Needs the `fetch` extra.",
        epilog="Example: agentcgroup traces fetch -n 200 -o rows.parquet && agentcgroup traces convert "
               "rows.parquet -o traces/openhands. Exit codes: 0 ok, 1 fetch failed (one line on stderr).")
    f.add_argument("-n", "--rows", type=int, default=100, metavar="N", help="rows (trajectories) to fetch (default 100)")
    f.add_argument("--repo", default=F.DEFAULT_REPO, help=f"dataset repository (default {F.DEFAULT_REPO})")
    f.add_argument("--path", help="parquet file inside the repository (default: every *.parquet file, sorted)")
    f.add_argument("--revision", default=F.DEFAULT_REVISION, help="branch, tag or full commit SHA (default "
                   "%(default)s); resolved by the Hub to a commit SHA, which keys the cache and is recorded in "
                   "everything written (OUT.origin.json), so the fetch can be repeated exactly")
    f.add_argument("--source", type=Path, metavar="FILE", help="a local parquet file to read instead of the Hub")
    f.add_argument("--cache", type=Path, default=F.DEFAULT_CACHE, help="cache directory (default %(default)s)")
    f.add_argument("--chunk-format", choices=F.FORMATS, default="parquet", help="format of the cached chunks")
    f.add_argument("-o", "--output", type=Path, metavar="OUT", help="also write exactly N rows to OUT "
                   "(.parquet, else JSONL)")
    f.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the Hub (default 10)")
    f.add_argument("--no-progress", action="store_true", help="no progress bar")
    f.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    f.set_defaults(func=cmd_fetch)


def cmd_fetch(args) -> int:
    from ..traces import fetch as F
    kw = dict(fmt=args.chunk_format, progress=not args.no_progress and sys.stderr.isatty())
    try:
        if args.source:
            res = F.fetch_local(args.source, args.rows, args.cache, **kw)
        else:
            res = F.fetch_hub(args.rows, repo=args.repo, path=args.path, revision=args.revision, cache=args.cache,
                              timeout=args.timeout, **kw)
        written = F.combine(res, args.output) if args.output else None
    except F.FetchError as exc:
        print(f"agentcgroup traces fetch: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("agentcgroup traces fetch: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    report = dict(res.as_dict(), output=str(args.output) if args.output else None)
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
    else:
        print(f"{res.rows} row(s) in {res.dest} ({res.fetched_row_groups} row group(s) fetched, "
              f"{res.reused_row_groups} reused from the cache)" + (f"; {written} row(s) written to {args.output}"
                                                                   f" (origin in {args.output}.origin.json)"
                                                                   if args.output else ""))
        if res.origin.get("commit"):
            print(f"pinned: {res.origin['repo']}@{res.origin['commit']}; repeat exactly with: "
                  f"{F.repeat_command(res.origin, res.rows)}")
    if res.rows < args.rows:
        print(f"agentcgroup traces fetch: the source has only {res.rows} row(s)", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# convert

def _walk(src: Path) -> Iterator[tuple[Path, bool]]:
    """(file, named explicitly) for a source path; directories in sorted order, hidden and README skipped."""
    if src.is_dir():
        for p in sorted(src.rglob("*")):
            rel = p.relative_to(src).parts
            if p.is_file() and not any(part.startswith(".") for part in rel) and not p.name.lower().startswith("readme"):
                yield p, False
    else:
        yield src, True


def _out_path(out: Path, trace_id: str) -> Path:
    parts = trace_id.split("/")
    safe = [p if _SAFE_PART.match(p) and p not in (".", "..") else re.sub(r"[^A-Za-z0-9._-]+", "_", p).strip(".") or "_"
            for p in parts]
    return out.joinpath(*safe).with_name(safe[-1] + ".json")


def _results(mod, path: Path) -> Iterator[Trace | TraceError]:
    """A converter's per-record results; the strict `convert` for modules without `iter_results`."""
    if hasattr(mod, "iter_results"):
        yield from mod.iter_results(path)
        return
    try:
        yield from mod.convert(path)
    except TraceError as exc:
        yield exc


def cmd_convert(args) -> int:
    out: Path = args.output
    report: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    bad = 0
    missing = [str(s) for s in args.sources if not s.exists()]
    for m in missing:
        print(f"{m}: no such file or directory", file=sys.stderr)
        report.append({"path": m, "format": None, "traces": 0, "steps": 0, "errors": ["no such file or directory"]})
        bad += 1
    for src in (s for s in args.sources if s.exists()):
        for path, explicit in _walk(src):
            fmt = args.format or registry.sniff(path)
            entry: dict[str, Any] = {"path": str(path), "format": fmt, "traces": 0, "steps": 0, "errors": []}
            if fmt is None:
                if explicit:
                    entry["errors"].append(f"format not recognised (known: {', '.join(registry.formats())}; "
                                           "use --format)")
                    print(f"{path}: {entry['errors'][0]}", file=sys.stderr)
                    bad += 1
                    report.append(entry)
                else:
                    entry["skipped"] = True
                    report.append(entry)
                continue
            try:
                mod = registry.converter(fmt)
                for r in _results(mod, path):
                    if isinstance(r, TraceError):
                        entry["errors"].append(str(r))
                        continue
                    if r.trace_id in seen and seen[r.trace_id] != str(path):
                        entry["errors"].append(f"{path}: duplicate trace_id {r.trace_id!r} (also in {seen[r.trace_id]})")
                        continue
                    seen[r.trace_id] = str(path)
                    dest = _out_path(out, r.trace_id)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    WRITERS[args.to](r, dest)
                    entry["traces"] += 1
                    entry["steps"] += len(r.steps)
            except TraceError as exc:
                entry["errors"].append(str(exc))
            except ImportError as exc:
                entry["errors"].append(f"{path}: format {fmt} needs an optional dependency: {exc}")
            except OSError as exc:
                entry["errors"].append(f"{path}: cannot write output: {exc}")
            except Exception as exc:  # a converter bug must not stop the batch; it is still an error
                entry["errors"].append(f"{path}: internal error in the {fmt} converter: {type(exc).__name__}: {exc}")
            for e in entry["errors"]:
                print(e, file=sys.stderr)
            bad += bool(entry["errors"])
            report.append(entry)
    converted = [e for e in report if not e.get("skipped")]
    n_traces = sum(e["traces"] for e in converted)
    if args.json:
        json.dump({"output": str(out), "files": report, "traces": n_traces,
                   "steps": sum(e["steps"] for e in converted), "failed_files": bad,
                   "skipped_files": sum(1 for e in report if e.get("skipped"))}, sys.stdout, indent=1)
        print()
    else:
        for e in converted:
            if e["format"] is None:
                continue
            status = f", {len(e['errors'])} error(s)" if e["errors"] else ""
            print(f"{e['path']}: {e['format']}, {e['traces']} trace(s), {e['steps']} step(s){status}")
        skipped = sum(1 for e in report if e.get("skipped"))
        print(f"converted {n_traces} trace(s) into {out}"
              + (f"; {skipped} file(s) skipped (not a known format)" if skipped else "")
              + (f"; {bad} file(s) with errors" if bad else ""))
    if bad:
        return EXIT_BAD_INPUT
    if n_traces == 0:
        print("nothing converted: no file in a known format", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# validate / stats

def _read(path: Path) -> tuple[list[Trace], str | None]:
    try:
        return list(read_traces(path)), None
    except TraceError as exc:
        return [], str(exc)


def cmd_validate(args) -> int:
    report = []
    bad = 0
    for f in ir_files(args.files):
        traces, err = _read(f)
        report.append({"path": str(f), "traces": len(traces), "ok": err is None, "error": err})
        if err:
            bad += 1
            print(err, file=sys.stderr)
        elif not args.json:
            print(f"{f}: ok, {len(traces)} trace(s)")
    if not report:
        print("no IR files found", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        json.dump({"files": report, "valid": len(report) - bad, "invalid": bad}, sys.stdout, indent=1)
        print()
    return EXIT_BAD_INPUT if bad else EXIT_OK


def compute_stats(traces: Sequence[Trace]) -> dict[str, Any]:
    lengths = [len(t.steps) for t in traces]
    steps = [s for t in traces for s in t.steps]
    timing = Counter(s.duration_ms.provenance if s.duration_ms else "none" for s in steps)
    return {
        "traces": len(traces),
        "steps": len(steps),
        "steps_per_trace": {"min": min(lengths, default=0), "median": statistics.median(lengths) if lengths else 0,
                            "max": max(lengths, default=0)},
        "formats": dict(sorted(Counter(str(t.source.get("format", "?")) for t in traces).items())),
        "tools": {k: sum(1 for s in steps if s.tool == k) for k in TOOLS},
        "native_tools": dict(Counter(s.native_tool or "?" for s in steps).most_common()),
        "duration_provenance": {k: timing.get(k, 0) for k in (*PROVENANCES, "none")},
        "total_duration_ms": round(sum(s.duration_ms.value for s in steps if s.duration_ms), 3),
        "steps_with_cwd": sum(1 for s in steps if s.args.get("cwd")),
        "profiled_steps": sum(1 for s in steps if s.profile.provenance() != "none"),
        "licences": dict(sorted(Counter(str(t.source.get("licence", "?")) for t in traces).items())),
    }


def cmd_stats(args) -> int:
    traces: list[Trace] = []
    bad = 0
    for f in ir_files(args.files):
        got, err = _read(f)
        if err:
            bad += 1
            print(err, file=sys.stderr)
        traces.extend(got)
    if not traces and not bad:
        print("no IR files found", file=sys.stderr)
        return EXIT_BAD_INPUT
    st = compute_stats(traces)
    if args.json:
        json.dump(st, sys.stdout, indent=1)
        print()
    else:
        spt = st["steps_per_trace"]
        print(f"traces: {st['traces']}   steps: {st['steps']}   steps/trace: min {spt['min']}, "
              f"median {spt['median']}, max {spt['max']}")
        print("formats: " + ", ".join(f"{k} {v}" for k, v in st["formats"].items()))
        print("tools:   " + ", ".join(f"{k} {v}" for k, v in st["tools"].items() if v))
        print("timing:  " + ", ".join(f"{k} {v}" for k, v in st["duration_provenance"].items() if v)
              + f"   (total {st['total_duration_ms'] / 1000:.1f} s)")
        print(f"cwd known on {st['steps_with_cwd']} step(s); resource profile on {st['profiled_steps']}")
        print("licences: " + ", ".join(f"{k} {v}" for k, v in st["licences"].items()))
    return EXIT_BAD_INPUT if bad else EXIT_OK


def _profiled_traces(args):
    """(the traces of the files and --subset asked for, how many files, subsets or traces were
    missing or bad), each of those named on stderr."""
    from ..traces.characterize import load_traces
    from ..traces.corpus import Corpus
    files = args.files
    if not files and not args.subset:
        print("give trace files or directories, or --subset NAME", file=sys.stderr)
        return [], -1
    missing = [str(f) for f in files if not f.exists()]
    for m in missing:
        print(f"{m}: no such file or directory", file=sys.stderr)
    traces, errors = load_traces(f for f in files if f.exists())
    if args.subset:
        try:
            corpus = Corpus.open(args.traces)
            traces += [corpus.load(tid) for tid in corpus.ids(args.subset)]
        except TraceError as exc:
            errors.append(str(exc))
    for err in errors:
        print(err, file=sys.stderr)
    return traces, len(errors) + len(missing)


def cmd_characterize(args) -> int:
    from ..traces.characterize import characterize, format_table
    traces, bad = _profiled_traces(args)
    if bad < 0:
        return EXIT_USAGE
    if not traces:
        if not bad:
            print("no IR files found", file=sys.stderr)
        return EXIT_BAD_INPUT
    res = characterize(traces)
    if res["profiled_steps"] == 0:
        print("no step carries a resource profile: nothing to characterize (convert traces with resource "
              "samples, e.g. claude-code task directories with resources.json)", file=sys.stderr)
        return EXIT_BAD_INPUT
    return _print(res, format_table, args.json, bad)


def _print(res: dict, table, as_json: bool, bad: int) -> int:
    if as_json:
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print(table(res))
    return EXIT_BAD_INPUT if bad else EXIT_OK


def cmd_sampling(args) -> int:
    from ..traces.sampling import compare, format_table
    traces, bad = _profiled_traces(args)
    if not traces and bad:
        return EXIT_USAGE if bad < 0 else EXIT_BAD_INPUT
    res = compare(traces, missed_mb=args.missed_mb)
    if res["steps"] == 0:
        print("no executed step carries both a recorded profile and its source's derived one (`original`): "
              "profile traces with derived profiles first (agentcgroup traces profile)", file=sys.stderr)
        return EXIT_BAD_INPUT
    return _print(res, format_table, args.json, bad)
