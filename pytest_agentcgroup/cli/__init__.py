"""`agentcgroup`: the command line of pytest-agentcgroup, the one place that parses arguments. This
module holds the top-level parser; each command group has a module here that adds its parsers and
runs its commands by calling the library's functions (`python -m pytest_agentcgroup.cli` is the same).

    agentcgroup traces convert SRC... -o OUT [--format F] [--to ir|atif] [--json]        (traces.py)
    agentcgroup traces validate FILE_OR_DIR... [--json]
    agentcgroup traces stats FILE_OR_DIR... [--json]
    agentcgroup traces characterize FILE_OR_DIR... [--json]
    agentcgroup traces fetch [-n N] [--repo R] [--revision REV] [--source FILE] [--cache DIR] [-o OUT] [--json]
    agentcgroup traces select FILE_OR_DIR... -o OUT [--seed S] [--include-unfaithful] [--json]   (subsets.py)
    agentcgroup traces sweep CORPUS [-n N] [--from SUBSET] [--smoke NAME] [--include-unfaithful] [--write-manifest]
    agentcgroup traces profile TRACES... -o DIR [--executor sandbox|docker] [--workspace DIR] [--image IMG]
                               [--step-timeout S]                                        (profile.py)
    agentcgroup traces fidelity RECORDED... [--repeat N] [--json OUT]   (exit 3: fidelity goals missed; fidelity.py)
    agentcgroup traces faithfulness TRACES... [--subset NAME] [--threshold T] [--factor F] [--slack-s S] [--json]
                                                                                        (faithfulness.py)
    agentcgroup traces lock TRACES... [-o LOCK] [--project P] [--version V] [--again] [--build]  (lock.py)
    agentcgroup report DIR... [-o OUT] [--markdown [--title T]] [--config TOML] [--trace ID]...
                       [--default AXIS=VALUE]...  |  report --publish FILE                (report.py)
    agentcgroup compare A B [--tol RULES]... [--only-worse] [--all] [--json]     (rules: docs/gate.md, "Tolerances")
    agentcgroup merge RUN... -o OUT [--config TOML] [--partial]      (the shards of one run; merge.py)
    agentcgroup images clean [--image NAME]...                                           (machine.py)
    agentcgroup emulator clean
    agentcgroup bpf features
    agentcgroup doctor [GROUP...]     (exit 1: a program of those set-up groups is missing)
    agentcgroup tools build-corpus SRC OUT | browser-record DATASETS OUT                 (tools.py)
    agentcgroup tools recorded-here workspace|traces DIR | recorded-outcomes DATASET CORPUS | webapp
    agentcgroup predict train CORPUS -o MODEL [--subset S] [-k K]  |  predict accuracy MODEL    (predict.py)
                       [--quantile Q] [--folds task|repository] [--margin-mb M] [--json]
    agentcgroup exec --session DIR [--arm ARM] [--config F] [--timeout S] -- CMD...  |  --session DIR --end
                     (live.py; exit: the command's, 137 stopped by the arm, 124 timeout, 125 not run)

Exit codes (`compare` differs: 1 = differences beyond tolerance, 2 = usage or unreadable input;
`merge` likewise: 1 = a claim refuted or not measured, 2 = usage or runs that cannot be merged):
0 everything worked; 1 bad input (a file or record that did not convert or validate,
named on stderr, or nothing to do); 2 usage error (unknown option, missing argument, unknown format).

May import anything in the package: an entry point, on top with plugin.py. Nothing imports it.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

EXIT_OK, EXIT_BAD_INPUT, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error exits with EXIT_USAGE (it already does: 2) and says where to look."""

    def error(self, message: str):  # pragma: no cover - argparse formats and exits
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")


def command_group(sub, name: str, help: str, description: str):
    """A command with subcommands (`agentcgroup NAME SUBCOMMAND ...`): its subparsers, one required."""
    group = sub.add_parser(name, help=help, description=description)
    commands = group.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)
    commands.required = True
    return commands


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="agentcgroup", description="Trace-driven OS resource-control experiments for AI-agent "
                "workloads. Work with agent traces: convert public formats to the trace IR, check IR files, "
                "summarise them; report on results directories and compare two runs; check and clean this "
                "machine's set-up; regenerate the shipped corpus.",
                epilog="Exit codes: 0 ok, 1 bad input (named on stderr), 2 usage error; compare: 1 = differences "
                       "beyond tolerance, 2 = usage error or unreadable input; exec: the command's own, 137 stopped "
                       "by the arm, 124 past its timeout, 125 not run.")
    sub = p.add_subparsers(dest="group", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    tsub = command_group(sub, "traces", help="fetch, convert, validate, summarise and select agent traces",
                         description="Fetch, convert, validate, summarise and select agent traces.")
    # the groups' modules import `EXIT_*` from here: imported once this module has run
    from . import faithfulness, fidelity, live, lock, machine, merge, predict, profile, report, subsets, tools, \
        traces as trace_commands
    trace_commands.add_parsers(tsub)
    subsets.add_parsers(tsub)
    profile.add_parser(tsub)
    fidelity.add_parser(tsub)
    faithfulness.add_parser(tsub)
    lock.add_parser(tsub)
    report.add_parsers(sub)
    merge.add_parser(sub)
    machine.add_parsers(sub)
    tools.add_parsers(sub)
    live.add_parser(sub)
    predict.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `agentcgroup ... | head`
        return EXIT_OK
