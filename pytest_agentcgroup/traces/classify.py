"""Classify shell commands (and traces by their shell commands) into coarse kinds.

Kinds (KINDS):

    test     run a test suite or test file: pytest, py.test, tox, nox, unittest, nosetests,
             `python setup.py test`, `python test_x.py`, `make test`, npm/yarn test, go/cargo test
    install  install packages or create environments: pip/uv/poetry/conda/apt install,
             `python -m venv`, virtualenv, `setup.py install|develop`, npm/yarn install
    build    compile or package: make, cmake, gcc/cc, `setup.py build*`, `python -m build`,
             compileall, cargo/go build, npm run build, tsc, mvn, gradle
    vcs      version control: git (but `git grep` is search), hg, svn
    search   find things: grep, egrep, rg, ag, ack, find, fd, locate, which, `git grep`
    fileops  read/write/move files: cat, head, tail, ls, cp, mv, rm, mkdir, touch, sed, awk,
             echo/printf redirections, wc, diff, chmod, tee, tree, stat, sort, uniq, ...
    other    everything else (python -c snippets, running scripts, pip list, env queries, ...)

`classify_command(cmd)` splits a command line into simple commands at `&&`, `||`, `;`, `|`, `&`
and newlines (quotes respected when the line tokenises; heredoc bodies are ignored), drops
set-up-only commands (cd, source/., export, set, echo, printf, env-var assignments, and prefixes
such as sudo, timeout N, env, time, nohup) and output filters after a `|` (head, tail, grep, sort,
wc, tee, ...: `pytest | tail` is a test, `git log | grep x` is vcs), classifies each remaining
simple command by its program name, and returns the first kind of PRIORITY present:
`pip install x && pytest` is "test", `python x.py && cat out` is "other", `cd /testbed && ls` is
"fileops", and a command with nothing left is "other".

`step_kind(step)` is what a policy keys its priorities by: a shell step's command kind, else the
step's tool (`edit`, `read`, `search`, `browser`, `python`, `noop`).

`command_class(step)` is finer, what the predictive arm's model is keyed by (limits/predict.py):
the program and subcommand of the simple command that gave the command line its kind (`python -m
pytest`, `pip install`, `git diff`, `grep`, `python script`, `python setup.py develop`), with
interpreter and pip versions folded (`python3.9` is `python`); a script's own name is not kept (it
is the task's, `reproduce.py`), only whether it is a test (`python test script`). A line with only
set-up commands is named by its first program (`echo`); a step that is not a shell step, by its tool.

`dominant_kind(commands, weights)` is the trace category: the kind with the largest total weight
(the callers pass each bash step's recorded duration in ms, so the kind the trace spends its shell
time on wins; each weight is floored at 1 so that zero-length steps still count). Ties go to the
earlier kind in KINDS. With no commands at all it is "other".

Extend the tables below (or add kinds at the right priority) as new trace sources appear.
"""
from __future__ import annotations

import os
import re
import shlex
from typing import Iterable, Sequence

KINDS = ("test", "install", "build", "vcs", "search", "fileops", "other")
#: Which kind wins when one command line mixes several (`pip install x && pytest` is "test").
#: "other" (mostly running Python code) outranks "fileops" so `python x.py && cat out` is "other".
PRIORITY = ("test", "install", "build", "vcs", "search", "other", "fileops")

_SETUP = {"cd", "pushd", "popd", "source", ".", "export", "set", "unset", "alias", "true", "false", ":",
          "deactivate", "ulimit", "umask", "shopt", "trap", "exit", "return", "wait", "echo", "printf", "pwd"}
_FILTERS = {"head", "tail", "grep", "egrep", "fgrep", "rg", "sort", "uniq", "wc", "cut", "tr", "tee", "less",
            "more", "column", "nl", "awk", "sed", "cat", "jq", "xargs"}
_PREFIX = {"sudo", "env", "time", "nohup", "nice", "ionice", "stdbuf", "command", "exec", "xvfb-run"}
_SEARCH = {"grep", "egrep", "fgrep", "rg", "ag", "ack", "find", "fd", "locate", "which", "whereis", "type"}
_FILEOPS = {"cat", "head", "tail", "ls", "cp", "mv", "rm", "rmdir", "mkdir", "touch", "sed", "awk", "echo",
            "printf", "wc", "diff", "cmp", "chmod", "chown", "ln", "tee", "tree", "stat", "file", "less", "more",
            "sort", "uniq", "cut", "tr", "xxd", "od", "hexdump", "patch", "tar", "unzip", "zip", "gzip",
            "gunzip", "du", "df", "readlink", "realpath", "basename", "dirname", "nl", "column", "truncate",
            "dd", "install", "rsync", "pwd"}
