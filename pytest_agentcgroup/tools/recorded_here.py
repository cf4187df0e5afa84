"""The `recorded-here` corpus: command sequences of the kind agents run (installs from a local wheel
directory, test runs, `grep -r`, builds, an edit that breaks tests and its revert, a command that
outgrows its timeout), against real code available offline here, and the workspace they run in.

    agentcgroup tools recorded-here workspace DIR   # build the workspace (PyPI, pinned)
    agentcgroup tools recorded-here traces DIR      # write the command traces

The workspace is the sdist of more-itertools (a small pure-Python package whose sdist carries its
own tests) unpacked, plus a `wheels/` directory of pytest and its dependencies and flit_core (the
package's build backend), for `pip install --no-index --find-links`. Every file comes from PyPI and
is checked against the sha256 pinned below: the wheels by `pip download --only-binary=:all:
--require-hashes`, the sdist by its own URL from PyPI's simple index, downloaded as a file (pip
would build an sdist's metadata, fetching an unpinned build backend into an isolated environment)
by workspaces/pypi.py, which builds the tasks' workspaces of replayed trajectories the same way.
About 600 KB, so the repository keeps the hashes, not the files; once built, the workspace needs no
network again. `make recorded-here` builds the workspace into
.cache/recorded-here/workspace and profiles the traces into traces/ (`agentcgroup traces profile`).

The command traces carry no profile and no durations (nothing was measured before profiling):
every number of the profiled traces shipped in traces/recorded-here/ is `recorded`.
"""
from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..traces.ir import Step, Trace, write_trace
from ..workspaces import pypi
from ..workspaces.lock import RegistryUnreachable, WorkspaceError

FAMILY = "recorded-here"
SDIST = ("more-itertools==10.5.0", "5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6")
SDIST_FILE = "more-itertools-10.5.0.tar.gz"
SIMPLE_INDEX = pypi.SIMPLE_INDEX
PACKAGE_DIR = "more-itertools-10.5.0"
WHEELS = (("pytest==8.3.3", "a6853c7375b2663155079443d2e45de913a911a11d669df02a50814944db57b2"),
          ("pluggy==1.5.0", "44e1ad92c8ca002de6377e165f3e0f1be63266ab4d554740532335b9d75ea669"),
          ("iniconfig==2.0.0", "b6a85871a79d2e3b22d2d1b94ac2824226a63c6b741c88f7ae975f18b6778374"),
          ("packaging==24.1", "5b8f2217dbdbd2f7f384c41c628544e6d52f2d0f53c6d0c3ea61aa5d1d7ff124"),
          ("flit_core==3.9.0", "7aada352fb0c7f5538c4fafeddf314d3a6a92ee8e2b1de70482329e42de70301"))
SOURCE = {"format": "agentcgroup-recorded-here", "origin": "pytest_agentcgroup/tools/recorded_here.py",
          "licence": "MIT", "workspace": {"sdist": SDIST[0], "wheels": [w for w, _ in WHEELS], "pinned": "sha256"}}
HOME = "/workspace"
PKG = f"{HOME}/{PACKAGE_DIR}"
VENV = f"{HOME}/.venv"
INSTALL = f"{VENV}/bin/pip install --no-index --find-links {HOME}/wheels"
MAKE_VENV = [f"python3 -m venv {VENV}", f"{INSTALL} pytest"]

