"""`agentcgroup exec`: one tool call of a live session kept in a directory (live/stored.py), run in a
cgroup of its own under the session's arm, its output printed, its exit code passed on; `--end`
ends the session (docs/live.md).

Exit codes: the command's own; EXIT_KILLED_MEMORY when the arm stopped it (its memory limit, or
its policy), EXIT_TIMEOUT when it ran past --timeout (the note saying which on stderr);
EXIT_RUNNER when agentcgroup itself could not run the call (no session, an unknown arm, no
cgroups here: the reason on stderr).
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys

from ..cgroups.host import CgroupUnavailable
from ..errors import ExecutorUnavailable
from ..live.session import EXECUTORS, SessionError
from ..live.stored import end_stored, run_stored
from ..replay.executors.base import DEFAULT_TIMEOUT_S
from ..traces.ir import TraceError

EXIT_KILLED_MEMORY, EXIT_TIMEOUT, EXIT_RUNNER = 137, 124, 125


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser(
        "exec", help="run one tool call of a live agent session under an arm, in a cgroup of its own",
        description="Run CMD as one tool call of the session kept in --session DIR (made on the first call, "
                    "with its cgroup and its trace DIR/trace.json): in a cgroup of its own under the session's, "
                    "with the arm's limits, as a replay runs a step. Prints the command's output; when the arm "
                    "or the timeout stopped it, a one-line note on stderr says what stopped it and at which "
                    "limit. Whatever the call left running in the background is stopped at its end. "
                    "`--end` ends the session: its cgroup removed, its trace finished.",
        epilog=f"Exit codes: the command's own; {EXIT_KILLED_MEMORY} stopped at its memory limit or by the arm's "
               f"policy; {EXIT_TIMEOUT} ran past --timeout; {EXIT_RUNNER} agentcgroup could not run it (the reason "
               "on stderr). Example: agentcgroup exec --session /tmp/s --arm static-toolcall -- python -m pytest -x")
    p.add_argument("--session", required=True, metavar="DIR", help="the session's directory (made when missing)")
    p.add_argument("--arm", help="the arm a new session runs under (default static-toolcall); a running "
                                 "session keeps its own")
    p.add_argument("--config", metavar="TOML", help="the configuration the arm is read from "
                                                    "(default: the checkout's experiments/agentcgroup.toml)")
    p.add_argument("--executor", choices=EXECUTORS, default="host",
                   help="host: as this user in the workspace; sandbox: under bubblewrap as nobody, no network "
                        "(a new session's; default host)")
    p.add_argument("--workspace", default=".", metavar="DIR", help="a new session's workspace (default: here)")
    p.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"the call's wall-clock timeout in seconds (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--json", action="store_true", help="print the call's result as JSON instead of its output")
    p.add_argument("--end", action="store_true", help="end the session (no CMD)")
    p.add_argument("cmd", nargs="*", metavar="CMD", help="the command, after `--` (one argument: a shell "
                                                          "command line; several: an argv, quoted for the shell)")
    p.set_defaults(func=cmd_exec)


def cmd_exec(args) -> int:
    try:
        if args.end:
            if args.cmd:
                print("agentcgroup exec: --end takes no command", file=sys.stderr)
                return EXIT_RUNNER
            trace = end_stored(args.session)
            print(f"session ended; trace: {trace}" if trace else "session ended; it made no call", file=sys.stderr)
            return 0
        if not args.cmd:
            print("agentcgroup exec: no command (give it after `--`)", file=sys.stderr)
            return EXIT_RUNNER
        command = args.cmd[0] if len(args.cmd) == 1 else shlex.join(args.cmd)
        arm = args.arm
        result = run_stored(args.session, command, arm=arm, config=args.config, executor=args.executor,
                            workspace=args.workspace, timeout_s=args.timeout)
    except (SessionError, CgroupUnavailable, ExecutorUnavailable, TraceError) as exc:
        print(f"agentcgroup exec: {exc}", file=sys.stderr)
        return EXIT_RUNNER
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        sys.stdout.write(result.own_output)
        sys.stdout.flush()
        if result.note:
            print(result.note, file=sys.stderr)
    if result.error:
        print(f"agentcgroup exec: {result.error}", file=sys.stderr)
        return EXIT_RUNNER
    if result.kill_cause == "timeout":
        return EXIT_TIMEOUT
    if result.killed:
        return EXIT_KILLED_MEMORY
    return result.exit_code if result.exit_code is not None else EXIT_RUNNER
