"""`agentcgroup tools ...`: the corpus-building tools, run by hand to regenerate what traces/ ships
(tools/build_corpus.py, tools/real_corpus.py, tools/browser_record.py, tools/recorded_here.py,
tools/source_store.py), what the sources record of each step's outcome and each profiled trace's
verdict (tools/recorded_outcomes.py), and the shipped web app the browser traces replay against,
served for a look at it (tenants/webapp.py)."""
from __future__ import annotations

import sys
import threading
from pathlib import Path

from . import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE, command_group


def add_parsers(sub) -> None:
    tsub = command_group(sub, "tools", help="regenerate the shipped corpus (maintainers' tools); serve the web app",
                         description="The tools that regenerate what traces/ ships, run by hand (each "
                                     "family's README names its command), and the shipped web app.")

    b = tsub.add_parser(
        "build-corpus", help="build the claude-code corpus (traces/claude-code, manifest, README) from its dataset",
        description="Convert the agentcgroup-claude-code dataset (SRC/<model>/<task>/tool_calls.json ...) into "
                    "OUT/claude-code/<model>/<task>.json, one IR trace each, plus the synthetic noisy "
                    "neighbours, and write OUT/manifest.json (subsets smoke, dev, paper, full, noisy; other "
                    "families' entries kept) and OUT/README.md. Deterministic: the same input gives "
                    "byte-identical output.",
        epilog="Example: agentcgroup tools build-corpus ../shared/datasets/agentcgroup-claude-code traces. "
               "Exit codes: 0 ok, 1 bad input (named on stderr), 2 usage error.")
    b.add_argument("src", type=Path, help="agentcgroup-claude-code dataset root")
    b.add_argument("out", type=Path, help="output trace directory (e.g. traces/)")
    b.set_defaults(func=cmd_build_corpus)

    m = tsub.add_parser(
        "real-corpus", help="build the real subset (traces/mini-swe-agent) from mini-swe-agent's SWE-bench run",
        description="Convert the sympy tasks of mini-swe-agent 1.15's Gemini 3 Pro run on SWE-bench Verified "
                    "(TRAJS: the run's trajs directory, <instance>/<instance>.traj.json) into "
                    "OUT/mini-swe-agent/<instance>.json with their origin and licence, list those from pull "
                    "request 20000 on as the subset `real` in OUT/manifest.json (other families kept) and write "
                    "OUT/mini-swe-agent/README.md; with --openhands-rows, the OpenHands rows too "
                    "(OUT/openhands-rows/). Deterministic. Pin their workspaces afterwards with `agentcgroup "
                    "traces lock` (PyPI; the module docstring of tools/real_corpus.py gives the commands).",
        epilog="Example: git -C MIRROR archive HEAD swebench_results/20251118_gemini-3-pro-74pct/trajs | "
               "tar -x -C /tmp/msa; agentcgroup tools real-corpus "
               "/tmp/msa/swebench_results/20251118_gemini-3-pro-74pct/trajs traces. Exit codes: 0 ok, "
               "1 bad input (named on stderr), 2 usage error.")
    m.add_argument("trajs", type=Path, help="the run's trajs directory")
    m.add_argument("out", type=Path, help="the trace corpus directory (e.g. traces/)")
    m.add_argument("--openhands-rows", type=Path, metavar="FILE",
                   help="also the Agent Data Protocol's sample of nebius/SWE-rebench-openhands-trajectories "
                        "(sample_raw.json), into OUT/openhands-rows/")
    m.set_defaults(func=cmd_real_corpus)

    r = tsub.add_parser(
        "browser-record", help="build the browser traces (traces/playwright, subset browser)",
        description="Convert Playwright's test-asset trace archives and record the scripted sessions on the "
                    "shipped web app with chromium (Playwright tracing on), into OUT/playwright/ with its "
                    "README; the manifest's playwright family is rewritten whole (subset browser).",
        epilog="Example: agentcgroup tools browser-record ../shared/datasets/playwright-trace traces. Exit "
               "codes: 0 ok, 1 bad input or a recording that failed (named on stderr), 2 usage error.")
    # required: the manifest's playwright family is rewritten whole, converted traces included
    r.add_argument("datasets", type=Path, help="the playwright-trace dataset directory (../shared/datasets/...)")
    r.add_argument("out", type=Path, help="the trace corpus directory (e.g. traces/)")
    r.set_defaults(func=cmd_browser_record)

    h = tsub.add_parser(
        "recorded-here", help="the recorded-here corpus: its workspace (from PyPI, pinned) or its command traces",
        description="`workspace DIR`: build the workspace the recorded-here commands run in (more-itertools' "
                    "sdist unpacked and a wheels/ directory, every file from PyPI checked against the sha256 "
                    "pinned in tools/recorded_here.py; a complete workspace is kept as it is). `traces DIR`: "
                    "write the command traces (no profiles: `agentcgroup traces profile` records them). "
                    "Prints what it wrote.",
        epilog="Example: agentcgroup tools recorded-here workspace .cache/recorded-here/workspace (make "
               "recorded-here). Exit codes: 0 ok, 1 a download or pip failed (named on stderr), 2 usage error.")
    h.add_argument("what", choices=("workspace", "traces"), help="what to build")
    h.add_argument("dir", type=Path, metavar="DIR", help="where to build it")
    h.set_defaults(func=cmd_recorded_here)

    o = tsub.add_parser(
        "recorded-outcomes", help="add what the Claude Code source records of each step's outcome, and each "
                                  "profiled trace's faithfulness verdict, to existing IR files",
        description="Without profiling again: give every Claude Code trace under CORPUS (source.format "
                    "claude-code) each Bash and edit step's recorded_outcome, derived from DATASET/<source.path>/"
                    "tool_calls.json by the converter's rule (unknown where the tool's output does not tell), "
                    "and every profiled trace source.faithfulness, its verdict by the faithfulness rule "
                    "(`agentcgroup traces faithfulness`). Files are rewritten only when they change.",
        epilog="Example: agentcgroup tools recorded-outcomes ../shared/datasets/agentcgroup-claude-code traces. "
               "Exit codes: 0 ok, 1 bad input (named on stderr), 2 usage error or no dataset at DATASET.")
    o.add_argument("dataset", type=Path, help="the agentcgroup-claude-code dataset root")
    o.add_argument("corpus", type=Path, help="the trace corpus directory (e.g. traces/)")
    o.set_defaults(func=cmd_recorded_outcomes)
    s = tsub.add_parser(
        "source-store", help="rebuild the store of the tasks' source commits a lock checks out (traces/sources/)",
        description="Rebuild each store of git commits the workspace lock LOCK names (entries of provider git "
                    "whose repository is a path relative to the lock): a bare, shallow repository with one tag "
                    "per task at its commit, holding those commits' trees and nothing else, each fetched from "
                    "REPOSITORY (the public repository: a URL, or a local clone or mirror of it). The store is "
                    "replaced whole once the new one is complete. Prints each store, its commits and its size.",
        epilog="Example: agentcgroup tools source-store traces/workspaces.lock.json --from "
               "https://github.com/sympy/sympy. Exit codes: 0 ok, 1 bad input or a commit the repository "
               "lacks (named on stderr), 2 usage error.")
    s.add_argument("lock", type=Path, help="the workspace lock (e.g. traces/workspaces.lock.json)")
    s.add_argument("--from", dest="source", required=True, metavar="REPOSITORY",
                   help="the repository the commits come from (URL, or a local clone or mirror)")
    s.add_argument("--store", type=Path, help="rebuild this store only (default: every store the lock names)")
    s.set_defaults(func=cmd_source_store)

    w = tsub.add_parser(
        "webapp", help="serve the web app the browser traces replay against, on loopback",
        description="Serve the shipped web app on 127.0.0.1 and an ephemeral port (its URL is printed) until "
                    "interrupted (^C). State (sessions, carts, orders) is kept in memory.")
    w.set_defaults(func=cmd_webapp)


