"""The runs the documentation publishes. A TOML file (docs/results/published.toml) lists them;
`agentcgroup report --publish FILE` writes each one's results page (markdown.py) into
<FILE's directory>/pages/<name>/results.md (or under -o), replacing the pages an earlier call wrote
there. `make docs` does so before Sphinx reads docs/.

    [[run]]
    name = "exp1-smoke"                              # the page's directory under pages/
    run = "runs/0001_20261126T140647"                # the run directory, relative to FILE
    title = "Experiment 1 on the smoke subset"       # the page's title
    config = "../../experiments/agentcgroup.toml"    # optional: each arm's limits on the memory figures
    traces = ["claude-code/local/pydicom__pydicom-2065"]   # optional: the memory figures' traces

A published run must be finished (complete.json) and say how it was made (run.json): its page
names the run, its dates, command, commit and machine (provenance.PUBLISHED_FILES).
"""
from __future__ import annotations

import os
import re
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .frames import ResultsError
from .markdown import PAGE, build_page
from .provenance import PUBLISHED_FILES, read_run

PAGES = "pages"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_KEYS = {"name": str, "run": str, "title": str, "config": str, "traces": list}
_REQUIRED = ("name", "run", "title")


@dataclass(frozen=True)
class Published:
    name: str
    run: Path                  # as the page names it: FILE's directory / run
    title: str
    config: Path | None = None
    traces: tuple[str, ...] = ()


def read_published(path: str | Path) -> list[Published]:
    """The runs FILE lists, checked: ResultsError naming the file, the entry and the key."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(doc) - {"run"})
    if unknown:
        raise ResultsError(f"{path}: unknown key(s) {', '.join(unknown)} (expected [[run]] tables)")
    entries = doc.get("run", [])
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise ResultsError(f"{path}: expected one [[run]] table or more, each a published run")
    out, seen = [], set()
    for i, e in enumerate(entries, 1):
        where = f"{path}: run {i}"
        missing = [k for k in _REQUIRED if k not in e]
        if missing:
            raise ResultsError(f"{where}: missing key(s) {', '.join(missing)}")
        for k, v in e.items():
            if k not in _KEYS:
                raise ResultsError(f"{where}: unknown key {k} (keys: {', '.join(_KEYS)})")
            if not isinstance(v, _KEYS[k]) or (k == "traces" and not all(isinstance(t, str) for t in v)):
                raise ResultsError(f"{where}: {k}: expected {'a list of trace ids' if k == 'traces' else 'a string'}, "
                                   f"got {v!r}")
        if not _NAME.match(e["name"]):
            raise ResultsError(f"{where}: name {e['name']!r}: lower-case letters, digits and '-' only (a directory name)")
        if e["name"] in seen:
            raise ResultsError(f"{where}: name {e['name']!r} is used twice")
        seen.add(e["name"])
        near = lambda rel: Path(os.path.normpath(path.parent / rel))    # noqa: E731  (relative to FILE)
        out.append(Published(e["name"], near(e["run"]), e["title"], near(e["config"]) if "config" in e else None,
                             tuple(e.get("traces", ()))))
    return out


def publish(path: str | Path, out: str | Path | None = None) -> list[Path]:
    """Every run FILE lists as OUT/<name>/results.md (OUT: FILE's directory / pages); returns the
    pages' paths. Every run is checked before anything is written; then OUT's earlier pages (its
    directories holding a results.md) are removed, so a run taken off the list leaves no page."""
    runs = read_published(path)
    for r in runs:
        read_run(r.run, require=PUBLISHED_FILES)
        if r.config is not None and not r.config.is_file():
            raise ResultsError(f"{path}: run {r.name}: config {r.config}: no such file")
    out = Path(out) if out is not None else Path(path).parent / PAGES
    if out.is_dir():
        for old in out.iterdir():
            if old.is_dir() and (old / PAGE).is_file():
                shutil.rmtree(old)
    return [build_page([r.run], out / r.name, config=r.config, traces=list(r.traces) or None, title=r.title,
                       require=PUBLISHED_FILES, shown_as=[str(r.run)]) for r in runs]