#: name -> (what it is, commands in order; a (command, timeout_ms) pair for a step with its own timeout)
TRACES: dict[str, tuple[str, list]] = {
    "install-and-test": ("set up a virtual environment from a local wheel directory, install the package "
                         "editable (its flit_core backend from the same directory), run its tests", [
        "ls -la", f"cd {PKG} && ls", *MAKE_VENV, f"{INSTALL} -e .", f"{VENV}/bin/pip list",
        f"{VENV}/bin/python -m pytest -q tests/test_recipes.py", f"{VENV}/bin/python -m pytest -q",
        f'{VENV}/bin/python -m pytest -q -x tests/test_more.py -k "chunked or windowed"',
        f"{VENV}/bin/python -c 'import more_itertools; print(more_itertools.__version__)'"]),
    "search-and-read": ("find one's way around the code: grep -r, find, wc, reading files", [
        f"cd {PKG} && ls", 'grep -rn "def windowed" .', "grep -rn import more_itertools | wc -l",
        "find . -name '*.py' | xargs wc -l | sort -n | tail -5", "sed -n 1,80p more_itertools/recipes.py",
        'grep -rc "def test_" tests/', "cat pyproject.toml", "head -60 README.rst",
        "python3 -c \"import ast; t = ast.parse(open('more_itertools/more.py').read()); "
        "print(sum(isinstance(n, ast.FunctionDef) for n in ast.walk(t)))\""]),
    "edit-break-revert": ("an edit that breaks tests, the failing run, a diff, the revert, the passing run", [
        f"cd {PKG}", *MAKE_VENV, f'{VENV}/bin/python -m pytest -q tests/test_more.py -k "chunked"',
        "cp more_itertools/more.py more_itertools/more.py.orig",
        "sed -i 's/def chunked(iterable, n, strict=False):/def chunked(iterable, n, strict=True):/' "
        "more_itertools/more.py",
        f'{VENV}/bin/python -m pytest -q tests/test_more.py -k "chunked"',
        "diff -u more_itertools/more.py.orig more_itertools/more.py",
        "mv more_itertools/more.py.orig more_itertools/more.py",
        f'{VENV}/bin/python -m pytest -q tests/test_more.py -k "chunked"']),
    "build-and-compile": ("build a wheel with the package's own backend, compile, archive", [
        f"cd {PKG}", *MAKE_VENV, f"{VENV}/bin/pip wheel --no-index --find-links {HOME}/wheels --no-deps -w dist .",
        "ls -la dist", "python3 -m zipfile -l dist/*.whl", "python3 -m compileall -q more_itertools tests",
        f"python3 -m tarfile -c {HOME}/src.tar more_itertools tests", f"python3 -m tarfile -l {HOME}/src.tar | wc -l",
        f"{INSTALL} dist/*.whl", f"{VENV}/bin/python -c 'import more_itertools as m; print(m.__file__)'"]),
    "large-inputs": ("checks on large inputs: memory grows over seconds, one run outgrows its timeout", [
        f"cd {PKG}",
        "python3 -c 'import more_itertools as m; x = list(m.chunked(range(3_000_000), 7)); print(len(x))'",
        "python3 -c 'import more_itertools as m; x = sorted(m.distinct_permutations(\"aabbccdde\")); print(len(x))'",
        "python3 -c 'import more_itertools as m; w = list(m.windowed(range(400_000), 8)); print(len(w))'",
        ("python3 -c 'import itertools; print(sum(1 for _ in itertools.permutations(range(12))))'", 5000),
        "python3 -c 'import more_itertools as m; print(m.ilen(m.powerset(range(18))))'"]),
}


def traces() -> list[Trace]:
    out = []
    for name, (what, commands) in TRACES.items():
        steps = []
        for i, item in enumerate(commands):
            cmd, timeout_ms = item if isinstance(item, tuple) else (item, 120_000)
            # the first step names the working directory; the others start where the previous one
            # ended, as in an agent's persistent shell (a recorded cwd would reset it every step)
            args = {"command": cmd, **({"cwd": HOME} if i == 0 else {}), "timeout_ms": timeout_ms}
            steps.append(Step(i, "bash", args, native_tool="Bash"))
        out.append(Trace(f"{FAMILY}/{name}", {**SOURCE, "what": what}, tuple(steps)))
    return out


def write_traces(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for trace in traces():
        path = out / (trace.trace_id.split("/")[-1] + ".json")
        write_trace(trace, path)
        written.append(path)
    return written


def build_workspace(dest: Path) -> Path:
    """DEST/<package dir> (the sdist, unpacked) and DEST/wheels, every file hash-checked; a complete
    workspace (its marker file names these pins) is left as it is."""
    marker = dest / ".recorded-here"
    pins = "\n".join([SDIST[0], *(w for w, _ in WHEELS)]) + "\n"
    if marker.is_file() and marker.read_text() == pins:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        req = tmp / "wheels.txt"
        req.write_text("".join(f"{p} --hash=sha256:{h}\n" for p, h in WHEELS))
        _pip(["download", "--no-deps", "--require-hashes", "--only-binary=:all:", "-r", str(req), "-d", str(tmp / "wheels")])
        sdist = tmp / SDIST_FILE
        sdist.write_bytes(download_sdist(SDIST[0].split("==")[0], SDIST_FILE, SDIST[1]))
        with tarfile.open(sdist) as tar:
            tar.extractall(dest, filter="data")
        wheels = dest / "wheels"
        wheels.mkdir(exist_ok=True)
        for whl in (tmp / "wheels").glob("*.whl"):
            (wheels / whl.name).write_bytes(whl.read_bytes())
    marker.write_text(pins)
    return dest


def download_sdist(project: str, filename: str, sha256: str, index: str = SIMPLE_INDEX) -> bytes:
    """workspaces/pypi.py's download_sdist (the pinned file or one message), as this tool's exit
    (caused by the RegistryUnreachable, when the index could not be reached)."""
    try:
        return pypi.download_sdist(project, filename, sha256, index=index)
    except WorkspaceError as exc:
        raise SystemExit(f"recorded_here: {exc}") from (exc if isinstance(exc, RegistryUnreachable) else None)


def _pip(args: list[str]) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        why = f"recorded_here: pip {args[0]} failed (needs PyPI or a configured index):\n{done.stderr.strip()}"
        cause = RegistryUnreachable(why, "the package index") if pypi.PIP_UNREACHABLE.search(done.stderr) else None
        raise SystemExit(why) from cause
