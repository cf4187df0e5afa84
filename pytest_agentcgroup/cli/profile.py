"""`agentcgroup traces profile`: the command line of the profiler (profile/run.py), with a progress line on
stderr and one message for whatever stops it (a bad trace file, a missing workspace, no cgroups
or executor here)."""
from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import signal
import sys
import time
from pathlib import Path

from ..cgroups.host import CgroupUnavailable
from ..errors import ExecutorUnavailable
from ..profile.run import ProfileError, Settings, profile_traces
from ..workspaces.provide import EMPTY

EXIT_OK, EXIT_BAD_INPUT = 0, 1


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def _family(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@+-]*", text):
        raise argparse.ArgumentTypeError(f"not a trace family name (letters, digits, ._@+-; no /): {text!r}")
    return text


def add_parser(tsub) -> argparse.ArgumentParser:
    p = tsub.add_parser(
        "profile", help="run each trace's real commands once, step by step, and record their profiles",
        description="Run every executing step (bash, python) of each trace once, in order, in one workspace "
                    "per trace, each step in a fresh cgroup of its own under a real executor (sandbox: "
                    "bubblewrap as an unprivileged user; docker: a container of the trace's image), and write "
                    "the traces to OUT/<trace_id>.json with profiles whose numbers are `recorded`: duration, "
                    "the kernel's memory peak (where the kernel keeps none, the curve's highest reading, `derived`), "
                    "a memory curve sampled every few ms, CPU user+sys, IO bytes where the kernel counts them per "
                    "cgroup and the workspace is not a tmpfs, and the step's outcome (ok, failed, timeout, oom, error). "
                    "The old figures stay beside them (`original`). An edit recorded in full is applied and profiled "
                    "like a command; other steps that are not commands (read, search, noop, browser, an edit "
                    "kept as its size) keep their profile. OUT/manifest.json lists the traces (subset "
                    "--subset). Resumable: a trace already complete in OUT is skipped; run the same command "
                    "again after an interruption. -n N profiles N traces at a time on disjoint CPUs. The last line says "
                    "the wall time and the profiler's own peak memory. Needs root (cgroups, the sandbox's bounded "
                    "workspace).",
        epilog="Example (after `agentcgroup tools recorded-here traces /tmp/commands`, and its `workspace`): "
               "agentcgroup traces profile /tmp/commands -o /tmp/profiled "
               "--workspace .cache/recorded-here/workspace. Exit codes: 0 ok, 1 bad input or cannot run "
               "here (named on stderr), 2 usage error, 130 interrupted (rerun to resume).")
    p.add_argument("files", nargs="+", metavar="TRACES", type=Path, help="IR trace files or directories of them")
    p.add_argument("-o", "--output", required=True, type=Path, metavar="DIR", help="output directory (created)")
    p.add_argument("--executor", choices=("sandbox", "docker"), default="sandbox",
                   help="where the commands run (default sandbox); never outside one of these")
    p.add_argument("--workspace", metavar="DIR",
                   help="a directory copied to each trace's task path (or working directory) before its first "
                        "step, e.g. a repository checkout; `empty` for an empty one. Default: a trace that names "
                        "a task gets its task's image (docker, where present) or the PyPI workspace locked for "
                        "it in the workspaces.lock.json of the traces' directory or the nearest one above it, up to "
                        "the corpus root (built on first use), else fails naming "
                        "what is missing; one that names none starts empty")
    p.add_argument("--image", metavar="IMG", help="docker: the image to run in (default: the trace's SWE-rebench "
                                                   "image when it is present locally, else the local image)")
    p.add_argument("--step-timeout", type=_positive(float), default=120.0, metavar="S",
                   help="a step's timeout in seconds (default 120; a trace's own shorter timeout wins)")
    p.add_argument("--memory-max-mb", type=_positive(int), default=4096, metavar="MB",
                   help="each step's hard memory limit (default 4096); a step OOM-killed at it is `oom`")
    p.add_argument("--pids-max", type=_positive(int), default=1024, metavar="N", help="each step's pids limit (default 1024)")
    p.add_argument("-n", "--workers", type=_positive(int), default=1, metavar="N",
                   help="profile N traces at a time, each worker process on its own slice of this process's "
                        "CPUs and 1/N of its memory (default 1; at most one per CPU)")
    p.add_argument("--subset", default="profiled", help="manifest subset listing the traces (default profiled)")
    p.add_argument("--family", metavar="NAME", type=_family,
                   help="write each trace as NAME/<the rest of its id> (claude-code/haiku/x -> NAME/haiku/x), so "
                        "that its profiled copy sits beside the original in one corpus")
    p.add_argument("--json", action="store_true", help="print {profiled, skipped, peak_rss_mib} as JSON on stdout")
    p.set_defaults(func=cmd_profile)
    return p


