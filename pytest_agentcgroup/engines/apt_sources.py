"""The Debian mirror this host's apt uses, for debootstrap to build the local image from.

apt's sources come in two formats, both read here:

* one-line `.list` files (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list):
  `deb [opt=val ...] URI SUITE COMPONENT...`
* deb822 `.sources` files (/etc/apt/sources.list.d/*.sources): paragraphs with `Types:`, `URIs:`,
  `Suites:`, `Components:` and optionally `Enabled: no`.

The main Debian archive is the `deb` entry carrying component `main` for a plain suite (`bookworm`,
not `bookworm-updates` or `bookworm-security`). When apt has fetched the suite's Release file, its
`Origin:` must say Debian (a third-party repository can also publish a `bookworm main`). A host on
another release still names a mirror that carries every Debian suite, so the requested suite is
preferred but not required.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_DIR = Path("/etc/apt/sources.list.d")
LISTS_DIR = Path("/var/lib/apt/lists")
# what debootstrap can fetch from (not cdrom:, not apt's mirror+ / tor+ transports)
_FETCHABLE = ("http://", "https://", "ftp://", "file:/")


class NoDebianMirror(LookupError):
    """No apt source names a Debian archive; the message says which files were read."""


@dataclass(frozen=True)
class Source:
    type: str                    # deb | deb-src
    uri: str
    suite: str
    components: tuple[str, ...]
    file: str                    # where it was configured


def parse_one_line(text: str, file: str = "<text>") -> list[Source]:
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        line = re.sub(r"\[[^\]]*\]", " ", line, count=1)      # [arch=amd64 signed-by=...] options
        words = line.split()
        if len(words) >= 3 and words[0] in ("deb", "deb-src"):
            out.append(Source(words[0], words[1], words[2], tuple(words[3:]), file))
    return out


def parse_deb822(text: str, file: str = "<text>") -> list[Source]:
    out = []
    for para in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for line in para.splitlines():
            if line.startswith("#"):
                continue
            if line[:1] in (" ", "\t") and key:            # continuation (a multi-line Signed-By key)
                fields[key] += " " + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        for typ in fields.get("types", "").split():
            for uri in fields.get("uris", "").split():
                for suite in fields.get("suites", "").split():
                    out.append(Source(typ, uri, suite, tuple(fields.get("components", "").split()), file))
    return out


def read_sources(sources_list: Path = SOURCES_LIST, sources_dir: Path = SOURCES_DIR) -> tuple[list[Source], list[str]]:
    """Every source apt is configured with, and the files read (in apt's order)."""
    files = [sources_list] if sources_list.is_file() else []
    if sources_dir.is_dir():
        files += sorted(p for p in sources_dir.iterdir() if p.suffix in (".list", ".sources") and p.is_file())
    sources: list[Source] = []
    for path in files:
        parse = parse_deb822 if path.suffix == ".sources" else parse_one_line
        sources += parse(path.read_text(errors="replace"), str(path))
    return sources, [str(p) for p in files]


def release_origin(uri: str, suite: str, lists_dir: Path = LISTS_DIR) -> str | None:
    """`Origin:` of the suite's Release file apt fetched from uri, or None when apt has none."""
    stem = re.sub(r"^[a-z0-9+]+:/+", "", uri).rstrip("/").replace("/", "_")
    for name in (f"{stem}_dists_{suite}_InRelease", f"{stem}_dists_{suite}_Release"):
        try:
            text = (lists_dir / name).read_text(errors="replace")
        except OSError:
            continue
        m = re.search(r"^Origin:\s*(.+)$", text, re.M)
        return m.group(1).strip() if m else None
    return None


def debian_mirror(suite: str = "bookworm", *, sources_list: Path = SOURCES_LIST,
                  sources_dir: Path = SOURCES_DIR, lists_dir: Path = LISTS_DIR) -> str:
    """The URI of the main Debian archive apt is configured with (for `suite` if one is), or
    NoDebianMirror naming the files read."""
    sources, files = read_sources(sources_list, sources_dir)
    candidates = []
    for s in sources:
        if s.type != "deb" or "main" not in s.components or "-" in s.suite or not s.uri.startswith(_FETCHABLE):
            continue
        origin = release_origin(s.uri, s.suite, lists_dir)
        if origin is not None and origin != "Debian":
            continue                                  # a third-party repository's own `<suite> main`
        # rank: the requested suite, then apt's own word that it is Debian, then apt's order
        candidates.append((s.suite != suite, origin is None, len(candidates), s.uri.rstrip("/")))
    if not candidates:
        read = ", ".join(files) or f"neither {sources_list} nor {sources_dir}/*.list|*.sources exist"
        raise NoDebianMirror(f"no Debian archive in apt's sources (a `deb` entry with component main for "
                             f"a suite such as {suite}; read: {read}); configure one, or pass the mirror "
                             "explicitly")
    return min(candidates)[3]
