"""Every program the project starts has a row in pytest_agentcgroup/programs.tsv, whose package
hostsetup.sh installs (`depmod` and `udev` were once run and never installed).

The scan is general, not a list of call sites. Python (AST over the package, tests/ and
experiments/): the first element of an argv given to subprocess.*, os.exec*, proc.start/run,
Launch and ExternalLoader, and what shutil.which/programs.which/require look for; names and
attributes are followed to what was assigned to them (a list literal, `require("x")`, a function's
return value, a for loop's tuple). Shell (hostsetup.sh and every *.sh, .ci/run, the Makefile's
recipes, and the shell the code writes: the VM guest script, the parked shell, the step wrapper,
the docker init): the first word of each simple command, variables followed to their value.
"""
from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_agentcgroup import programs

ROOT = Path(__file__).resolve().parents[1]
PY_DIRS = ("pytest_agentcgroup", "tests", "experiments")
HOSTSETUP = ROOT / "pytest_agentcgroup" / "hostsetup.sh"
MINBASE = ROOT / "tests" / "data" / "minbase-bookworm.txt"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_BIN_DIRS = {"/bin", "/sbin", "/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"}


@dataclass(frozen=True)
class Use:
    where: str          # file:line
    program: str

    def __str__(self) -> str:
        return f"{self.where}: {self.program}"


def program_of(word: str) -> str | None:
    """The program a literal argv[0] names: a bare name, or a path in a standard bin directory
    (a path elsewhere is a file the code made, e.g. the compiled emulator, or a deliberate miss)."""
    word = word.strip()
    if "/" in word:
        head, _, tail = word.rpartition("/")
        return tail if head in _BIN_DIRS and _NAME.match(tail) else None
    return word if _NAME.match(word) else None


# ---------------------------------------------------------------------------------------------
# Python

ARGV_SINKS = {"run", "Popen", "check_output", "check_call", "call", "start", "execv", "execvp", "execve",
              "execvpe", "execl", "execlp", "execle", "execlpe", "spawnv", "spawnvp", "spawnl", "spawnlp",
              "Launch", "ExternalLoader"}
LOOKUPS = {"which", "require", "find_binary", "program"}
PASS_THROUGH = {"str", "Path", "fspath", "realpath", "abspath", "list", "tuple"}


