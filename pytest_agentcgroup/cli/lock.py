"""`agentcgroup traces lock`: pin the PyPI workspace of each trace's task in a corpus's lock file
(workspaces/choose.py picks the release and resolves the environment; network: PyPI), and with
--build build them into the cache now (workspaces/build.py) so that replays need no network at all."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from ..traces.corpus import LOCK_FILE
from ..traces.ir import TraceError, read_traces
from ..traces.task import task_of
from ..workspaces.build import build, built_dir
from ..workspaces.lock import COMMIT, SYSTEMS, LockFile, WorkspaceError, local_repository_refused, task_key
from . import EXIT_BAD_INPUT, EXIT_OK


def add_parser(tsub) -> argparse.ArgumentParser:
    p = tsub.add_parser(
        "lock", help="pin each trace's task workspace (a PyPI sdist and its environment) in a lock file",
        description="For each trace that names a task (instance id, repository, version, the path the agent "
                    "used), choose the release of the project on PyPI whose sdist is the task's source (a "
                    "version the trajectory's outputs name; else the one whose sdist applies the most of its "
                    "edits; else the newest of the task's version series), resolve the environment its "
                    "commands need (the sdist's requirements with their test extras, and pytest; wheels only, "
                    "held to the project's era) for the sandbox's python3, and write every file's sha256 to "
                    f"the lock (default: {LOCK_FILE} in the traces' directory). A replay builds the locked "
                    "workspace once into the cache, and copies it in for every trace x arm. Needs PyPI.",
        epilog=f"Example: agentcgroup traces lock traces/real -o traces/real/{LOCK_FILE} --build. Exit codes: 0 "
               "ok, 1 a trace that could not be locked (named on stderr; the others are written), 2 usage error.")
    p.add_argument("files", nargs="+", metavar="TRACES", type=Path, help="IR trace files or directories of them")
    p.add_argument("-o", "--output", type=Path, metavar="LOCK", help=f"the lock file (default: <dir>/{LOCK_FILE})")
    p.add_argument("--project", help="the PyPI project (default: the task repository's name)")
    p.add_argument("--version", help="the release to use (default: chosen as described)")
    p.add_argument("--python", metavar="X.Y", choices=sorted(v for _, v in SYSTEMS.values()),
                   help="make the environment of the Debian root whose python3 this is (%(choices)s: its /usr "
                        "is what the steps see; made once with debootstrap, as root) instead of the host's "
                        "python3: for a project that no longer installs or imports on the host's")
    p.add_argument("--git", metavar="URL",
                   help="the source is this repository (an https, http, git or file URL, or a local path) checked "
                        "out at the task's base commit, with its .git, instead of a PyPI sdist; its dependencies "
                        "are held to the commit's date")
    p.add_argument("--commit", metavar="SHA", help="with --git: the commit (40 hex digits) when the task names none")
    p.add_argument("--commits", metavar="TSV", type=Path,
                   help="with --git: each task's commit and where it was found, one task a line: KEY<TAB>COMMIT<TAB>"
                        "WHERE ('#' starts a comment); the lock entry keeps WHERE as its commit_from")
    p.add_argument("--require", metavar="SPEC", action="append", default=[],
                   help="a requirement the task's specification adds to the environment (repeatable; "
                        "mpmath==1.3.0: one pinned with == is kept as it is)")
    p.add_argument("--again", action="store_true", help="lock tasks the lock already has again")
    p.add_argument("--build", action="store_true", help="also build each locked workspace into the cache now")
    p.set_defaults(func=cmd_lock)
    return p


def _traces(paths: list[Path]):
    for path in paths:
        files = sorted(f for f in path.rglob("*") if f.suffix in (".json", ".jsonl") and f.name not in
                       ("manifest.json", LOCK_FILE)) if path.is_dir() else [path]
        for f in files:
            yield from read_traces(f)


def read_commits(path: Path) -> dict[str, tuple[str, str]]:
    """{task key: (commit, where it was found)} of a --commits file; WorkspaceError naming its line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkspaceError(f"--commits {path}: cannot read it: {exc}") from None
    out = {}
    for n, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or not COMMIT.fullmatch(parts[1]) or not parts[2].strip() or not parts[0].strip():
            raise WorkspaceError(f"--commits {path}, line {n}: expected KEY<TAB>COMMIT (40 hex digits)<TAB>WHERE")
        out[parts[0]] = (parts[1], parts[2].strip())
    return out


def cmd_lock(args) -> int:
    from ..workspaces.choose import lock     # packaging: only when locking (`agentcgroup` starts without it)
    if (args.commit or args.commits) and not args.git:
        print("agentcgroup traces lock: --commit and --commits go with --git (the repository to check out)", file=sys.stderr)
        return 2
    if args.commit and args.commits:
        print("agentcgroup traces lock: --commit (one for every task) or --commits (one a task), not both", file=sys.stderr)
        return 2
    if args.git and args.version:
        print("agentcgroup traces lock: --version chooses a release; with --git the source is a commit", file=sys.stderr)
        return 2
    if args.git and "://" not in args.git:
        args.git = str(Path(args.git).absolute())       # a local repository (the lock names it relative to itself)
    out = args.output or ((args.files[0] if args.files[0].is_dir() else args.files[0].parent) / LOCK_FILE)
    bad = 0
    try:
        lockfile = LockFile.read(out)
        traces = list(_traces(args.files))
        commits = read_commits(args.commits) if args.commits else None
    except (WorkspaceError, TraceError) as exc:
        print(f"agentcgroup traces lock: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.git and (why := local_repository_refused(args.git, out.parent)) is not None:
        print(f"agentcgroup traces lock: --git {why}", file=sys.stderr)
        return EXIT_BAD_INPUT
    # a local repository inside the corpus is named relative to the lock: the corpus may move
    named = (Path(args.git).resolve().relative_to(out.parent.resolve()).as_posix()
             if args.git and "://" not in args.git else args.git)
    for trace in traces:
        task = task_of(trace)
        key = task_key(task) if task else None
        if key is None:
            print(f"{trace.trace_id}: names no task; nothing to lock")
            continue
        try:
            if key not in lockfile.entries or args.again:
                commit, where = commits.get(key, (None, None)) if commits is not None else (args.commit, None)
                if commits is not None and commit is None:
                    raise WorkspaceError(f"--commits {args.commits} names no commit for task {key}")
                entry = lock(trace, project=args.project, version=args.version, python=args.python, git=args.git,
                             commit=commit, commit_from=where, require=tuple(args.require))
                lockfile.entries[key] = dataclasses.replace(entry, repository=named, chosen_by=entry.chosen_by.replace(
                    args.git, named)) if args.git else entry
                lockfile.write()
            entry = lockfile.entries[key]
            print(f"{trace.trace_id}: {key} -> {entry.describe()}: {entry.chosen_by}")
            for note in entry.notes:
                print(f"  note: {note}")
            if args.build:
                build(entry)
                print(f"  built: {built_dir(entry)}")
        except WorkspaceError as exc:
            bad += 1
            print(f"agentcgroup traces lock: {trace.trace_id}: {exc}", file=sys.stderr)
    print(f"lock: {out} ({len(lockfile.entries)} workspace(s))")
    return EXIT_BAD_INPUT if bad else EXIT_OK
