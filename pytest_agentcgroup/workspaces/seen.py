"""What a trajectory saw of its task's files, as evidence for the release its workspace is built from.

Its editor's views (`cat -n` rows) and edits (`old_str`, `insert`), and its shell's views: the
outputs of read-only commands whose lines can be placed in a file (`bash_view`):

    cat F                       nl -ba F | sed -n 'A,Bp'       cat -n F | grep ... | head
    sed -n 'A,Bp' F             grep -n PATTERN F              head -n N F

The rows of a numbered view (`cat -n`, `nl`, `grep -n`) carry their line numbers through later
filters that only select rows (`sed -n 'A,Bp'`, `head`/`tail -n N`, `grep PATTERN`); an unnumbered one (`cat`, `sed -n`, `head`) is placed only where its range says. A recorded
output is a head, cut anywhere: its last line counts only when the output ended with a newline.
Also: a version the outputs name, whether the trajectory's environment lacked pytest, and the
modules it ran with `python -m`.

Imports only traces/ from the package: choose.py weighs what this module finds.
"""
from __future__ import annotations

import posixpath
import re
import shlex

from ..traces.ir import Step, Trace
from ..traces.task import Task


def outputs(trace: Trace) -> list[tuple[int, str]]:
    return [(s.step_id, s.recorded_output) for s in trace.steps if s.recorded_output]


_DIFF_INDEX = re.compile(r"(?m)^diff --git a/(\S+) b/\S+\n(?:(?!diff --git ).*\n)*?index ([0-9a-f]{7,40})\.\.[0-9a-f]{7,40}")


def recorded_blobs(trace: Trace) -> dict[str, str]:
    """{path: blob id prefix} of the files a recorded `git diff` shows changed: its `index A..B`
    line names A, the file's blob at the commit the agent started from (the first diff of a path
    counts; a file the agent added, index 0000000, names none)."""
    out: dict[str, str] = {}
    for _, text in outputs(trace):
        for m in _DIFF_INDEX.finditer(text):
            if m.group(1) not in out and m.group(2).strip("0"):
                out[m.group(1)] = m.group(2)
    return out


def _failed(step) -> bool:
    return step.recorded_outcome is not None and step.recorded_outcome.status != "ok"


def named_version(trace: Trace, project: str, candidates: list[str]) -> tuple[str, int] | None:
    """(version, step) where the trajectory's outputs name a candidate release of `project`."""
    names = "|".join(re.escape(n) for n in {project, project.replace("-", "_"), project.replace("_", "-")})
    pat = re.compile(rf"(?i)(?:\b(?:{names})(?:==|[-\s]+v?)|Name:\s*(?:{names})\s*\nVersion:\s*)(\d+(?:\.\d+)+)\b")
    for step_id, text in outputs(trace):
        for m in pat.finditer(text):
            if m.group(1) in candidates:
                return m.group(1), step_id
    return None


_VIEW_LINE = re.compile(r"^\s*(\d+)\t(.*)$")
_NO_PYTEST = re.compile(r"(?m)(?:^|\s)pytest: (?:command )?not found|No module named '?pytest'?\s*$")


def pytest_lacked(trace: Trace) -> int | None:
    """The step whose recorded output says the trajectory's environment had no pytest (SWE-bench's
    sympy images have none), when it never shows pytest running; else None."""
    for step_id, text in outputs(trace):
        if _NO_PYTEST.search(text):
            return step_id
    return None


#: `python -m M` (python, python3, python3.9 ...) at the start of a command or of a stage of one
_MODULE_RUN = re.compile(r"(?:^|[;&|(]\s*)(?:\S*/)?python(?:\d+(?:\.\d+)?)?\s+-m\s+([A-Za-z_]\w*)")


def modules_run(trace: Trace) -> dict[str, int]:
    """{module: the first step}: the top-level modules the trajectory ran as `python -m M` in a
    step whose recorded outcome was a success: its environment had them."""
    out: dict[str, int] = {}
    for step in trace.steps:
        if step.recorded_outcome is None or step.recorded_outcome.status != "ok" or not step.command:
            continue
        for m in _MODULE_RUN.finditer(step.command):
            out.setdefault(m.group(1), step.step_id)
    return out


def _view_lines(head: str, text: str | None) -> int:
    """How many of an editor's `cat -n` view's numbered lines `text` has at that line number."""
    rows = head.splitlines()[1:-1]              # the first is the editor's title, the last may be cut
    return _agree({int(m.group(1)): m.group(2) for x in rows if (m := _VIEW_LINE.match(x))}, text)


_GREP_ROW = re.compile(r"^(\d+)[:-](.*)$")         # grep -n: N:match, N-context
_SED_RANGE = re.compile(r"^(\d+)(?:,(\d+))?p$")