_VCS = {"git", "hg", "svn", "gh"}
_BUILD = {"make", "cmake", "ninja", "gcc", "g++", "cc", "c++", "clang", "clang++", "ld", "tsc", "mvn", "gradle",
          "cython", "meson", "javac", "rustc", "bazel"}
_TEST_PROGS = {"pytest", "py.test", "tox", "nox", "nosetests", "trial", "unittest"}
_INSTALL_PROGS = {"virtualenv", "pipx", "apt", "apt-get", "yum", "dnf", "apk", "brew", "conda", "mamba",
                  "micromamba"}
_PY = re.compile(r"^(python|python\d+(\.\d+)?|pypy3?|ipython)$")
_PY_TEST_MODULES = {"pytest", "unittest", "nose", "tox", "nox", "doctest", "trial"}
_PY_INSTALL_MODULES = {"venv", "virtualenv", "ensurepip"}
_PY_BUILD_MODULES = {"build", "compileall", "py_compile", "setuptools", "cython"}
_SEPARATORS = set(";&|()\n")
_REDIRECT = set(";&|()<>\n")
_SPLIT = re.compile(r"&&|\|\||[;|&\n]")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1[^\n]*\n.*?\n\s*\2\s*(?:\n|$)", re.S)


def _segments(cmd: str) -> list[list[str]]:
    """Simple commands of a command line, as word lists."""
    cmd = _HEREDOC.sub("\n", cmd + "\n")
    try:
        lex = shlex.shlex(cmd, posix=True, punctuation_chars=";&|()<>\n")
        lex.whitespace = " \t\r"
        lex.whitespace_split = True
        lex.commenters = "#"
        tokens = list(lex)
    except ValueError:                    # unbalanced quotes: fall back to a plain split
        return [seg.split() for seg in _SPLIT.split(cmd)]
    segs: list[list[str]] = [[]]
    for tok in tokens:
        if tok and set(tok) <= _SEPARATORS:
            segs.append(["|"] if tok == "|" else [])     # "|" marks a pipeline consumer
        elif tok and set(tok) <= _REDIRECT:
            segs[-1].append(">")          # a redirection operator; _strip drops it
        else:
            segs[-1].append(tok)
    return segs


def _strip(words: list[str]) -> list[str]:
    """Drop env assignments, redirections and prefixes (sudo, timeout 60, env X=1, ...)."""
    i = 0
    while i < len(words):
        w = words[i]
        if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w):
            i += 1
        elif w in _PREFIX:
            i += 1
            while i < len(words) and words[i].startswith("-"):
                i += 1
        elif w == "timeout":
            i += 1
            while i < len(words) and (words[i].startswith("-") or re.match(r"^\d+(\.\d+)?[smhd]?$", words[i])):
                i += 1
        else:
            break
    return [w for w in words[i:] if w not in ("<", ">", ">>")]


def _kind_of_simple(words: list[str]) -> str | None:
    consumer = bool(words) and words[0] == "|"
    words = _strip(words[1:] if consumer else words)
    if not words:
        return None
    prog = os.path.basename(words[0])
    if consumer and prog in _FILTERS and not (prog == "xargs" and len(words) > 1
                                              and os.path.basename(words[1]) not in _FILTERS):
        return None
    rest = words[1:]
    if prog in _SETUP:
        return None
    if _PY.match(prog):
        if "-m" in rest:
            mod = rest[rest.index("-m") + 1] if rest.index("-m") + 1 < len(rest) else ""
            if mod in _PY_TEST_MODULES:
                return "test"
            if mod in ("pip", "uv"):
                return "install" if any(a in ("install", "download", "sync") for a in rest) else "other"
            if mod in _PY_INSTALL_MODULES:
                return "install"
            if mod in _PY_BUILD_MODULES:
                return "build"
            return "other"
        script = next((a for a in rest if not a.startswith("-")), None)
        if "-c" in rest or script is None:
            return "other"
        base = os.path.basename(script)
        if base == "setup.py":
            sub = rest[rest.index(script) + 1:] if script in rest else []
            if any(a == "test" or a == "pytest" for a in sub):
                return "test"
            if any(a in ("install", "develop") for a in sub):
                return "install"
            if any(a.startswith(("build", "bdist", "sdist")) for a in sub):
                return "build"
            return "other"
        if base.startswith("test") or base.endswith("_test.py") or "/tests/" in script or base.startswith("runtests"):
            return "test"
        return "other"
    if prog in _TEST_PROGS or prog.startswith("runtests"):
        return "test"
    if prog in ("pip", "pip3", "uv", "poetry", "pdm", "pipenv") or re.match(r"^pip\d", prog):
        return "install" if any(a in ("install", "add", "sync", "download", "venv", "lock") for a in rest) else "other"
    if prog in _INSTALL_PROGS:
        return "install"
    if prog in ("npm", "yarn", "pnpm"):
        if any(a in ("test", "t") for a in rest[:2]):
            return "test"
        if any(a in ("install", "i", "ci", "add") for a in rest[:2]):
            return "install"
        return "build" if "build" in rest[:3] else "other"
    if prog in ("go", "cargo"):
        if rest[:1] == ["test"]:
            return "test"
        return "build" if rest[:1] in (["build"], ["install"]) else "other"
    if prog == "make":
        return "test" if any(a.startswith(("test", "check")) for a in rest) else "build"
    if prog in _BUILD:
        return "build"
    if prog in _VCS:
        return "search" if rest[:1] == ["grep"] else "vcs"
    if prog in _SEARCH or prog == "xargs" and any(os.path.basename(a) in _SEARCH for a in rest):
        return "search"
    if prog in _FILEOPS:
        return "fileops"
    return "other"


