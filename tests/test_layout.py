"""The package's layout holds mechanically: the hook module is small, no module holds
several rooms' worth of code, cgroups/ never imports replay/, the static import graph of the
package has no cycle, and a room imports only rooms below it (docs/layout.md).

The graph is read with ast from the sources (every import, function-local ones included), so an
import hidden inside a function counts as much as one at the top. Importing `a.b.c` runs
`a/b/__init__.py` too, so an import of a module is also an edge to each package above it that the
importing module is not itself inside (those have run before it; so has the top-level package).

The checkout's top level is the design's, the eBPF C sources in its own bpf/ (one program per file,
each loaded by its loader by name), which the package finds with loader.programs_dir().
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "pytest_agentcgroup"
REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / PACKAGE
#: the design's top-level entries (docs/layout.md); others (README.md, Makefile, setup.py) may sit beside them
TOP_LEVEL = ("pyproject.toml", PACKAGE, "bpf", "traces", "experiments", "conftest.py", "tests", "docs")
BPF = REPO / "bpf"

HOOK_MODULE_MAX_LINES = 250
MODULE_MAX_LINES = 450

#: Rooms from the bottom up: a module may import its own room and rooms of a lower rank only.
#: traces → replay → cgroups/bpf → metrics → reports, with the low-level modules (errors; proc and
#: programs, the table of programs the project starts; arms, the arms and policy rules as data) at
#: the bottom, the Docker engine below the executors that use it, the per-step limits computed
#: before a step runs (limits/: recommenders over earlier steps, a model of command classes) beside it, the browser tenant and
#: the tasks' workspaces (built outside the sandbox, handed to an executor) above replay,
#: the experiments' studies (settings tables, claims, budgets) and the trace measurements (profile/:
#: profiling, the emulator's fidelity run) above metrics, the experiment config above the studies
#: (it validates their tables), the live runtime (live/: arms for agents people run, recording
#: traces as they go) beside the reports, the pytest side (harness/) and the corpus tools, then
#: what each kind of study does when its test runs (procedures/: it uses the harness), and the
#: entry points (plugin.py, cli/) on top. notes (what an agent is told of a stopped call) sits at
#: the bottom: the live runtime and the replay's kill reasons word a stop with it.
RANKS = {
    "errors": 0,
    "proc": 1, "traces": 1, "programs": 1, "arms": 1, "notes": 1,
    "engines": 2, "limits": 2,
    "replay": 3,
    "tenants": 4, "workspaces": 4,
    "cgroups": 5,
    "bpf": 6,
    "metrics": 7,
    "studies": 8, "profile": 8,
    "config": 9,
    "reports": 10, "live": 10,
    "harness": 11, "tools": 11,
    "procedures": 12,
    "plugin": 13, "cli": 13, "": 13,        # "": the package's own __init__ (its small data API)
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The package module `name` refers to: itself, or for `from pkg import attr` the package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                # `from . import x` imports the module x when there is one
                found |= {_resolve(f"{target}.{a.name}") for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {_resolve(a.name) for a in node.names if a.name.startswith(PACKAGE + ".")}
    mine = module.split(".")
    edges = set()
    for target in found - {None, module}:
        parts = target.split(".")
        # and the packages above it that this module is not inside (those already run before it)
        edges |= {".".join(parts[:i]) for i in range(2, len(parts) + 1) if parts[:i] != mine[:i]}
    return edges - {module}


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_graph_sees_the_package():
    # a broken walk (no modules, no edges) must not make the checks below pass
    assert len(MODULES) > 50 and f"{PACKAGE}.plugin" in MODULES and f"{PACKAGE}.cgroups.tree" in MODULES
    assert f"{PACKAGE}.proc" in GRAPH[f"{PACKAGE}.cgroups.tree"]
    assert f"{PACKAGE}.harness.fixtures" in GRAPH[f"{PACKAGE}.plugin"]


def test_the_hook_module_is_small():
    lines = len((ROOT / "plugin.py").read_text().splitlines())
    assert lines <= HOOK_MODULE_MAX_LINES, f"plugin.py has {lines} lines (at most {HOOK_MODULE_MAX_LINES}: hooks only)"


def test_no_module_is_over_the_size_limit():
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MODULE_MAX_LINES}
    assert not big, f"modules over {MODULE_MAX_LINES} lines (split them by role): {big}"


def test_every_room_has_a_rank():
    assert {_room(m) for m in MODULES} <= set(RANKS), {_room(m) for m in MODULES} - set(RANKS)


@pytest.mark.parametrize("room, below", [
    ("cgroups", "replay"),      # replay is handed a Placement
    ("cgroups", "traces"),      # the placement is handed each step's kind (kind_of)
    ("metrics", "replay"),      # the metric core reads records, never runs a replay...
    ("metrics", "cgroups"),     # ...nor makes cgroups (profile/ and the pytest side do)
])
def test_a_room_imports_nothing_from(room, below):
    bad = {m: sorted(t for t in ts if _room(t) == below) for m, ts in GRAPH.items() if _room(m) == room}
    assert not {m: t for m, t in bad.items() if t}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_lower_rooms_never_import_higher_ones(module):
    mine = RANKS[_room(module)]
    up = sorted(t for t in GRAPH[module] if _room(t) != _room(module) and RANKS[_room(t)] >= mine)
    assert not up, f"{module} (room {_room(module) or PACKAGE}, rank {mine}) imports from rooms at or above it: {up}"


def test_no_import_cycle():
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for t in sorted(GRAPH.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state and (cycle := visit(t)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in sorted(GRAPH):
        if m not in state:
            cycle = visit(m)
            assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_runtime_never_imports_the_corpus_tools():
    # the command line (cli/) starts them; nothing else does
    users = sorted(m for m, ts in GRAPH.items()
                   if _room(m) not in ("tools", "cli") and any(_room(t) == "tools" for t in ts))
    assert not users


def test_argparse_is_imported_by_the_command_line_only():
    """One package parses command lines (cli/); the library takes typed arguments."""
    users = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "argparse" or n.startswith("argparse.") for n in names):
                users.append(module)
    assert users and all(_room(m) == "cli" for m in users), users


def test_the_top_level_is_the_designs():
    missing = [name for name in TOP_LEVEL if not (REPO / name).exists()]
    assert not missing, f"top-level entries of the design missing from {REPO}: {missing}"


def test_the_ebpf_sources_are_the_top_level_bpf_one_program_per_file():
    files = sorted(p.name for p in BPF.iterdir())
    assert "common.h" in files and len([f for f in files if f.endswith(".bpf.c")]) >= 4, files
    stray = [f for f in files if not (f.endswith(".bpf.c") or f.endswith(".h"))]
    assert not stray, f"bpf/ holds the eBPF C sources only (<name>.bpf.c and shared headers): {stray}"
    # one copy: the build maps bpf/ into the package (setup.py), the checkout keeps none there
    assert not (ROOT / "bpf" / "programs").exists(), "the eBPF sources live in the top-level bpf/"


def _named_program(node: ast.AST) -> str | None:
    """The program a node loads by name: Loaded("x"), load("x"), or a ProgramSide's `program = "x"`
    (also in a tuple assignment: `program, ring, ... = "x", ...`)."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("Loaded", "load")
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.args[0].value
    if isinstance(node, ast.ClassDef):
        for stmt in node.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], stmt.value
                pairs = (zip(target.elts, value.elts) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                         else [(target, value)])
                for name, val in pairs:
                    if (isinstance(name, ast.Name) and name.id == "program" and isinstance(val, ast.Constant)
                            and isinstance(val.value, str)):
                        return val.value
    return None


