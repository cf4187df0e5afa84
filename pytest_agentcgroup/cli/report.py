"""`agentcgroup report` (the HTML report, the Markdown results page, the published pages) and
`agentcgroup compare`: the command line of the reports (reports/).
pandas and matplotlib are imported only when a command runs."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def add_parsers(sub) -> None:
    r = sub.add_parser(
        "report", help="build the HTML report, or the Markdown results page, of results directories",
        description="Read runs (a run directory, or a results directory, which means its newest run, as its "
                    "`latest` link; each holds metrics.jsonl, or gw*/metrics.jsonl of xdist workers) and write "
                    "OUT/index.html (summary, figures, a sortable table of runs), OUT/runs.csv (a row per trace "
                    "× arm × seed), OUT/columns.csv (unit and provenance of each column) and OUT/figures/*.png. "
                    "With --markdown, OUT/results.md instead of index.html: the run's results page in MyST "
                    "Markdown for the documentation (provenance, summary.json's figures, the figures, a table "
                    "per test). With --publish FILE, the results page of every run FILE lists (make docs). "
                    "Needs the `report` extra.",
        epilog="Example: agentcgroup report results -o report --config experiments/agentcgroup.toml; "
               "agentcgroup report --publish docs/results/published.toml. "
               "Exit codes: 0 ok, 1 bad input (file and line named on stderr), 2 usage error.")
    r.add_argument("dirs", nargs="*", metavar="DIR", type=Path,
                   help="run directories, or results directories (= their newest run)")
    r.add_argument("-o", "--output", type=Path, metavar="OUT",
                   help="report directory (created; default report, with --publish FILE's directory/pages)")
    r.add_argument("--markdown", action="store_true",
                   help="write OUT/results.md, the results page in MyST Markdown, instead of the HTML report")
    r.add_argument("--title", metavar="TEXT", help="the Markdown page's title (default: the run's name)")
    r.add_argument("--publish", type=Path, metavar="FILE",
                   help="write the Markdown results page of every run FILE lists (TOML: [[run]] name, run, "
                        "title, config, traces; docs/results/published.toml) into OUT/<name>/results.md")
    r.add_argument("--config", type=Path, metavar="TOML",
                   help="experiment config file: draws each arm's limits on the memory figures")
    r.add_argument("--trace", action="append", metavar="ID", help="trace for a memory-vs-limit figure (repeatable; "
                   "default: the three with most OOM kills, limit hits, memory)")
    r.add_argument("--default", action="append", metavar="AXIS=VALUE", help="a sweep axis's default value for the "
                   "ablation deltas (repeatable; default: the axis's first value in the results)")
    r.add_argument("--characterize", action="append", type=Path, metavar="TRACES",
                   help="IR trace file or directory for the characterization page of the HTML report (repeatable; "
                        "default: the --config's corpus; neither: no such page)")
    r.set_defaults(func=cmd_report)

    from ..metrics.compare import SYNTAX, default_rules
    c = sub.add_parser(
        "compare", help="compare two runs test by test, within tolerances (the regression gate's core)",
        description="Compare run B against run A (each a run directory, or a results directory = its newest "
                    "run) for every trace × arm × seed (× params) and metric, with the regression gate's rules "
                    f"(docs/gate.md, 'Tolerances'): METRIC=TOLERANCE, TOLERANCE {SYNTAX}, an allowance in the "
                    "metric's worse direction (either way unless --only-worse). A test in one run only counts "
                    "unless --only-worse. Default rules: " + default_rules(worse_only=False) + "; with "
                    "--only-worse the gate's: " + default_rules(worse_only=True) + ".",
        epilog="Example: agentcgroup compare results-a results-b --tol latency_p95_ms=50%+100,oom_kills=+0. Exit "
               "codes: 0 within tolerance, 1 differences beyond tolerance, 2 usage error or unreadable input "
               "(named on stderr).")
    c.add_argument("a", metavar="A", type=Path,
                   help="the reference run (run or results directory, or a baseline file as the gate's)")
    c.add_argument("b", metavar="B", type=Path, help="the run compared with A (run or results directory)")
    c.add_argument("--tol", action="append", default=[], metavar="RULES",
                   help="METRIC=TOLERANCE rules, comma-separated, as the gate's; repeatable; given rules replace "
                        "the defaults")
    c.add_argument("--only-worse", action="store_true",
                   help="count only the worse direction, as the regression gate does (a regression check, not "
                        "reproducibility)")
    c.add_argument("--all", action="store_true", help="also list differences within tolerance or not counted")
    c.add_argument("--json", action="store_true", help="print the differences as JSON on stdout")
    c.set_defaults(func=cmd_compare)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _missing_report_extra(command: str) -> bool:
    """True (and says so on stderr) when pandas or matplotlib, which the reports import lazily, is missing."""
    try:
        import matplotlib  # noqa: F401
        import pandas  # noqa: F401
    except ImportError as exc:
        print(f"agentcgroup {command}: needs the `report` extra (pip install 'pytest-agentcgroup[report]'): {exc}",
              file=sys.stderr)
        return True
    return False


def _report_usage(args) -> str | None:
    """What is wrong with this combination of report's arguments, or None."""
    if args.publish is not None:
        extra = [f for f, v in (("DIR", args.dirs), ("--config", args.config), ("--trace", args.trace),
                                ("--default", args.default), ("--title", args.title),
                                ("--characterize", args.characterize)) if v]
        return f"--publish takes its runs and their settings from FILE, not from {', '.join(extra)}" if extra else None
    if not args.dirs:
        return "give a run or results directory (DIR), or --publish FILE"
    if args.markdown and args.characterize:
        return "--characterize makes a page of the HTML report, not of --markdown"
    if args.title and not args.markdown:
        return "--title is the --markdown page's"
    return None