class PyScan:
    """The programs one module starts (see the module docstring)."""

    def __init__(self, source: str, filename: str):
        self.filename = filename
        self.tree = ast.parse(source, filename)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        # name -> values, per scope (a function or the module); self.attr -> values, per class
        self.names: dict[ast.AST, dict[str, list[ast.AST]]] = {}
        self.attrs: dict[ast.AST, dict[str, list[ast.AST]]] = {}
        self.funcs: dict[str, list[ast.AST]] = {}
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.funcs.setdefault(node.name, []).append(node)
            for target, value in self._bindings(node):
                if isinstance(target, ast.Name):
                    self.names.setdefault(self._scope(node), {}).setdefault(target.id, []).append(value)
                elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                      and target.value.id == "self"):
                    self.attrs.setdefault(self._class(node), {}).setdefault(target.attr, []).append(value)

    @staticmethod
    def _bindings(node):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                yield t, node.value
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
            yield node.target, node.value
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, (ast.List, ast.Tuple, ast.Set)):
            for elt in node.iter.elts:
                yield node.target, elt

    def _enclosing(self, node, kinds):
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, kinds):
                return node
        return self.tree

    def _scope(self, node):
        return self._enclosing(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))

    def _class(self, node):
        return self._enclosing(node, ast.ClassDef)

    def resolve(self, node, seen=frozenset()) -> set[str]:
        """The program names an expression used as argv[0] (or as a list whose first element is
        argv[0]) can stand for; empty when it cannot be followed (a parameter, sys.executable)."""
        if node in seen:
            return set()
        seen = seen | {node}
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = program_of(node.value.split()[0]) if node.value.split() else None
            return {name} if name else set()
        if isinstance(node, (ast.List, ast.Tuple)):
            out: set[str] = set()
            for elt in node.elts:        # a leading *prefix may be empty: the next element counts too
                if isinstance(elt, ast.Starred):
                    out |= self.resolve(elt.value, seen)
                    continue
                return out | self.resolve(elt, seen)
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):      # [a] + [...]
            return self.resolve(node.left, seen)
        if isinstance(node, ast.BoolOp):
            return set().union(*(self.resolve(v, seen) for v in node.values))
        if isinstance(node, ast.IfExp):
            return self.resolve(node.body, seen) | self.resolve(node.orelse, seen)
        if isinstance(node, ast.Name):
            scope = self._scope(node)
            while True:
                values = self.names.get(scope, {}).get(node.id)
                if values:
                    return set().union(*(self.resolve(v, seen) for v in values))
                if scope is self.tree:
                    return set()
                scope = self._scope(scope)
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                values = self.attrs.get(self._class(node), {}).get(node.attr, [])
                return set().union(set(), *(self.resolve(v, seen) for v in values))
            return set()
        if isinstance(node, ast.Call):
            fname = _func_name(node.func)
            if fname in LOOKUPS and node.args:
                return self.resolve(node.args[0], seen)
            if fname in PASS_THROUGH and node.args:
                return self.resolve(node.args[0], seen)
            if fname in self.funcs:                      # a function of this module: what it returns
                return set().union(set(), *(self.resolve(r.value, seen) for f in self.funcs[fname]
                                            for r in ast.walk(f) if isinstance(r, ast.Return) and r.value))
        return set()

    def uses(self) -> list[Use]:
        found = []
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Call):
                continue
            fname = _func_name(node.func)
            if fname in LOOKUPS:
                args = node.args[:1]
            elif fname in ARGV_SINKS:
                args = node.args[:1] + [k.value for k in node.keywords if k.arg in ("argv", "args")]
                # os.execv(path, argv) / execl(path, arg0, ...): the path is the program
            else:
                continue
            module_call = (isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                           and node.func.value.id in ("subprocess", "os"))
            for arg in args:
                if isinstance(arg, ast.Constant) and not (module_call or fname in LOOKUPS):
                    continue          # a helper's own first argument (a case name), not a command line
                for prog in sorted(self.resolve(arg)):
                    found.append(Use(f"{self.filename}:{node.lineno}", prog))
                    if prog in ("sh", "bash", "dash") and _is_c(arg):
                        found += [Use(f"{self.filename}:{node.lineno}", u.program)
                                  for u in shell_uses(arg.elts[2].value, self.filename)]
        return found


def _is_c(arg) -> bool:
    """argv is [sh, "-c", "literal script", ...]"""
    return (isinstance(arg, (ast.List, ast.Tuple)) and len(arg.elts) > 2
            and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in arg.elts[1:3])
            and arg.elts[1].value == "-c")


def _func_name(func) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def python_uses() -> list[Use]:
    files = [p for d in PY_DIRS for p in sorted((ROOT / d).rglob("*.py"))] + [ROOT / "conftest.py"]
    uses = []
    for path in files:
        if path.name == "test_programs.py":      # this file's own examples of unlisted programs
            continue
        uses += PyScan(path.read_text(), str(path.relative_to(ROOT))).uses()
    return uses


# ---------------------------------------------------------------------------------------------
# Shell

# words after which the next word is a command; words that are no command at all
_PREFIX = {"if", "then", "else", "elif", "do", "while", "until", "!", "{", "(", "time", "exec", "nohup", "!"}
_BUILTINS = {"cd", "echo", "printf", "exit", "return", "local", "read", "set", "shift", "test", "[", "[[", "]]",
             ":", "true", "false", "export", "unset", "trap", "wait", "kill", "declare", "eval", "command",
             "type", "source", ".", "break", "continue", "fi", "done", "esac", "}", ")", "in", "readonly",
             "umask", "ulimit", "getopts", "let", "pwd", "alias", "hash", "mapfile", "shopt", "builtin"}
