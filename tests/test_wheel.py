"""A non-editable install works: the wheel built from this tree, installed into a fresh venv (not
seeing this checkout, nor Debian's dist-packages), carries every file the package reads at run time
— the eBPF C sources, the emulator script, hostsetup.sh, the report assets — and from there bcc
compiles and the kernel loads the eBPF programs. The eBPF sources live outside the package, in the
checkout's top-level bpf/: the build maps them to pytest_agentcgroup/bpf/programs/ (setup.py), and
loader.programs_dir() finds them there in the wheel, and in bpf/ in a fresh editable install.

The wheel is built from a copy of the tree (an in-tree build would leave build/ behind and race a
concurrent one); pip's cache is the host's, so only the first run downloads anything.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.network, pytest.mark.slow]   # pip builds the wheel (build isolation), installs its dependencies

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "pytest_agentcgroup"
BPF_SOURCES = ROOT / "bpf"                  # the checkout's eBPF C sources
BPF_PACKAGED = Path("bpf", "programs")      # where the wheel has them, inside the package
SYS_BCC = Path("/usr/lib/python3/dist-packages/bcc")
_SKIP_DIRS = {".venv", ".git", "build", "dist", "results", "report", "__pycache__", ".pytest_cache",
              ".hypothesis", ".benchmarks"}


def _run(argv, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kw)
    assert out.returncode == 0, f"{' '.join(map(str, argv))} exited {out.returncode}:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out


def data_files(package_dir: Path) -> set[str]:
    """Every file of the package that is not Python source (what package data must carry)."""
    return {str(p.relative_to(package_dir)) for p in package_dir.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}


def bpf_sources() -> set[str]:
    """The checkout's eBPF C sources (bpf/), by name."""
    return {p.name for p in BPF_SOURCES.iterdir() if p.is_file()}


def _copy_of_the_tree(tmp: Path) -> Path:
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=lambda d, names: [n for n in names if n in _SKIP_DIRS or n.endswith(".egg-info")])
    return src


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of this tree."""
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
          "-w", tmp / "dist", _copy_of_the_tree(tmp)])
    wheels = list((tmp / "dist").glob("pytest_agentcgroup-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """(venv python, the installed package directory) of the wheel built from a copy of this tree."""
    tmp = tmp_path_factory.mktemp("installed")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv])          # no --system-site-packages
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel])
    where = _run([py, "-I", "-c", f"import {PACKAGE}, os; print(os.path.dirname({PACKAGE}.__file__))"],
                 cwd=tmp).stdout.strip()
    assert Path(where).is_relative_to(venv), f"{PACKAGE} imported from {where}, not from the venv {venv}"
    return py, Path(where)


def test_every_data_file_of_the_package_is_in_the_installed_wheel(installed):
    _, pkg = installed
    programs = {str(BPF_PACKAGED / name) for name in bpf_sources()}
    expected = data_files(ROOT / PACKAGE) | programs
    # the files the code is known to read at run time, so that an empty `expected` cannot pass
    assert {"hostsetup.sh", "reports/assets/report.css", "reports/assets/sortable.js",
            "bpf/programs/common.h", "bpf/programs/memcg_observer.bpf.c",
            "bpf/programs/reclaim_throttle.bpf.c", "bpf/programs/egress_policy.bpf.c",
            "bpf/programs/task_stop.bpf.c", "replay/emulator.c"} <= expected
    missing = expected - data_files(pkg)
    assert not missing, ("not in the wheel (pyproject.toml [tool.setuptools.package-data]; the eBPF "
                         f"sources: setup.py): {sorted(missing)}")
    # the sources as they are in the checkout, and nothing else in their directory
    assert {p for p in data_files(pkg) if Path(p).parent == BPF_PACKAGED} == programs
    for name in bpf_sources():
        assert (pkg / BPF_PACKAGED / name).read_bytes() == (BPF_SOURCES / name).read_bytes(), name


def test_the_wheel_holds_the_package_and_nothing_beside_it(wheel):
    """bpf/ is mapped into the package, not installed as a top-level `bpf` of its own."""
    with zipfile.ZipFile(wheel) as whl:
        tops = {name.split("/")[0] for name in whl.namelist()}
    assert tops == {PACKAGE, f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops


_RESOLVE = """
import importlib.util, json, os
from pathlib import Path
from pytest_agentcgroup.bpf import loader
from pytest_agentcgroup.replay import emulator_build
# reports.html needs the `report` extra (matplotlib) to import: its ASSETS, found as it finds them
ASSETS = Path(importlib.util.find_spec("pytest_agentcgroup.reports.html").origin).with_name("assets")
names = sorted(p.name[:-len(".bpf.c")] for p in loader.BPF_DIR.glob("*.bpf.c"))
print(json.dumps({"bpf_dir": str(loader.BPF_DIR), "programs_dir": str(loader.programs_dir()), "names": names,
                  "paths": [str(loader.source_path(n)) for n in names],
                  "emulator_source": str(emulator_build.SOURCE), "emulator": emulator_build.emulator_binary(),
                  "assets": sorted(os.listdir(ASSETS)),
                  # started as `python -m ...` in a tenant's cgroup (tenants/browser.py)
                  "modules": [importlib.util.find_spec(f"pytest_agentcgroup.{m}").origin
                              for m in ("tenants.browser_driver", "tenants.webapp")]}))