def cmd_report(args) -> int:
    problem = _report_usage(args)
    if problem:
        print(f"agentcgroup report: {problem}", file=sys.stderr)
        return 2
    if _missing_report_extra("report"):
        return 2
    from ..reports.frames import ResultsError
    defaults = {}
    for item in args.default or []:
        axis, sep, value = item.partition("=")
        if not sep or not axis:
            print(f"agentcgroup report: --default {item!r}: expected AXIS=VALUE", file=sys.stderr)
            return 2
        defaults[axis] = _value(value)
    out = args.output or Path("report")
    try:
        if args.publish is not None:
            from ..reports.publish import publish
            pages = publish(args.publish, args.output)
            for page in pages:
                print(f"results page: {page} (runs.csv, columns.csv, figures/ beside it)")
            return 0
        if args.markdown:
            from ..reports.markdown import build_page
            page = build_page(args.dirs, out, config=args.config, traces=args.trace, defaults=defaults,
                              title=args.title)
            print(f"results page: {page} (runs.csv, columns.csv, figures/ beside it)")
            return 0
        from ..reports.html import build_report
        index = build_report(args.dirs, out, config=args.config, traces=args.trace, defaults=defaults,
                             characterize=args.characterize)
    except ResultsError as exc:
        print(f"agentcgroup report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"agentcgroup report: cannot write {exc.filename or out}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"report: {index} (runs.csv, columns.csv, figures/ beside it)")
    return 0


def cmd_compare(args) -> int:
    from ..metrics.compare import RuleError, parse_rules
    from ..metrics.registry import REGISTRY
    from ..reports.comparison import compare
    from ..reports.frames import ResultsError
    try:
        rules = parse_rules(",".join(args.tol)) if args.tol else None
    except RuleError as exc:
        print(f"agentcgroup compare: --tol: {exc}", file=sys.stderr)
        return 2
    try:
        result = compare(args.a, args.b, rules, only_worse=args.only_worse)
    except ResultsError as exc:
        print(f"agentcgroup compare: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({"a": str(result.a), "b": str(result.b), "tests": result.tests, "only_worse": result.only_worse,
                   "rules": ",".join(str(r) for r in result.rules),
                   "differences": [{**d.key, "metric": d.metric, "a": d.a, "b": d.b, "delta": d.delta,
                                    "allowed": d.allowed, "verdict": d.verdict, "beyond": d.beyond,
                                    "rule": None if d.rule is None else str(d.rule),
                                    **({"unit": REGISTRY[d.metric].unit, "provenance": REGISTRY[d.metric].provenance}
                                       if d.metric in REGISTRY else {})}
                                   for d in result.differences if args.all or d.beyond]}, sys.stdout, indent=1)
        print()
    else:
        print(result.format(show_all=args.all))
    return 1 if result.beyond else 0
