"""`agentcgroup merge`: the runs of a sharded session (`--agentcgroup-shard K/N`) joined into one run
directory, its claims comparing arms checked once (harness/merge.py)."""
from __future__ import annotations

import sys
from pathlib import Path


def add_parser(sub) -> None:
    m = sub.add_parser(
        "merge", help="merge the runs of the N shards of a sharded session into one run, and check its claims",
        description="Read the run of each shard of one session (pytest ... --agentcgroup-shard K/N; each a run "
                    "directory, or a results directory = its newest run) and write one new run into the results "
                    "directory OUT (NNNN_<time>/, `latest` points at it): every shard's step records and their "
                    "summaries, run.json saying which runs it was merged from, and the claims comparing arms, "
                    "which no shard checks alone, checked on the merged records. Refused, naming the runs: a run "
                    "that is not a shard, shards of different N or given twice, of different package version, "
                    "checkout, config or corpus, a test in two shards, and (unless --partial) a missing or "
                    "unfinished shard. The merged run is a run as any other: agentcgroup compare, agentcgroup "
                    "report and --agentcgroup-baseline read it.",
        epilog="Example: agentcgroup merge shard1/results shard2/results -o results. Exit codes: 0 merged and no "
               "claim failed, 1 merged but a claim is refuted or not measured (its verdict printed), 2 usage "
               "error or runs that cannot be merged (named on stderr; nothing written).")
    m.add_argument("runs", nargs="+", metavar="RUN", type=Path,
                   help="each shard's run directory, or results directory (= its newest run)")
    m.add_argument("-o", "--output", required=True, type=Path, metavar="OUT",
                   help="results directory the merged run is written into (created if missing)")
    m.add_argument("--config", type=Path, metavar="TOML",
                   help="experiment config whose claims are checked (default: the one the shards' run.json "
                        "names; either must be the file they ran with)")
    m.add_argument("--partial", action="store_true",
                   help="merge the shards given even when some are missing or unfinished (run.json lists the "
                        "missing ones; a claim over an arm with no records is not checked)")
    m.set_defaults(func=cmd_merge)


def cmd_merge(args) -> int:
    from ..harness.merge import MergeError, merge, summary
    try:
        merged = merge(args.runs, args.output, config=args.config, partial=args.partial)
    except MergeError as exc:
        print(f"agentcgroup merge: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"agentcgroup merge: cannot write {exc.filename or args.output}: {exc.strerror}", file=sys.stderr)
        return 2
    print(f"merged run: {merged.run} ({merged.tests} tests, {merged.records} step records)")
    if merged.missing:
        print(f"partial: shard(s) {', '.join(map(str, merged.missing))} missing")
    for line in merged.failed_shards:
        print(f"{line}: its failures are the shard's, not re-checked here (the merged run's exit status is it)")
    for line in merged.lines:
        print(line)
    print(summary(merged) + ("; a refuted or unmeasured claim fails the merge (exit 1)" if merged.claims_failed else ""))
    return 1 if merged.claims_failed else 0