_SEPARATORS = {";", "&&", "||", "|", "&", "\n", ";;", "(", ")", "$(", "`", "|&"}
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[[^]]*\])?\+?=(.*)$", re.S)
_DEFAULT = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)(:?-(.*))?\}$|^\$([A-Za-z_][A-Za-z0-9_]*)$", re.S)


def shell_uses(text: str, where: str, defined: frozenset[str] = frozenset()) -> list[Use]:
    """The programs a shell script starts: the first word of each simple command (after
    assignments and prefixes such as `if`, `exec`, `!`), command substitutions `$(...)` outside
    single quotes included (also inside double-quoted words); `$VAR` there is followed to the value
    assigned to VAR (`VAR=${VAR:-python3}` too). Functions the script defines, shell builtins and
    keywords are not programs; nor are the functions in `defined` (the enclosing script's).
    The script of `sh -c SCRIPT` is scanned too."""
    text = re.sub(r"\$\(\([^()]*\)\)", "0", _join_continuations(text))      # $((arithmetic))
    defined = defined | set(re.findall(r"^\s*([A-Za-z_][A-Za-z0-9_-]*)\s*\(\)\s*\{", text, re.M))
    found: list[Use] = []
    for start, sub in _substitutions(text):
        line = text.count("\n", 0, start) + 1
        found += [Use(f"{where}:{line}", u.program) for u in shell_uses(sub, where, defined)]
    values: dict[str, str] = {}
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|()`\n")
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    lex.commentchars = "#"
    try:
        tokens = list(iter(lex.get_token, None))
    except ValueError as exc:          # an unbalanced quote: our parser's limit, say so
        raise AssertionError(f"{where}: cannot tokenize: {exc}") from None
    at_command, skip_to_sep, in_case, line = True, False, False, 1
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        here = line
        line += tok.count("\n")
        if tok in _SEPARATORS or tok and not tok.strip(";&|\n()`"):
            at_command, skip_to_sep = True, False
            continue
        if tok == "case":
            in_case = True
        if tok == "esac":
            in_case = False
        if not at_command or skip_to_sep:
            continue
        if in_case and nxt == ")":                # a case pattern
            continue
        if tok in ("for", "case", "select", "function"):
            skip_to_sep = True
            continue
        if tok in _PREFIX:
            continue
        m = _ASSIGN.match(tok)
        if m:                                      # VAR=value [command]: the value may be a program
            val = m.group(3)
            d = _DEFAULT.match(val)
            values[m.group(1)] = (d.group(3) or "") if d and d.group(1) == m.group(1) else val
            continue
        at_command = tok in ("env", "sudo", "nice", "setsid")     # env [VAR=val...] COMMAND
        d = _DEFAULT.match(tok)
        if d:
            var = d.group(1) or d.group(4)
            tok = values.get(var, d.group(3) or "")
        if tok in _BUILTINS or tok in defined or tok.startswith("-"):
            continue
        name = program_of(tok) if tok else None
        if name and not name.isdigit():
            found.append(Use(f"{where}:{here}", name))
            if name in ("sh", "bash", "dash") and nxt == "-c" and i + 2 < len(tokens):
                found += [Use(f"{where}:{here}", u.program) for u in shell_uses(tokens[i + 2], where, defined)]
    return found


def _join_continuations(text: str) -> str:
    """Backslash-newline joined, the newlines it took put back after the line (line numbers kept)."""
    out, carried = [], 0
    for piece in text.split("\n"):
        if piece.endswith("\\"):
            out.append(piece[:-1] + " ")
            carried += 1
            continue
        out.append(piece + "\n" * carried + "\n")
        carried = 0
    return "".join(out)[:-1]