def _loaded_programs() -> dict[str, set[str]]:
    """program name -> the package modules that load it by name (_named_program)."""
    out: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (name := _named_program(node)) is not None:
                out.setdefault(name, set()).add(module)
    return out


def test_every_program_has_its_loader_and_every_loader_its_program():
    loaded = _loaded_programs()
    on_disk = {p.name[:-len(".bpf.c")] for p in BPF.glob("*.bpf.c")}
    assert set(loaded) == on_disk, {"loaded, no source in bpf/": sorted(set(loaded) - on_disk),
                                    "in bpf/, loaded by no module": sorted(on_disk - set(loaded))}
    # one loader per program, named after it: bpf/<name>.bpf.c is loaded by pytest_agentcgroup/bpf/<name>.py
    misnamed = {name: sorted(mods) for name, mods in loaded.items() if mods != {f"{PACKAGE}.bpf.{name}"}}
    assert not misnamed, f"each program's loader is the module named after it, bpf/<name>.py: {misnamed}"


def test_the_package_finds_the_programs_in_the_checkouts_bpf():
    """This session's package is the checkout's (an editable install, or the checkout on sys.path):
    the programs are read from bpf/, the one place programs_dir() names here."""
    import pytest_agentcgroup
    from pytest_agentcgroup.bpf import loader
    if Path(pytest_agentcgroup.__file__).resolve().parent != ROOT:
        pytest.skip(f"{PACKAGE} is imported from {pytest_agentcgroup.__file__}, not from this checkout")
    assert loader.programs_dir() == loader.BPF_DIR == BPF
    for name in _loaded_programs():
        assert loader.source_path(name) == BPF / f"{name}.bpf.c"


def test_only_the_plugin_imports_the_procedures():
    # a study's procedure is reached through its test's fixture (procedures/study.py), never called from below
    users = {m for m, ts in GRAPH.items() if _room(m) != "procedures" and any(_room(t) == "procedures" for t in ts)}
    assert users == {f"{PACKAGE}.plugin"}, sorted(users)


#: experiments whose machinery is not in the library yet (each keeps its own until it moves to procedures/)
MACHINERY_OUTSIDE = ("test_exp4_overhead.py",)
EXPERIMENT_MAX_LINES = 40


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "experiments").glob("test_*.py")
                                        if p.name not in MACHINERY_OUTSIDE))
def test_an_experiment_file_is_a_marker_one_fixture_call_and_its_assertion(name):
    """The machinery of every kind of study is the library's (procedures/, studies/, the harness),
    where the rules above see it: an experiment's file imports nothing of the package, private or not."""
    path = REPO / "experiments" / name
    lines = len(path.read_text().splitlines())
    assert lines <= EXPERIMENT_MAX_LINES, f"{name} has {lines} lines (at most {EXPERIMENT_MAX_LINES}: its study is the library's)"
    imported = [a.name if isinstance(node, ast.Import) else node.module or "."
                for node in ast.walk(ast.parse(path.read_text(), str(path)))
                if isinstance(node, (ast.Import, ast.ImportFrom)) for a in getattr(node, "names", [])]
    assert not [m for m in imported if m.split(".")[0] == PACKAGE or m.startswith(".")], (name, imported)


def test_only_the_entry_points_and_the_pytest_side_import_live():
    # the live runtime (live/) is a top of its own: cli/ and the pytest side use it, nothing else
    users = {m for m, ts in GRAPH.items() if _room(m) != "live" and any(_room(t) == "live" for t in ts)}
    assert {_room(m) for m in users} <= {"cli", "harness", "plugin"}, sorted(users)
