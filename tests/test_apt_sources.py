"""The Debian mirror for debootstrap comes from apt's own configuration, in both formats, and a host
without one is told so by name (apt_sources.py)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_agentcgroup.engines.apt_sources import (NoDebianMirror, debian_mirror, parse_deb822,
                                                   parse_one_line, read_sources)

ONE_LINE = """\
# a comment, and a disabled line:
# deb http://old.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/docker.gpg] https://download.docker.com/linux/debian bookworm stable
deb-src http://src.example/debian bookworm main
deb http://security.debian.org/debian-security bookworm-security main contrib
deb http://ftp.fr.debian.org/debian/ bookworm main contrib non-free-firmware   # the mirror
deb http://ftp.fr.debian.org/debian/ bookworm-updates main
"""

DEB822 = """\
Types: deb deb-src
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://mirror.example.org/debian
Suites: bookworm bookworm-updates
Components: main non-free-firmware
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBGPL0BUBEADmW5NdOOHwPIJlgPu6JDcKw/NZJPR8lsD3K87ZM18gzyQZJD+w
 -----END PGP PUBLIC KEY BLOCK-----

Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def write(tmp: Path, files: dict[str, str]) -> tuple[Path, Path]:
    listdir = tmp / "sources.list.d"
    listdir.mkdir(parents=True)
    for name, text in files.items():
        (tmp / name if name == "sources.list" else listdir / name).write_text(text)
    return tmp / "sources.list", listdir


def test_one_line_entries_with_options_and_comments():
    got = parse_one_line(ONE_LINE, "x.list")
    assert [(s.type, s.uri, s.suite, s.components) for s in got] == [
        ("deb", "https://download.docker.com/linux/debian", "bookworm", ("stable",)),
        ("deb-src", "http://src.example/debian", "bookworm", ("main",)),
        ("deb", "http://security.debian.org/debian-security", "bookworm-security", ("main", "contrib")),
        ("deb", "http://ftp.fr.debian.org/debian/", "bookworm", ("main", "contrib", "non-free-firmware")),
        ("deb", "http://ftp.fr.debian.org/debian/", "bookworm-updates", ("main",))]


def test_deb822_paragraphs_with_several_types_suites_a_key_block_and_enabled_no():
    got = parse_deb822(DEB822, "x.sources")
    assert {(s.type, s.uri, s.suite) for s in got} == {
        (t, "http://mirror.example.org/debian", su) for t in ("deb", "deb-src") for su in ("bookworm", "bookworm-updates")
    } | {("deb", "http://deb.debian.org/debian-security", "bookworm-security")}
    assert all(s.components for s in got)


def test_the_main_archive_is_picked_from_a_one_line_sources_list(tmp_path):
    sl, sd = write(tmp_path, {"sources.list": ONE_LINE})
    assert debian_mirror("bookworm", sources_list=sl, sources_dir=sd, lists_dir=tmp_path) == \
        "http://ftp.fr.debian.org/debian"


def test_the_main_archive_is_picked_from_a_deb822_file(tmp_path):
    sl, sd = write(tmp_path, {"debian.sources": DEB822, "docker.list": ONE_LINE.splitlines()[2] + "\n"})
    assert debian_mirror("bookworm", sources_list=sl, sources_dir=sd, lists_dir=tmp_path) == \
        "http://mirror.example.org/debian"
    # files that apt itself ignores (other suffixes) are ignored here too
    (sd / "other.list.disabled").write_text("deb http://ignored.example/debian bookworm main\n")
    assert [Path(f).name for f in read_sources(sl, sd)[1]] == ["debian.sources", "docker.list"]


def test_the_requested_suite_wins_and_a_foreign_origin_is_refused(tmp_path):
    sl, sd = write(tmp_path, {"sources.list": "deb http://a.example/debian trixie main\n"
                                              "deb http://thirdparty.example/repo bookworm main\n"
                                              "deb http://b.example/debian bookworm main\n"})
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "thirdparty.example_repo_dists_bookworm_InRelease").write_text("Origin: Example Corp\nSuite: bookworm\n")
    (lists / "b.example_debian_dists_bookworm_InRelease").write_text("Origin: Debian\nLabel: Debian\n")
    assert debian_mirror("bookworm", sources_list=sl, sources_dir=sd, lists_dir=lists) == "http://b.example/debian"
    # a trixie host: its mirror also carries bookworm
    assert debian_mirror("bullseye", sources_list=sl, sources_dir=sd, lists_dir=lists) in \
        {"http://a.example/debian", "http://b.example/debian"}


def test_no_debian_archive_is_a_clear_error_naming_the_files_read(tmp_path):
    sl, sd = write(tmp_path, {"docker.list": ONE_LINE.splitlines()[2] + "\n", "sec.sources": DEB822.split("\n\n")[2]})
    with pytest.raises(NoDebianMirror, match=r"no Debian archive.*docker\.list.*sec\.sources"):
        debian_mirror("bookworm", sources_list=sl, sources_dir=sd, lists_dir=tmp_path)
    with pytest.raises(NoDebianMirror, match="neither"):
        debian_mirror("bookworm", sources_list=tmp_path / "none", sources_dir=tmp_path / "none.d")


def test_the_hosts_own_apt_configuration_names_a_mirror_apt_really_fetched_from():
    """On this host: the mirror found is one apt fetched a Release file from, and its origin is Debian."""
    if not shutil.which("apt-get"):
        pytest.skip("not a Debian host (no apt-get)")
    mirror = debian_mirror("bookworm")
    assert mirror.startswith(("http://", "https://", "ftp://", "file:/")), mirror
    # apt's own view of its sources (apt-get indextargets lists what `apt-get update` fetched)
    out = subprocess.run(["apt-get", "indextargets", "--format", "$(REPO_URI) $(ORIGIN)"],
                         capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        pytest.skip(f"apt-get indextargets gave nothing (apt-get update not run?): {out.stderr.strip()}")
    origins = {line.split()[0].rstrip("/"): line.split()[1:] for line in out.stdout.splitlines() if line.split()}
    assert mirror in origins, (mirror, origins)
    assert origins[mirror] == ["Debian"], (mirror, origins[mirror])