def _substitutions(text: str):
    """(offset, body) of each outermost `$(...)` that is not inside single quotes."""
    single = double = False
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and not single:
            i += 2
            continue
        if c == "'" and not double:
            single = not single
        elif c == '"' and not single:
            double = not double
        elif c == "#" and not single and not double and (i == 0 or text[i - 1] in " \t\n;"):
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        elif text.startswith("$(", i) and not single and not text.startswith("$((", i):
            depth, j = 1, i + 2
            while j < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            yield i, text[i + 2:j - 1]
            i = j
            continue
        i += 1


def makefile_recipes(text: str) -> str:
    """The Makefile's recipe lines as shell text, other lines blank (line numbers kept): make's @
    and - prefixes dropped, $(VAR) replaced by the variable's value, $$ by $."""
    variables = dict(re.findall(r"^([A-Za-z_][A-Za-z0-9_]*)\s*[:?+]?=[ \t]*(.*?)\s*$", text, re.M))
    out = []
    for line in _join_continuations(text).split("\n"):
        if line.startswith("\t"):
            line = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: variables.get(m[1], ""), line)
            out.append(line.lstrip("\t").lstrip("@-").replace("$$", "$"))
        else:
            out.append("")
    return "\n".join(out)


def script_uses() -> list[Use]:
    uses = []
    # the shell scripts of the checkout: its own files, not a virtual environment's or a build's
    # (found by walking, so a checkout without git, an unpacked tarball, is scanned the same)
    skip = {".git", ".venv", "build", "results", "report", ".cache", "node_modules", "_build"}
    scripts = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*.sh") if not skip & set(p.relative_to(ROOT).parts)}
    scripts |= {str(p.relative_to(ROOT)) for p in (ROOT / ".ci").glob("*") if p.is_file()}
    for rel in sorted(scripts | {str(HOSTSETUP.relative_to(ROOT)), ".ci/run"}):
        uses += shell_uses((ROOT / rel).read_text(), rel)
    uses += shell_uses(makefile_recipes((ROOT / "Makefile").read_text()), "Makefile")
    return uses


def generated_shell_uses(tmp: Path) -> list[Use]:
    """The shell the code writes and runs: the VM guest's script (with a delegated user's run and
    the docker preload), the parked shell, the executors' step wrapper and the docker init."""
    from pytest_agentcgroup.proc import Parked
    from pytest_agentcgroup.replay.executors.base import step_script
    from pytest_agentcgroup.replay.executors.docker import INIT
    from tests.kernels import vmharness
    runs = [vmharness.PytestRun("root", ("tests/test_ir.py",)),
            vmharness.PytestRun("user", ("tests/test_ir.py",), user="nobody")]
    texts = {
        "tests/kernels/vmharness.py (guest_script)": vmharness.guest_script(
            tmp, runs, modules=tmp / "modules", docker_image=tmp / "image.tar"),
        "pytest_agentcgroup/proc.py (Parked.SCRIPT)": Parked.SCRIPT,
        "pytest_agentcgroup/replay/executors/base.py (step_script)":
            step_script("bash", "/state/cwd") + "\n" + step_script("python", "/state/cwd"),
        "pytest_agentcgroup/replay/executors/docker.py (INIT)": INIT[2],
    }
    return [u for where, text in texts.items() for u in shell_uses(text, where)]


# ---------------------------------------------------------------------------------------------
# The tests

def _table() -> set[str]:
    return {p.name for p in programs.read_table(arch="*") if p.name != "-"}


def _unlisted(uses: list[Use]) -> list[str]:
    table = _table()
    return sorted({str(u) for u in uses if u.program not in table})


def test_the_code_starts_only_programs_of_the_table():
    uses = python_uses()
    # the scan sees what it must: a sanity floor, so that a scanner broken into finding nothing fails
    assert {"bwrap", "setpriv", "nsenter", "dockerd", "debootstrap", "bpftool", "cc", "tar", "umount",
            "systemctl", "vng"} <= {u.program for u in uses}, sorted({u.program for u in uses})
    assert _unlisted(uses) == [], "programs started but not in pytest_agentcgroup/programs.tsv (add a row)"