def classify_command(cmd: str) -> str:
    """The kind of a shell command line (see the module docstring)."""
    found = {k for k in (_kind_of_simple(seg) for seg in _segments(cmd or "")) if k}
    for kind in PRIORITY:
        if kind in found:
            return kind
    return "other"


def step_kind(step) -> str:
    """A trace step's kind: its command's kind for a shell step, else its tool name."""
    if step.tool == "bash" and step.command:
        return classify_command(step.command)
    return step.tool


_SUBCOMMANDS = {"git", "hg", "svn", "gh", "pip", "uv", "poetry", "pdm", "pipenv", "conda", "mamba", "micromamba",
                "npm", "yarn", "pnpm", "cargo", "go", "apt", "apt-get", "docker", "tox"}
_OPTION_ARGS = {"-C", "-c", "--git-dir", "--work-tree", "-e", "--env", "-n", "-p", "--prefix"}


def _program(words: list[str]) -> str:
    """`pip`, `git`, `python`: a simple command's program, versions folded."""
    prog = os.path.basename(words[0])
    if _PY.match(prog):
        return "python"
    if re.match(r"^pip\d", prog):
        return "pip"
    return "pytest" if prog == "py.test" else prog


def _subcommand(rest: list[str]) -> str | None:
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        i += 2 if rest[i] in _OPTION_ARGS else 1
    return rest[i] if i < len(rest) and re.match(r"^[a-z][a-z0-9_.-]*$", rest[i]) else None


def _class_of_simple(words: list[str]) -> str:
    prog, rest = _program(words), words[1:]
    if prog == "python":
        if "-m" in rest:
            at = rest.index("-m") + 1
            mod = rest[at] if at < len(rest) else ""
            if mod in ("pip", "uv"):
                sub = _subcommand(rest[at + 1:])
                return f"{mod} {sub}" if sub else mod
            return f"python -m {mod}".strip()
        if "-c" in rest:
            return "python -c"
        script = next((a for a in rest if not a.startswith("-")), None)
        if script is None:
            return "python"
        if os.path.basename(script) == "setup.py":
            sub = _subcommand(rest[rest.index(script) + 1:])
            return f"python setup.py {sub}" if sub else "python setup.py"
        return "python test script" if _kind_of_simple(words) == "test" else "python script"
    if prog in _SUBCOMMANDS:
        sub = _subcommand(rest)
        return f"{prog} {sub}" if sub else prog
    return prog


def command_class(step) -> str:
    """What the predictive arm's model keys a step by (module docstring): program and subcommand."""
    if step.tool != "bash" or not step.command:
        return step.tool
    kind = classify_command(step.command)
    first = None
    for seg in _segments(step.command):
        words = _strip(seg[1:] if seg[:1] == ["|"] else seg)
        if not words:
            continue
        first = first or words
        if _kind_of_simple(seg) == kind:
            return _class_of_simple(words)
    return _program(first) if first else "(empty)"


def dominant_kind(commands: Sequence[str], weights: Iterable[float] | None = None) -> str:
    """The kind with the largest total weight over `commands` (ties: earlier in KINDS)."""
    weights = list(weights) if weights is not None else [1.0] * len(commands)
    totals = dict.fromkeys(KINDS, 0.0)
    for cmd, w in zip(commands, weights):
        totals[classify_command(cmd)] += max(1.0, float(w or 0.0))
    if not commands:
        return "other"
    return max(KINDS, key=lambda k: (totals[k], -KINDS.index(k)))