def _stages(command: str) -> tuple[str | None, list[list[str]]] | None:
    """(the directory of a leading `cd DIR &&`, the pipeline's stages), or None when the command does
    anything else: lists, redirections, substitutions, variables, more than one line."""
    if any(c in command for c in "`$\n"):
        return None
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = ""                     # `#` inside a word is the word's, as in bash
        tokens = list(lex)
    except ValueError:
        return None
    cd = None
    if len(tokens) > 3 and tokens[0] == "cd" and tokens[2] == "&&":
        cd, tokens = tokens[1], tokens[3:]
        if not _plain_path(cd):
            return None
    if any(set(t) <= set("|&;<>()") and t != "|" for t in tokens):
        return None
    out, cur = [], []
    for t in tokens:
        if t == "|":
            out.append(cur)
            cur = []
        else:
            cur.append(t)
    out.append(cur)
    return (cd, out) if all(out) else None


def _plain_path(path: str) -> bool:
    """A path the shell takes as it is: no option, glob, brace, tilde or `cd -`."""
    return bool(path) and not path.startswith("-") and not any(c in path for c in "*?[]{}~")


def _filter_keeps_rows(stage: list[str]) -> bool:
    """Whether a stage after a numbered view only selects whole rows of its input: `sed -n` with a
    line range, `head`/`tail` by lines, `grep` by one pattern (no -o, no file)."""
    prog, args = stage[0], stage[1:]
    if prog == "sed":
        return _sed_range(args) is not None and len(args) == 2
    if prog == "head":
        return _head_count(args, 0) is not None
    if prog == "tail":
        return _head_count([a.replace("+", "", 1) if i == 1 else a for i, a in enumerate(args)], 0) is not None
    if prog == "grep":
        return _grep_pattern(args) is not None
    return False


def _sed_range(args: list[str]) -> tuple[int, int | None] | None:
    """(first, last) of `sed -n 'A,Bp'` / `sed -n Ap` (args after `sed`), with at most a file after."""
    if len(args) < 2 or args[0] != "-n" or not (m := _SED_RANGE.match(args[1])) or len(args) > 3:
        return None
    first = int(m.group(1))
    return first, int(m.group(2)) if m.group(2) else first


def _head_count(args: list[str], files: int) -> int | None:
    """N of `head -n N` / `head -N` (args after `head`) followed by exactly `files` file names."""
    if args[:1] == ["-n"] and len(args) == 2 + files and args[1].isdigit():
        return int(args[1])
    if args and re.fullmatch(r"-\d+", args[0]) and len(args) == 1 + files:
        return int(args[0][1:])
    return None


def _grep_file(args: list[str]) -> str | None:
    """The one file of `grep -n ... PATTERN FILE` (options that keep `N:text` rows only)."""
    got = _grep_operands(args)
    if got is None or "n" not in got[0] or len(got[1]) != 2:
        return None
    return got[1][1]


def _grep_pattern(args: list[str]) -> str | None:
    """The pattern of a `grep ... PATTERN` reading its input (a filter: no file, no -n)."""
    got = _grep_operands(args)
    return got[1][0] if got is not None and "n" not in got[0] and len(got[1]) == 1 else None


def _grep_operands(args: list[str]) -> tuple[set[str], list[str]] | None:
    """(its one-letter options, its operands) of a grep whose options select whole lines only."""
    opts, rest, i = set(), [], 0
    while i < len(args):
        a = args[i]
        if a in ("-A", "-B", "-C", "-e", "-m"):
            if i + 1 >= len(args):
                return None
            i += 2
            rest += [args[i - 1]] if a == "-e" else []
            continue
        if a.startswith("-") and len(a) > 1 and not a.startswith("--"):
            opts |= set(a[1:])
        elif a.startswith("--"):
            return None
        else:
            rest.append(a)
        i += 1
    if opts - set("niwvEFPxs"):
        return None
    return opts, rest


def bash_view(step: Step, base: str) -> tuple[str, dict[int, str]] | None:
    """(the file relative to `base`, {line number: text}) of a shell step's successful read-only view
    of one file under `base` (module docstring); None for any other step."""
    out, cmd = step.recorded_output, step.args.get("command")
    if step.tool != "bash" or _failed(step) or not out or not isinstance(cmd, str) or len(cmd) > 4096:
        return None
    parsed = _stages(cmd)
    if not parsed:
        return None
    cd, (first, *filters) = parsed
    prog, args = first[0], first[1:]
    numbered, start, path = False, 1, None
    if prog == "cat" and len(args) == 1:
        path = args[0]
    elif prog == "cat" and len(args) == 2 and args[0] == "-n" or prog == "nl" and len(args) == 2 and args[0] == "-ba":
        numbered, path = True, args[1]
    elif prog == "sed" and (r := _sed_range(args)) and len(args) == 3:
        start, path = r[0], args[2]
    elif prog == "head" and _head_count(args, 1) is not None:
        path = args[-1]
    elif prog == "grep" and (path := _grep_file(args)):
        numbered = True
    if path is None or not _plain_path(path):
        return None
    if numbered:
        if not all(_filter_keeps_rows(f) for f in filters):
            return None
    elif filters:                               # an unnumbered view may only be cut by sed -n A,Bp or head
        if len(filters) > 1 or start != 1:
            return None
        f = filters[0]
        if f[0] == "sed" and (r := _sed_range(f[1:])) and len(f) == 3:
            start = r[0]
        elif not (f[0] == "head" and _head_count(f[1:], 0) is not None):
            return None
    cwd = step.args.get("cwd") if isinstance(step.args.get("cwd"), str) else base.rstrip("/")
    full = posixpath.normpath(posixpath.join(cwd, cd or "", path))
    if not full.startswith(base):
        return None
    lines = out.split("\n")
    lines = lines[:-1]                           # after a final newline: empty; else: the cut line
    if numbered:
        row = _GREP_ROW if prog == "grep" else _VIEW_LINE
        rows = {int(m.group(1)): m.group(2) for x in lines if (m := row.match(x))}
    else:
        rows = {start + i: x for i, x in enumerate(lines)}
    return full[len(base):], rows


