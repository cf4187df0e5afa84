"""`agentcgroup traces select` and `agentcgroup traces sweep`: the corpus's subsets, drawn seeded and
stratified (traces/select.py) or, for the paper subset, spread over memory peaks with the limits
Experiment 1 sweeps (traces/sweep.py). Both take only the traces an experiment may (a trace replayed
here only when its stored faithfulness verdict passes, metrics/source_faithfulness.py `left_out`)
unless --include-unfaithful, and say how many they left out and why."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..metrics import source_faithfulness as faithfulness
from ..traces import sweep
from ..traces.corpus import MANIFEST
from ..traces.select import DEFAULT_SIZES, PAPER_MIN, build, coverage, load



def add_parsers(tsub) -> None:
    s = tsub.add_parser(
        "select", help="classify IR traces and write seeded stratified subsets (smoke, dev, paper, full)",
        description="Classify each bash step (test, install, build, vcs, search, fileops, other) and each "
                    "trace (length short/medium/long, dominant category, bursty), then draw seeded stratified "
                    "subsets - smoke (5), dev (20), paper (50-100), full (all) - each contained in the next, "
                    "covering as many (format, length, category, bursty) strata as their size allows. Writes "
                    "OUT/traces/*.json and OUT/manifest.json (a corpus the plugin loads).",
        epilog="Example: agentcgroup traces select traces/converted -o traces/selected --seed 7. Exit codes: "
               "0 ok, 1 bad input (an invalid IR file is named and skipped; no traces at all), 2 usage error.")
    s.add_argument("files", nargs="+", metavar="FILE_OR_DIR", type=Path, help="IR files or directories")
    s.add_argument("-o", "--output", required=True, type=Path, metavar="OUT", help="output directory (created)")
    s.add_argument("--seed", type=int, default=0, help="random seed (default 0): same seed, same subsets")
    s.add_argument("--smoke", type=int, default=DEFAULT_SIZES["smoke"], metavar="N", help="smoke size (default 5)")
    s.add_argument("--dev", type=int, default=DEFAULT_SIZES["dev"], metavar="N", help="dev size (default 20)")
    s.add_argument("--paper", type=int, default=DEFAULT_SIZES["paper"], metavar="N",
                   help=f"paper size, {PAPER_MIN}-100 (default 100; fewer when the input is smaller)")
    s.add_argument("--subsets", default="smoke,dev,paper,full",
                   help="subsets to write (comma-separated; traces outside them are not written)")
    _add_include_unfaithful(s)
    s.add_argument("--json", action="store_true", help="print a machine-readable report on stdout")
    s.set_defaults(func=cmd_select)

    w = tsub.add_parser(
        "sweep", help="the paper subset (spread over memory peaks) and the limits Experiment 1 sweeps",
        description=sweep.__doc__.split("\n")[0] + " Prints the subset's size, its peak percentiles and the "
                    "matrix's `ablations` list (TOML) that sets each swept arm's limit per point.",
        epilog="Example: agentcgroup traces sweep traces --write-manifest. Exit codes: 0 ok, 1 unreadable or "
               "empty manifest, 2 usage error.")
    w.add_argument("traces", type=Path, help="the corpus directory (with manifest.json)")
    w.add_argument("-n", type=int, default=sweep.PAPER_SIZE, help=f"paper subset size (default {sweep.PAPER_SIZE})")
    w.add_argument("--from", dest="source", default="full", metavar="SUBSET",
                   help="the subset to draw from (default full; `recorded` for the recorded corpus)")
    w.add_argument("--name", help="the paper subset's name in the manifest (default paper, or paper-SUBSET "
                                  "with --from SUBSET)")
    w.add_argument("--smoke", metavar="NAME",
                   help=f"also draw a smoke subset NAME of {sweep.SMOKE_SIZE} traces: each agent's largest-peak trace, "
                        f"then the largest peaks left; and NAME{sweep.TWINS_SUFFIX}, their derived twins in `full` "
                        "where they exist")
    _add_include_unfaithful(w)
    w.add_argument("--write-manifest", action="store_true", help="write the subset(s) into the manifest")
    w.set_defaults(func=cmd_sweep)


def _add_include_unfaithful(p) -> None:
    p.add_argument("--include-unfaithful", action="store_true",
                   help="also take traces replayed here whose stored faithfulness verdict is fail or unverified "
                        "(default: left out, and counted)")


def take_faithful(traces, include_unfaithful: bool) -> tuple[list, dict[str, list[str]]]:
    """(the traces an experiment may take, {why: [trace ids left out]}): all of them with
    `include_unfaithful`."""
    if include_unfaithful:
        return list(traces), {}
    kept, left = [], {why: [] for why in faithfulness.LEFT_OUT}
    for t in traces:
        why = faithfulness.left_out(t)
        (left[why].append(t.trace_id) if why else kept.append(t))
    return kept, {k: v for k, v in left.items() if v}


def skipped_line(left: dict[str, list[str]], of: int, where: str, include_unfaithful: bool = False) -> str:
    """One line: how many traces were left out of `of` and why."""
    n = sum(map(len, left.values()))
    if include_unfaithful:
        return f"took all {of} traces of {where} (--include-unfaithful: whatever their faithfulness verdict)"
    if not n:
        return f"took all {of} traces of {where}: none replayed here without a passing faithfulness verdict"
    why = {"unfaithful": "unfaithful (stored verdict fail)",
           "unverified": "unverified (replayed here; no passing verdict: too few compared steps, more unknown "
                         "than compared, or none stored by this rule)"}
    return (f"skipped {n} of {of} traces of {where}: "
            + ", ".join(f"{len(left[k])} {why[k]}" for k in faithfulness.LEFT_OUT if left.get(k))
            + " (--include-unfaithful takes them)")


def cmd_select(args) -> int:
    if not PAPER_MIN <= args.paper <= 100:
        print(f"agentcgroup traces select: --paper must be {PAPER_MIN}-100, not {args.paper}", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.subsets.split(",") if n.strip()]
    unknown = [n for n in names if n not in ("smoke", "dev", "paper", "full")]
    if unknown or not names:
        print(f"agentcgroup traces select: unknown subset {unknown[0] if unknown else '(none)'!r} "
              "(known: smoke, dev, paper, full)", file=sys.stderr)
        return 2
    missing = [p for p in args.files if not p.exists()]
    for p in missing:
        print(f"{p}: no such file or directory", file=sys.stderr)
    traces, errors = load(p for p in args.files if p.exists())
    for e in errors:
        print(e, file=sys.stderr)
    if not traces:
        print("agentcgroup traces select: no IR traces found", file=sys.stderr)
        return 1
    given = len(traces)
    traces, left = take_faithful(traces, args.include_unfaithful)
    said = skipped_line(left, given, "the input", args.include_unfaithful)
    if not traces:
        print(f"agentcgroup traces select: {said}: none left", file=sys.stderr)
        return 1
    manifest = build(traces, args.output, seed=args.seed,
                     sizes={"smoke": args.smoke, "dev": args.dev, "paper": args.paper}, write=names)
    cov = coverage(manifest)
    if args.json:
        json.dump({"output": str(args.output), "seed": args.seed, "traces": len(traces), "subsets": cov,
                   "skipped": left,
                   "errors": errors + [f"{p}: no such file or directory" for p in missing]}, sys.stdout, indent=1)
        print()
    else:
        for name, c in cov.items():
            print(f"{name}: {c['traces']} trace(s), {c['strata']}/{c['of_strata']} strata; categories "
                  + ", ".join(f"{k} {v}" for k, v in sorted(c["categories"].items()))
                  + "; lengths " + ", ".join(f"{k} {v}" for k, v in sorted(c["lengths"].items()))
                  + f"; bursty {c['bursty']}")
        print(said)
        print(f"wrote {len(manifest['traces'])} trace(s) and {MANIFEST} to {args.output}")
    return 1 if errors or missing else 0


def cmd_sweep(args) -> int:
    manifest = args.traces / MANIFEST
    name = args.name or ("paper" if args.source == "full" else f"paper-{args.source}")
    names = [name] + ([args.smoke, args.smoke + sweep.TWINS_SUFFIX] if args.smoke else [])
    kept = {args.source: "the subset it draws from", "full": "the whole corpus"}
    clash = next((n for n in names if n in kept or names.count(n) > 1), None)
    if clash:
        print(f"agentcgroup traces sweep: would write subset {clash!r} over {kept.get(clash, 'another it writes')}",
              file=sys.stderr)
        return 2
    if args.n < 1:
        print(f"-n {args.n}: the paper subset needs at least one trace", file=sys.stderr)
        return 2
    try:
        data, entries = sweep.manifest_entries(args.traces, args.source)
        traces = {e["trace_id"]: sweep.read_trace(args.traces, data, e["trace_id"]) for e in entries}
    except sweep.NoSubset as exc:
        print(f"{manifest}: no subset {exc} (--from)", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        print(f"{manifest}: cannot read the {args.source} subset's entries: {exc}", file=sys.stderr)
        return 1
    faithful, left = take_faithful(traces.values(), args.include_unfaithful)
    said = skipped_line(left, len(entries), args.source, args.include_unfaithful)
    taken = {t.trace_id for t in faithful}
    entries = [dict(e, **sweep.breadth_keys(traces[e["trace_id"]])) for e in entries if e["trace_id"] in taken]
    if not entries:
        print(f"{manifest}: no trace of {args.source} to sweep: {said}", file=sys.stderr)
        return 1
    try:
        twins = sweep.derived_twins(args.traces, data, [e["trace_id"] for e in entries]) if args.smoke else {}
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        print(f"{manifest}: cannot read the full subset's entries: {exc}", file=sys.stderr)
        return 1
    ids = sweep.paper_subset(entries, args.n)
    peaks = {e["trace_id"]: float(e.get("peak_mb") or 0.0) for e in entries}
    limits = sweep.sweep_limits([peaks[t] for t in ids])
    written = {name: ids}
    if args.smoke:
        smoke = sweep.smoke_subset(entries)
        written[args.smoke] = smoke
        written[args.smoke + sweep.TWINS_SUFFIX] = [twins[t] for t in smoke if t in twins]
    if args.write_manifest:
        data["subsets"].update(written)
        manifest.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    by_id = {e["trace_id"]: e for e in entries}
    print(f"# {said}")
    print(f"# {name} subset: {len(ids)} of the {len(entries)} traces of {args.source} taken; trace peaks (MiB, from "
          f"the traces' step peaks): {', '.join(f'{k} {v}' for k, v in limits.items())}")
    print(f"#   {sweep.breadth([by_id[t] for t in ids])}")
    for name in list(written)[1:]:
        print(f"# {name}: {', '.join(written[name]) or '(none)'}")
    print(sweep.matrix_toml(limits))
    return 0