class StepsBar:
    """The profiler's progress on stderr: on a terminal, a tqdm bar of the steps done with its ETA
    and the current step's line beside it; otherwise (logs, CI) a line per step, its ETA at the end."""

    def __init__(self, tty: bool):
        self.tty, self.bar = tty, None
        self.started, self.done, self.total = None, 0, 0

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text)
            return
        eta = self.eta()
        print(text + (f" ({self.done}/{self.total} steps, about {eta} left)" if eta else ""), file=sys.stderr,
              flush=True)

    def advance(self, done: int, total: int) -> None:
        if self.started is None:                # the steps' clock, not the set-up's (images, workspaces)
            self.started = time.monotonic()
        if self.tty and self.bar is None and total:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="step", file=sys.stderr, dynamic_ncols=True)
        self.done, self.total = done, total
        if self.bar is not None:
            self.bar.update(done - self.bar.n)

    def eta(self) -> str | None:
        if self.started is None or not self.done or self.done >= self.total:
            return None
        left = (time.monotonic() - self.started) / self.done * (self.total - self.done)
        return f"{left / 60:.0f} min" if left >= 60 else f"{left:.0f} s"

    def close(self) -> None:
        bar, self.bar = self.bar, None
        if bar is not None:
            bar.close()


def cmd_profile(args) -> int:
    if args.image and args.executor != "docker":
        print("agentcgroup traces profile: --image needs --executor docker", file=sys.stderr)
        return EXIT_BAD_INPUT
    # `empty` as typed is the keyword; ./empty a directory of that name
    workspace = args.workspace if args.workspace in (None, EMPTY) else Path(args.workspace)
    settings = Settings(executor=args.executor, workspace=workspace, image=args.image,
                        step_timeout_s=args.step_timeout, memory_max_mb=args.memory_max_mb, pids_max=args.pids_max,
                        subset=args.subset, family=args.family, command=shlex.join(["agentcgroup", *sys.argv[1:]]))
    bar = StepsBar(sys.stderr.isatty())
    # a SIGTERM (a CI job cancelled, `timeout`) stops the profiler as ^C does: the step is killed and
    # its cgroups, workspace and container are removed on the way out
    def terminated(signum, frame):
        raise KeyboardInterrupt
    old_term = signal.signal(signal.SIGTERM, terminated)
    started = time.monotonic()
    try:
        done = profile_traces(args.files, args.output, settings, progress=bar.line, advance=bar.advance,
                              workers=args.workers)
    except (ProfileError, CgroupUnavailable, ExecutorUnavailable) as exc:
        bar.close()
        print(f"agentcgroup traces profile: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        if not type(exc).__module__.startswith("docker."):
            raise
        # the Docker engine refused something (an image, a container): its own words, no traceback
        bar.close()
        print(f"agentcgroup traces profile: docker: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        bar.close()
        print(f"\nagentcgroup traces profile: interrupted; traces complete in {args.output} are kept, "
              "run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
        bar.close()
    rss = done.get("peak_rss_mib") or {}
    memory = (f"; profiler peak RSS {rss['profiler']:.0f} MiB" if "profiler" in rss else "") + \
             (f", largest worker {rss['largest_worker']:.0f} MiB" if "largest_worker" in rss else "")
    print(f"profiled {len(done['profiled'])} trace(s), skipped {len(done['skipped'])} already complete, in "
          f"{args.output} ({time.monotonic() - started:.0f} s, -n {args.workers}{memory})", file=sys.stderr)
    if args.json:
        print(json.dumps(done))
    return EXIT_OK
