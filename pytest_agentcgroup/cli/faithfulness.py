"""`agentcgroup traces faithfulness TRACES [--subset NAME] [--threshold T] [--factor F] [--slack-s S]`:
each profiled trace judged by the one faithfulness rule (metrics/source_faithfulness.py) from what
its file stores (outcomes and durations recorded where it was profiled; nothing replayed again),
a line per trace, the totals, and how the verdicts move with the duration factor at 2x and 5x."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..metrics import source_faithfulness as rule
from ..traces.corpus import Corpus, ir_files
from ..traces.ir import Trace, TraceError, read_traces
from . import EXIT_BAD_INPUT, EXIT_OK

SHIFT_FACTORS = (2.0, 5.0)


def add_parser(tsub) -> None:
    p = tsub.add_parser(
        "faithfulness", help="did each profiled trace do the work its source recorded (pass / fail / unverified)",
        description="Judge each profiled trace by the faithfulness rule, from the outcomes and durations its "
                    "file stores: a step is faithful when it ended as its source recorded (exit status, or an "
                    "edit's applied/refused) and did comparable work (duration <= FACTOR x recorded + SLACK_S "
                    "where the source records one; else its output agrees, where the replayed output is kept); "
                    "unknown when the source shows no outcome (counted apart, never faithful). A trace with "
                    "fewer than 5 compared steps or more unknown than compared is unverified; else it passes "
                    "when unfaithful/compared <= THRESHOLD. Prints a line per trace, the totals, and how many "
                    "steps and traces change verdict at factor 2 and 5.",
        epilog="Example: agentcgroup traces faithfulness traces --subset recorded. Exit codes: 0 ok (whatever the "
               "verdicts), 1 bad input (named on stderr), 2 usage error.")
    p.add_argument("traces", nargs="+", type=Path, metavar="TRACES",
                   help="trace files or directories; with --subset, the corpus directory (its manifest.json)")
    p.add_argument("--subset", metavar="NAME", help="the traces of this subset of the corpus TRACES")
    p.add_argument("--threshold", type=float, default=rule.THRESHOLD,
                   help="the unfaithful share a passing trace may reach (default %(default)s)")
    p.add_argument("--factor", type=float, default=rule.FACTOR,
                   help="a step may run up to FACTOR x its recorded duration + SLACK_S (default %(default)s)")
    p.add_argument("--slack-s", type=float, default=rule.SLACK_S, help="seconds (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the verdicts as JSON on stdout")
    p.set_defaults(func=cmd_faithfulness)


def load(paths: list[Path], subset: str | None) -> list[Trace]:
    """The traces asked for; a TraceError naming the file, or the subset, that does not read."""
    if subset:
        if len(paths) != 1:
            raise TraceError("--subset reads one corpus directory, got " + ", ".join(map(str, paths)))
        corpus = Corpus.open(paths[0])
        return [corpus.load(tid) for tid in corpus.ids(subset)]
    out: list[Trace] = []
    for p in paths:
        if not p.exists():
            raise TraceError("no such file or directory", file=str(p))
        for f in ir_files([p]):
            out += list(read_traces(f))
    return out


def report(traces: list[Trace], threshold: float, factor: float, slack_s: float) -> dict:
    verdicts = [rule.judge_trace(t, factor=factor, slack_s=slack_s, threshold=threshold) for t in traces]
    total = {"traces": len(verdicts), "compared": sum(v.compared for v in verdicts),
             "faithful": sum(v.faithful for v in verdicts), "unknown": sum(v.unknown for v in verdicts),
             **{f"unfaithful_{r}": sum(v.by_rule[r] for v in verdicts) for r in rule.RULES},
             "work_unchecked": sum(v.unchecked for v in verdicts),
             **{k: sum(v.verdict == k for v in verdicts) for k in rule.VERDICTS}}
    total["unfaithful"] = total["compared"] - total["faithful"]
    total["pass_share"] = round(total["pass"] / len(verdicts), 4) if verdicts else None
    shifts = [rule.factor_shift(traces, f, base=factor, slack_s=slack_s, threshold=threshold)
              for f in SHIFT_FACTORS if f != factor]
    return {"rule": rule.RULE_VERSION, "threshold": threshold, "factor": factor, "slack_s": slack_s,
            "traces": [{"trace_id": v.trace_id, **v.stored(factor, slack_s, threshold)} for v in verdicts],
            "total": total, "factor_shift": shifts}


def format_report(res: dict) -> str:
    rows = res["traces"]
    width = max([len(r["trace_id"]) for r in rows] + [5])
    lines = [f"faithfulness rule {res['rule']}: counts derived from the stored traces (outcomes and durations "
             "recorded where each was profiled, beside what its source recorded)", "",
             f"{'':<{width}}                      unfaithful by rule",
             f"{'trace':<{width}}  compared  faithful  exit duration output  unknown  verdict"]
    for r in rows:
        lines.append(f"{r['trace_id']:<{width}}  {r['compared']:>8}  {r['faithful']:>8}  "
                     f"{r['unfaithful_exit']:>4} {r['unfaithful_duration']:>8} {r['unfaithful_output']:>6}  "
                     f"{r['unknown']:>7}  {r['verdict']}"
                     + (f"  ({r['why']})" if r.get("why") else ""))
    t = res["total"]
    share = f"{t['faithful'] / t['compared']:.1%}" if t["compared"] else "-"
    lines.append("")
    lines.append(f"total: {t['traces']} trace(s); {t['compared']} compared step(s), {t['faithful']} faithful ({share}), "
                 f"{t['unfaithful']} unfaithful (exit {t['unfaithful_exit']}, duration {t['unfaithful_duration']}, "
                 f"output {t['unfaithful_output']}), {t['unknown']} unknown; "
                 f"{t['work_unchecked']} compared step(s) had no recorded duration and no kept output (judged by exit)")
    if t["traces"]:
        lines.append(f"verdicts at threshold {res['threshold']}, factor {res['factor']:g}x + {res['slack_s']:g} s: "
                     f"pass {t['pass']} ({t['pass_share']:.1%}), fail {t['fail']}, unverified {t['unverified']}")
    for s in res["factor_shift"]:
        lines.append(f"at factor {s['factor']:g}x: {s['steps_changed']} step(s) and {s['traces_changed']} trace(s) "
                     f"change verdict; {s['traces_passing']} trace(s) pass")
    return "\n".join(lines)


def cmd_faithfulness(args) -> int:
    for name in ("threshold", "factor", "slack_s"):
        v = getattr(args, name)
        if not v >= 0 or v == float("inf"):
            print(f"agentcgroup traces faithfulness: --{name.replace('_', '-')} must be a finite number >= 0, "
                  f"got {v}", file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        traces = load(args.traces, args.subset)
    except TraceError as exc:
        print(f"agentcgroup traces faithfulness: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not traces:
        print("agentcgroup traces faithfulness: no traces in " + ", ".join(map(str, args.traces)), file=sys.stderr)
        return EXIT_BAD_INPUT
    res = report(traces, args.threshold, args.factor, args.slack_s)
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print(format_report(res))
    return EXIT_OK
