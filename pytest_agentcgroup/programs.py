"""The programs the project starts, and the Debian packages that provide them (programs.tsv).

One table, read here and by hostsetup.sh (which installs the packages of the groups it is given):
a program the code starts that has no row fails tests/test_programs.py, so it cannot be started
without its package being installed. A missing program is one message naming it and its package:

    bwrap = require("bwrap")            # its path, or ExecutorUnavailable saying what to install
    tool = which("bpftool")             # its path, or None (for code that can do without it)
    missing(["core", "docker"])         # every program of those groups that is not installed

    agentcgroup doctor [GROUP...]       # check() on the command line (cli/machine.py)

The table is a TSV file, not Python, because hostsetup.sh reads it on a bare Debian before there
is any python3 (it installs python3 itself). Imports nothing from the package but errors.py.
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .errors import ExecutorUnavailable

TABLE = Path(__file__).with_name("programs.tsv")
#: groups `make setup` installs (hostsetup.sh's default)
DEFAULT_GROUPS = ("core", "docker", "browser")
#: groups every hostsetup.sh run has: in every Debian (base) or installed first (setup)
ALWAYS = ("base", "setup")
#: where a program of a Debian package may live besides PATH (a user's PATH often lacks sbin)
SBIN = "/usr/local/sbin:/usr/sbin:/sbin"
#: the make target that installs each group
MAKE_TARGET = {"base": None, "setup": "make setup", "core": "make setup", "docker": "make setup",
               "browser": "make setup", "vm": "make setup-vm", "vm-kernels": "make setup-kernels", "systemd": None}


@dataclass(frozen=True)
class Program:
    name: str                 # "-" for a package that provides no program we start
    package: str              # Debian package, "pip:NAME" for one pip installs into the venv
    groups: tuple[str, ...]
    arch: str                 # Debian architecture, "*" for all
    used_by: str

    @property
    def pip(self) -> bool:
        return self.package.startswith("pip:")

    def how_to_install(self) -> str:
        """The clause after the package: what installs it."""
        if self.pip:
            return f"Python package {self.package[4:]}; `make setup` installs it into .venv"
        if "base" in self.groups:
            return f"Debian package {self.package}, part of every Debian"
        if "systemd" in self.groups:
            return f"Debian package {self.package}, there when systemd is the init"
        target = next(MAKE_TARGET[g] for g in self.groups if MAKE_TARGET.get(g))
        return f"Debian package {self.package}; `{target}` installs it"

    def missing_message(self) -> str:
        return f"{self.name} ({self.how_to_install()}) is not installed"


def debian_arch() -> str:
    """Debian's name for this machine's architecture, as `dpkg --print-architecture` says."""
    import platform
    return {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el", "riscv64": "riscv64"}.get(
        platform.machine(), platform.machine())


def read_table(path: Path = TABLE, arch: str | None = None) -> list[Program]:
    """The table's rows, for `arch` (default: this machine's; "*" for every row), "{arch}" in
    package names replaced."""
    arch = debian_arch() if arch is None else arch
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split("\t")
        if len(fields) != 5:
            raise ValueError(f"{path}:{n}: {len(fields)} tab-separated fields, not 5: {line!r}")
        name, package, groups, row_arch, used_by = fields
        if arch != "*" and row_arch not in ("*", arch):
            continue
        rows.append(Program(name, package.replace("{arch}", arch), tuple(groups.split(",")), row_arch, used_by))
    return rows


@lru_cache(maxsize=1)
def _by_name() -> dict[str, Program]:
    return {p.name: p for p in read_table(arch="*") if p.name != "-"} | \
           {p.name: p for p in read_table() if p.name != "-"}      # this architecture's row wins


def program(name: str) -> Program:
    """The table's row for a program; KeyError (naming the table) when it has none: add one."""
    try:
        return _by_name()[name]
    except KeyError:
        raise KeyError(f"{name!r} is not in {TABLE.name}: add its row (program, Debian package, group)") from None


def which(name: str, path: str | None = None) -> str | None:
    """shutil.which for a program of the table (KeyError if it has no row), also looking in the
    sbin directories; a pip-installed one beside this interpreter first (the venv's bin). With
    `path`, only there."""
    row = program(name)
    if path is not None:
        return shutil.which(name, path=path)
    venv = shutil.which(name, path=str(Path(sys.executable).parent)) if row.pip else None   # this venv's first
    return venv or shutil.which(name) or shutil.which(name, path=SBIN)


def require(name: str, *, error: type[Exception] = ExecutorUnavailable, needed_by: str = "") -> str:
    """The path of a program of the table, or `error` (ExecutorUnavailable by default) naming it
    and its package, e.g. "the sandbox executor needs bwrap (Debian package bubblewrap; `make
    setup` installs it), which is not installed"."""
    found = which(name)
    if found is None:
        row = program(name)
        raise error(f"{needed_by} needs {name} ({row.how_to_install()}), which is not installed" if needed_by
                    else row.missing_message())
    return found


def missing(groups=DEFAULT_GROUPS, *, systemd: bool | None = None) -> list[Program]:
    """The programs of `groups` (plus base and setup; systemd's when systemd is the init) that are
    not installed here, for this architecture."""
    systemd = os.path.isdir("/run/systemd/system") if systemd is None else systemd
    wanted = set(groups) | set(ALWAYS) | ({"systemd"} if systemd else set())
    unknown = set(groups) - {g for p in read_table(arch="*") for g in p.groups}
    if unknown:
        raise ValueError(f"unknown group(s) {', '.join(sorted(unknown))} (known: {', '.join(known_groups())})")
    return [p for p in read_table() if p.name != "-" and wanted & set(p.groups) and which(p.name) is None]


def known_groups() -> list[str]:
    seen: dict[str, None] = {}
    for p in read_table(arch="*"):
        seen.update(dict.fromkeys(p.groups))
    return list(seen)


def check(groups=DEFAULT_GROUPS, out=None) -> int:
    """Print one line per missing program (its name and package) to `out` (stdout); 0 when none
    is missing, else 1."""
    lacking = missing(groups)
    for p in lacking:
        print(f"missing: {p.missing_message()}", file=out or sys.stdout)
    return 1 if lacking else 0