def test_the_scripts_start_only_programs_of_the_table(tmp_path):
    uses = script_uses() + generated_shell_uses(tmp_path)
    assert {"dpkg", "apt-get", "depmod", "dpkg-deb", "python3", "mount", "bash", "tar",
            "setpriv", "awk", "sh"} <= {u.program for u in uses}, sorted({u.program for u in uses})
    assert _unlisted(uses) == [], "programs started but not in pytest_agentcgroup/programs.tsv (add a row)"


def test_the_scan_names_file_line_and_program_of_an_unlisted_one():
    src = '''
import shutil, subprocess, os
from pytest_agentcgroup.programs import require
TOOL = ["frobnicate", "--all"]
def f(x):
    subprocess.run(["zorkmid", "-q"])
    subprocess.run(TOOL)
    cmd = require("quux")
    os.execvp(cmd, [cmd])
    if shutil.which("grault"): pass
    subprocess.Popen(["/usr/sbin/garply"])
    subprocess.run([x, "fine"])               # a parameter: not followed
    subprocess.run(["bwrap", "--help"])       # listed
class C:
    def __init__(self):
        self.tool = shutil.which("waldo") or "/usr/bin/waldo"
    def go(self):
        subprocess.run([self.tool])
'''
    got = _unlisted(PyScan(src, "x.py").uses())
    assert got == ["x.py:10: grault", "x.py:11: garply", "x.py:16: waldo", "x.py:18: waldo", "x.py:6: zorkmid",
                   "x.py:7: frobnicate", "x.py:8: quux", "x.py:9: quux"], got
    sh = 'PY=${PY:-plugh}\nif xyzzy --x; then "$PY" -m venv; fi\nfoo() { thud; }\nfoo\nv=$(fred -a | sort)\n' \
         'case $a in\n  amd64) K=1 ;;\nesac\n[ -x /bin/ls ] && exec waldo2 >/dev/null 2>&1\n'
    got = _unlisted(shell_uses(sh, "s.sh"))
    assert got == ["s.sh:2: plugh", "s.sh:2: xyzzy", "s.sh:3: thud", "s.sh:5: fred", "s.sh:9: waldo2"], got


def test_each_row_is_provided_by_its_package():
    """dpkg -S on this host says each installed program of this architecture comes from its row's package, or from a package it depends on (/usr/bin/python3
    is python3-minimal's, which python3 pulls in): the program's path, or a link on its way (cc ->
    /etc/alternatives/cc -> /usr/bin/gcc, of gcc). pip rows are looked up in the venv."""
    if subprocess.run(["dpkg", "--version"], capture_output=True).returncode != 0:
        pytest.skip("not a Debian host")
    system = "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
    wrong, chains = [], {}
    for row in programs.read_table():
        if row.name == "-":
            continue
        if row.pip:
            assert programs.which(row.name), f"{row.name} ({row.package}) is not in the venv"
            continue
        found = programs.which(row.name, path=system)
        if found is None:     # a group this host has not set up: the tests above say what is missing
            continue
        chain, p = [], found
        while True:       # every link on the way, each also without /usr (dpkg may know /bin/x only)
            chain += [p, p.removeprefix("/usr")] if p.startswith("/usr/") else [p, "/usr" + p]
            if not os.path.islink(p) or len(chain) > 20:
                break
            p = os.path.join(os.path.dirname(p), os.readlink(p))
        chains[row] = chain
    assert len(chains) >= 30, f"only {len(chains)} programs of the table are installed here"
    paths = sorted({p for c in chains.values() for p in c})
    out = subprocess.run(["dpkg", "-S", *paths], capture_output=True, text=True).stdout
    owners: dict[str, set[str]] = {}
    for line in out.splitlines():
        if line.startswith("diversion "):
            continue
        pkgs, _, path = line.partition(": ")
        owners.setdefault(path, set()).update(p.split(":")[0].strip() for p in pkgs.split(","))
    for row, chain in chains.items():
        depends = subprocess.run(["dpkg-query", "-W", "-f=${Pre-Depends},${Depends}", row.package], capture_output=True,
                                 text=True).stdout
        provided_by = {row.package} | {d.split()[0].split(":")[0] for d in re.split(r"[,|]", depends) if d.strip()}
        if not any(provided_by & owners.get(p, set()) for p in chain):
            wrong.append(f"{row.name}: {chain[0]} is not of package {row.package} "
                         f"(dpkg -S: {sorted(set().union(*(owners.get(p, set()) for p in chain)))})")
    assert wrong == []


