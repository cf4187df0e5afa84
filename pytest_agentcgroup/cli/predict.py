"""`agentcgroup predict train` and `agentcgroup predict accuracy`: the predictive arm's model of step
peaks by command class (limits/model.py), rebuilt from a corpus in one command, and its held-out
accuracy like a classifier's (limits/predict.py accuracy), per command class."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from ..limits.model import SCHEMES, TASK_FOLDS, Model, ModelError, train, write
from ..limits.predict import accuracy
from ..metrics.source_faithfulness import left_out
from ..traces.ir import TraceError


def add_parsers(sub) -> None:
    from . import command_group
    psub = command_group(sub, "predict", help="the predictive arm's model: train it, judge it on held-out traces",
                         description="The model the predict arm (limit_from = \"predict\") limits each step by: "
                                     "recorded step peaks by command class, with the folds that hold traces out.")
    t = psub.add_parser("train", help="build the model from a corpus's recorded peaks and print its held-out accuracy",
                        description="Read every trace of SUBSET, keep each step whose peak the profile recorded "
                                    "(derived and synthetic peaks are left out), key it by command class, make the "
                                    f"folds (task: {TASK_FOLDS} folds of tasks, a task run by two agents one group; "
                                    "repository: one repository held out per fold) and write the model as JSON.",
                        epilog="Example: agentcgroup predict train traces --subset recorded -o "
                               "experiments/predict-recorded.json. Exit codes: 0 ok, 1 bad input, 2 usage error.")
    t.add_argument("corpus", type=Path, help="the corpus directory (with manifest.json)")
    t.add_argument("--subset", default="recorded", help="manifest subset(s) or trace ids (default recorded)")
    t.add_argument("-k", type=int, default=TASK_FOLDS, help=f"task folds (default {TASK_FOLDS})")
    t.add_argument("-o", "--output", type=Path, required=True, help="the model file to write")
    t.add_argument("--include-unfaithful", action="store_true",
                   help="also train on traces whose stored faithfulness verdict is fail or unverified "
                        "(left out by default, as experiments' subsets leave them out)")
    _accuracy_args(t)
    t.set_defaults(func=cmd_train)
    a = psub.add_parser("accuracy", help="a model's held-out accuracy per command class",
                        description="Each trace of the model under the fold that holds it out: the share of steps "
                                    "whose limit covered their peak, the mean over-reservation, per command class.",
                        epilog="Example: agentcgroup predict accuracy experiments/predict-recorded.json --folds "
                               "repository. Exit codes: 0 ok, 1 unreadable model, 2 usage error.")
    a.add_argument("model", type=Path, help="a model file (agentcgroup predict train)")
    _accuracy_args(a)
    a.set_defaults(func=cmd_accuracy)


def _accuracy_args(p) -> None:
    p.add_argument("--quantile", type=float, default=0.95, help="the arm's quantile (default 0.95)")
    p.add_argument("--folds", choices=SCHEMES, default="task", help="the fold scheme (default task)")
    p.add_argument("--min-class-steps", type=int, default=3, help="fewer training steps: the kind's quantile (default 3)")
    p.add_argument("--margin-mb", type=float, default=0.0, help="MiB added to each limit, as the arm's margin_mb")
    p.add_argument("--history", action="store_true",
                   help="never below the largest peak of the class earlier in the trace, as the arm's history")
    p.add_argument("--top", type=int, default=15, help="command classes printed, most steps first (default 15)")
    p.add_argument("--json", action="store_true", help="print the accuracy as JSON")


def cmd_train(args) -> int:
    if args.k < 2:
        print("agentcgroup predict train: -k must be at least 2", file=sys.stderr)
        return 2
    try:
        keep = None if args.include_unfaithful else (lambda trace: left_out(trace) is None)
        model = train(args.corpus, args.subset, k=args.k, keep=keep, command="agentcgroup predict train " + shlex.join(
            [str(args.corpus), "--subset", args.subset, "-k", str(args.k), "-o", str(args.output)]
            + (["--include-unfaithful"] if args.include_unfaithful else [])))
    except TraceError as exc:
        print(exc, file=sys.stderr)
        return 1
    if not model["traces"]:
        print(f"agentcgroup predict train: no step of {args.subset} has a recorded peak", file=sys.stderr)
        return 1
    write(model, args.output)
    c = model["corpus"]
    if c["left_out"]:
        print(f"left out {len(c['left_out'])} trace(s) whose stored faithfulness verdict is fail or unverified "
              "(agentcgroup traces faithfulness lists why; --include-unfaithful takes them)")
    print(f"{args.output}: {c['steps']} recorded step peaks of {c['traces']} traces of {c['root']} ({c['subset']}); "
          f"folds: {len(model['folds']['task'])} by task, {len(model['folds']['repository'])} by repository")
    return _report(Model(args.output), args)


def cmd_accuracy(args) -> int:
    try:
        model = Model(args.model)
    except ModelError as exc:
        print(exc, file=sys.stderr)
        return 1
    return _report(model, args)


def _report(model: Model, args) -> int:
    if not 0 < args.quantile <= 1 or args.min_class_steps < 1:
        print("agentcgroup predict: --quantile must be in (0, 1] and --min-class-steps >= 1", file=sys.stderr)
        return 2
    acc = accuracy(model, quantile=args.quantile, folds=args.folds, min_class_steps=args.min_class_steps,
                   margin_mb=args.margin_mb, history=args.history)
    if args.json:
        json.dump(acc, sys.stdout, indent=1)
        print()
        return 0
    print(f"held out by {args.folds}, quantile {args.quantile}, min {args.min_class_steps} steps per class, "
          f"margin {args.margin_mb:g} MiB, history {'on' if args.history else 'off'} (covered: share of steps whose limit >= their recorded peak; over: mean "
          "limit - peak of the covered steps, MiB; reserved/peak: sum limit x time / sum peak x time; fallback: "
          "steps limited by their kind's or all peaks)")
    print(f"{'command class':<28} {'steps':>6} {'covered':>8} {'over MiB':>9} {'reserved/peak':>14} {'fallback':>9}")
    rows = list(acc["classes"].items())[:args.top] + [("(all)", acc["all"])]
    for name, r in rows:
        over = "-" if r["over_mb"] is None else f"{r['over_mb']:.1f}"
        ratio = "-" if r["reserved_vs_peak"] is None else f"{r['reserved_vs_peak']:.2f}"
        print(f"{name[:28]:<28} {r['steps']:>6} {r['covered']:>8.1%} {over:>9} {ratio:>14} {r['fallback']:>9}")
    return 0