"""


def test_the_installed_package_finds_its_programs_and_the_emulator_in_itself(installed, tmp_path):
    py, pkg = installed
    got = json.loads(_run([py, "-I", "-c", _RESOLVE], cwd=tmp_path).stdout)
    assert Path(got["bpf_dir"]) == Path(got["programs_dir"]) == pkg / BPF_PACKAGED
    assert got["names"] == sorted(p.name[:-len(".bpf.c")] for p in BPF_SOURCES.glob("*.bpf.c"))
    assert len(got["names"]) >= 4, got["names"]
    assert all(Path(p).is_file() and Path(p).is_relative_to(pkg) for p in got["paths"]), got["paths"]
    assert Path(got["emulator_source"]).is_relative_to(pkg) and Path(got["emulator_source"]).is_file()
    assert got["assets"] == ["report.css", "sortable.js"]
    assert all(Path(m).is_relative_to(pkg) for m in got["modules"]), got["modules"]
    # the emulator, compiled from the installed source, runs as the emulate executor starts it (a 1 MB, 10 ms step)
    _run([got["emulator"], str(1 << 20), "0", "0", "0", "10", tmp_path], cwd=tmp_path)


def test_the_installed_command_line_has_every_group(installed, tmp_path):
    """The console script and `python -m pytest_agentcgroup.cli` of the installed wheel: the cli
    package and each group's module are in it, and a command runs from there."""
    py, pkg = installed
    script = py.parent / "agentcgroup"
    groups = ("traces", "report", "compare", "images", "emulator", "bpf", "doctor", "tools")
    for argv in ([script, "--help"], [py, "-I", "-m", f"{PACKAGE}.cli", "--help"]):
        text = _run(argv, cwd=tmp_path).stdout
        assert all(f"    {g} " in text for g in groups), text
    assert "    sweep " in _run([script, "traces", "--help"], cwd=tmp_path).stdout
    assert (pkg / "cli" / "tools.py").is_file()
    checked = _run([script, "traces", "validate", ROOT / "traces" / "recorded-here"], cwd=tmp_path).stdout
    assert checked.count(": ok, 1 trace(s)") == len(list((ROOT / "traces" / "recorded-here").rglob("*.json")))


_LOAD = """
import json
import bcc
from pytest_agentcgroup.bpf.loader import load
# each program compiled by bcc from the installed sources (common.h included), one function of each
# loaded into the kernel (the verifier), nothing attached
loaded = {}
for name, fn, kind in [("memcg_observer", "agcg_obs_rcl_beg", bcc.BPF.TRACEPOINT),
                       ("reclaim_throttle", "agcg_thr_reclaim", bcc.BPF.TRACEPOINT),
                       ("egress_policy", "agcg_egress", bcc.BPF.CGROUP_SKB)]:
    with load(name) as prog:
        loaded[name] = prog.bpf.load_func(fn.encode(), kind).fd >= 0
        loaded[name + ":path"] = str(prog.path)
print(json.dumps(loaded))
"""


@pytest.mark.root
def test_the_installed_package_compiles_and_loads_its_ebpf_programs(installed, tmp_path):
    py, pkg = installed
    if os.geteuid() != 0:
        pytest.skip("loading eBPF programs needs root")
    if not SYS_BCC.is_dir():
        pytest.skip(f"bcc is not installed ({SYS_BCC}; Debian package python3-bpfcc)")
    # bcc alone from Debian, the way hostsetup.sh links it (not all of dist-packages)
    venv = py.parent.parent
    link = venv / "system-bcc"
    link.mkdir(exist_ok=True)
    if not (link / "bcc").exists():
        (link / "bcc").symlink_to(SYS_BCC)
    site = _run([py, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    Path(site, "system-bcc.pth").write_text(f"{link}\n")
    got = json.loads(_run([py, "-I", "-c", textwrap.dedent(_LOAD)], cwd=tmp_path).stdout.strip().splitlines()[-1])
    for name in ("memcg_observer", "reclaim_throttle", "egress_policy"):
        assert got[name] is True, got
        assert Path(got[name + ":path"]).is_relative_to(pkg), got


_RESOLVE_BPF = """
import json
import pytest_agentcgroup
from pytest_agentcgroup.bpf import loader
names = sorted(p.name[:-len(".bpf.c")] for p in loader.BPF_DIR.glob("*.bpf.c"))
print(json.dumps({"package": pytest_agentcgroup.__path__[0], "bpf_dir": str(loader.BPF_DIR),
                  "programs_dir": str(loader.programs_dir()), "names": names,
                  "paths": [str(loader.source_path(n)) for n in names]}))
"""


def test_a_fresh_editable_install_reads_the_checkouts_bpf(tmp_path):
    """`pip install -e` (what `make setup` runs) imports the package from the checkout, where there is
    no pytest_agentcgroup/bpf/programs/: programs_dir() is the checkout's top-level bpf/."""
    src = _copy_of_the_tree(tmp_path)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "-e", src])
    assert not (src / PACKAGE / BPF_PACKAGED).exists()     # the install copied nothing into the package
    got = json.loads(_run([py, "-I", "-c", _RESOLVE_BPF], cwd=tmp_path).stdout)
    assert Path(got["package"]) == src / PACKAGE
    assert Path(got["bpf_dir"]) == Path(got["programs_dir"]) == src / "bpf"
    assert got["names"] == sorted(p.name[:-len(".bpf.c")] for p in BPF_SOURCES.glob("*.bpf.c"))
    assert all(Path(p).is_file() and Path(p).is_relative_to(src / "bpf") for p in got["paths"]), got["paths"]