def test_base_rows_are_in_every_debian():
    minbase = {line for line in MINBASE.read_text().split() if not line.startswith("#")}
    not_base = sorted(f"{p.name} ({p.package})" for p in programs.read_table(arch="*")
                      if "base" in p.groups and p.package not in minbase)
    assert not_base == [], f"rows of group base whose package a bare Debian ({MINBASE.name}) lacks"


def test_hostsetup_runs_only_base_programs_before_it_has_installed_its_packages():
    """On a bare Debian (minbase + make) hostsetup.sh has nothing but base until its apt-get
    install: everything before that must be base (python3 and the rest come after)."""
    text = HOSTSETUP.read_text()
    cut = text.index('apt_install "${missing[@]}"')
    before = shell_uses(text[:cut], "hostsetup.sh")
    base = {p.name for p in programs.read_table(arch="*") if "base" in p.groups}
    assert sorted({str(u) for u in before if u.program not in base}) == []
    # and the venv is made after it
    assert text.index('"$PYTHON" -m venv') > cut


def test_hostsetup_installs_the_table_packages_of_its_groups(tmp_path):
    """hostsetup.sh's groups are the table's: its packages per group, read with bash builtins."""
    text = HOSTSETUP.read_text()
    end = text.index("# kernel series each group boots")
    script = tmp_path / "groups.sh"
    script.write_text(text[:end].replace('$(dirname "$0")', str(HOSTSETUP.parent))
                      + '\nfor g in "${!GROUPS_PKGS[@]}"; do echo "$g:${GROUPS_PKGS[$g]}"; done\n')
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True).stdout
    got = {g: sorted(pkgs.split()) for g, _, pkgs in (line.partition(":") for line in out.splitlines())}
    want: dict[str, set[str]] = {}
    for row in programs.read_table():
        for g in row.groups:
            if g != "systemd" and not row.pip:
                want.setdefault(g, set()).add(row.package)
    assert got == {g: sorted(p) for g, p in want.items()}


def test_every_program_of_the_installed_groups_is_there():
    """Every make target sets up core docker browser first: then nothing of theirs is missing (this
    is `agentcgroup doctor`)."""
    lacking = [p.missing_message() for p in programs.missing(["core", "docker", "browser"])]
    assert lacking == []


@pytest.mark.vm
def test_every_program_of_the_vm_group_is_there():
    """`make test` sets up the vm group too (make setup-vm), which the VM tests need."""
    lacking = [p.missing_message() for p in programs.missing(["vm"])]
    assert lacking == []


def test_a_missing_program_is_one_line_naming_its_package(monkeypatch, capsys):
    monkeypatch.setattr(programs, "which", lambda name, path=None: None)
    from pytest_agentcgroup.cli import main
    assert main(["doctor", "core"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert "missing: bwrap (Debian package bubblewrap; `make setup` installs it) is not installed" in lines
    assert "missing: setpriv (Debian package util-linux, part of every Debian) is not installed" in lines
    assert not any("chromium" in line for line in lines)          # not of group core
    with pytest.raises(programs.ExecutorUnavailable, match=r"^the sandbox executor needs bwrap \(Debian package "
                       r"bubblewrap; `make setup` installs it\), which is not installed$"):
        programs.require("bwrap", needed_by="the sandbox executor")
    with pytest.raises(KeyError, match="not in programs.tsv"):
        programs.program("frobnicate")