def cmd_build_corpus(args) -> int:
    from ..tools.build_corpus import build
    from ..traces.ir import TraceError
    try:
        result = build(args.src, args.out)
    except TraceError as exc:
        print(f"agentcgroup tools build-corpus: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    subsets = result["manifest"]["subsets"]
    print(f"wrote {len(subsets['full'])} traces to {args.out}; "
          + ", ".join(f"{k}: {len(v)}" for k, v in subsets.items()))
    for name, st in result["stats"].items():
        print(f"{name}: recorded {st['recorded_s']} s; step peaks {st['all']}; bash {st['bash']}")
    return EXIT_OK


def cmd_real_corpus(args) -> int:
    from ..tools.real_corpus import build
    from ..traces.ir import TraceError
    try:
        entries = build(args.trajs, args.out, args.openhands_rows)
    except TraceError as exc:
        print(f"agentcgroup tools real-corpus: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    families = sorted({e["file"].split("/")[0] for e in entries})
    print(f"wrote {len(entries)} traces to {', '.join(f'{args.out}/{f}' for f in families)}; "
          f"{sum(e['steps'] for e in entries)} steps")
    return EXIT_OK


def cmd_browser_record(args) -> int:
    from ..tools.browser_record import build
    from ..traces.ir import TraceError
    try:
        entries = build(args.datasets, args.out)
    except (TraceError, RuntimeError) as exc:
        print(f"agentcgroup tools browser-record: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for e in entries:
        print(f"{e['trace_id']}: {e['steps']} steps, {e['total_step_ms']} ms recorded")
    return EXIT_OK


def cmd_recorded_here(args) -> int:
    from ..tools import recorded_here
    # a failed download or pip run ends with SystemExit and its one-line message
    if args.what == "workspace":
        print(recorded_here.build_workspace(args.dir))
    else:
        for path in recorded_here.write_traces(args.dir):
            print(path)
    return EXIT_OK


def cmd_recorded_outcomes(args) -> int:
    from ..tools.recorded_outcomes import DatasetMissing, update
    from ..traces.ir import TraceError
    try:
        counts = update(args.dataset, args.corpus)
    except DatasetMissing as exc:
        print(f"agentcgroup tools recorded-outcomes: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except TraceError as exc:
        print(f"agentcgroup tools recorded-outcomes: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{counts['outcomes']} Claude Code trace(s) given recorded outcomes, {counts['verdicts']} profiled "
          f"trace(s) given a faithfulness verdict; {counts['written']} file(s) changed")
    return EXIT_OK


def cmd_source_store(args) -> int:
    from ..tools.source_store import rebuild
    from ..workspaces.lock import WorkspaceError
    source = args.source if "://" in args.source else str(Path(args.source).absolute())
    try:
        built = rebuild(args.lock, source, args.store)
    except WorkspaceError as exc:
        print(f"agentcgroup tools source-store: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for path, tags, size in built:
        print(f"{path}: {len(tags)} task(s), {len(set(tags.values()))} commit(s), {size / 2**20:.1f} MiB")
    return EXIT_OK


def cmd_webapp(args) -> int:
    from ..tenants.webapp import serve
    server = serve()
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
    return EXIT_OK