def _agree(rows: dict[int, str], text: str | None) -> int:
    """How many of a view's non-blank rows `text` has at that line number."""
    lines = text.split("\n") if text is not None else []
    return sum(1 for n, x in rows.items() if x.strip() and 0 < n <= len(lines)
               and lines[n - 1].expandtabs().rstrip() == x.expandtabs().rstrip())


def edit_score(trace: Trace, task: Task, files: dict[str, str]) -> tuple[int, int, int]:
    """(edits applied, edits tried, lines agreeing) of the trajectory's recorded, successful edits
    and views of files the sdist's tree should have had, replayed in order on `files` (relative
    path -> text): the lines are the views' rows (editor and shell) and the edits' `old_str` lines found."""
    base = (task.path or "").rstrip("/") + "/"
    state, created, applied, tried, agree = dict(files), set(), 0, 0, 0
    for s in trace.steps:
        a = s.args
        if s.tool == "bash" and (view := bash_view(s, base)) and view[0] not in created:
            agree += _agree(view[1], state.get(view[0]))
            continue
        if s.tool not in ("edit", "read") or _failed(s) or not isinstance(a.get("path"), str) \
                or not a["path"].startswith(base):
            continue
        rel, op = a["path"][len(base):], a.get("op")
        if s.tool == "read":
            if s.recorded_output and rel not in created:
                agree += _view_lines(s.recorded_output, state.get(rel))
            continue
        if op in ("create", "write") and isinstance(a.get("file_text"), str):     # a whole content
            state[rel] = a["file_text"]
            created.add(rel)
            continue
        if op not in ("str_replace", "insert"):
            continue
        if rel not in created:
            tried += 1
        text = state.get(rel)
        if text is None:
            continue
        if op == "str_replace" and isinstance(a.get("old_str"), str) and rel not in created:
            have = set(text.split("\n"))
            agree += sum(1 for line in a["old_str"].split("\n") if line.strip() and line in have)
        if op == "str_replace" and isinstance(a.get("old_str"), str) and a["old_str"] and text.count(a["old_str"]) == 1:
            state[rel] = text.replace(a["old_str"], a.get("new_str") or "", 1)
        elif op == "insert" and isinstance(a.get("insert_line"), int) and 0 <= a["insert_line"] <= len(text.split("\n")):
            lines = text.split("\n")
            state[rel] = "\n".join(lines[:a["insert_line"]] + str(a.get("new_str") or "").split("\n") + lines[a["insert_line"]:])
        else:
            continue
        applied += rel not in created
    return applied, tried, agree



def paths_seen(trace: Trace, task: Task) -> set[str]:
    """The files (relative to the task's path) the trajectory edited or viewed, by editor or shell."""
    base = (task.path or "").rstrip("/") + "/"
    seen = {s.args["path"][len(base):] for s in trace.steps if s.tool in ("edit", "read")
            and isinstance(s.args.get("path"), str) and s.args["path"].startswith(base)}
    return seen | {v[0] for s in trace.steps if s.tool == "bash" and (v := bash_view(s, base))}


def crlf_seen(trace: Trace, task: Task, files: dict[str, str]) -> bool:
    """Whether a file the trajectory edited or viewed has CRLF line ends in the sdist."""
    return any("\r\n" in files.get(rel, "") for rel in paths_seen(trace, task))


def absent(trace: Trace, task: Task, files: dict[str, str]) -> list[str]:
    """Files the trajectory viewed or edited (not created) that the sdist does not have: an sdist
    often leaves the tests out, and the steps that use them then diverge."""
    base = (task.path or "").rstrip("/") + "/"
    created, out = set(), []
    for s in trace.steps:
        rel = s.args.get("path", "")[len(base):] if isinstance(s.args.get("path"), str) \
            and s.args["path"].startswith(base) else None
        if not rel or s.tool not in ("edit", "read") or _failed(s):
            continue
        if s.tool == "edit" and s.args.get("op") in ("create", "write"):
            created.add(rel)
        elif rel not in created and rel not in files and not any(k.startswith(rel.rstrip("/") + "/") for k in files) \
                and rel not in out:
            out.append(rel)
    return out

