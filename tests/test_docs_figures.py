"""No Markdown table in docs/ holds a measured figure typed by hand (docs/index.md, *Numbers in
these pages*): measured tables are the results pages `agentcgroup report --publish` generates
from committed runs (docs/results/pages/, not committed) or the output of the command a page names.

The rule, per table of a page under docs/ (fenced code blocks are not tables; docs/results/pages/
and docs/_build/ are generated and not read):

* a body cell holds a measured figure when, outside its inline code spans and link targets, it has
  a number with a unit of time (ms, s, sec, min, h) or memory (B, KiB, MiB, GiB, KB, MB, GB, and
  their products with seconds such as GiB·s), a percentage, or a count of a run's events (N kills,
  N passed, N failed, N throttles, N breaches, N timeouts, N freezes);
* a body cell that is a bare number (`1,275`, `0.5`, `3`) holds a measured figure when its
  column's header names a unit, such an event or what a run counts (`reserved GiB·s`, `OOM
  kills`, `wall (s)`, `steps`, `tests`, `traces`).

A number in an inline code span (`512`, `--step-timeout 120`) is a literal of a command or a
config file, not a figure. A table whose figures are not this project's measurements opts out with
a marker comment on the line right above it (blank lines between are allowed) naming their kind
and source: `<!-- figures: literature, SOURCE -->` (published figures, cited), `<!-- figures:
config, FILE -->` (settings, defaults, limits) or `<!-- figures: corpus, FILE -->` (what a shipped
corpus holds). A `<!-- figures ...` comment that does not read so is reported itself. A failure
names the page, the line and the offending cell.
"""
from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: generated, not written by hand: the results pages and Sphinx's output
GENERATED = (DOCS / "results" / "pages", DOCS / "_build")
MARKER_KINDS = ("literature", "config", "corpus")

_NUMBER = r"(?<![\w.])\d[\d,]*(?:\.\d+)?"
_TIME = r"(?:ms|s|sec|min|h)"
_MEMORY = r"(?:B|KiB|MiB|GiB|TiB|KB|MB|GB)(?:\s*[·*×-]\s*s)?"
_EVENTS = r"(?:OOM\s+)?(?:kills?|passed|failed|throttles?|breach(?:es)?|timeouts?|freezes?)"
MEASURED_CELL = re.compile(rf"{_NUMBER}\s*(?:(?:{_TIME}|{_MEMORY}|{_EVENTS})\b|%)")
_COUNTED = r"(?:steps?|tests?|traces?)"
MEASURED_HEADER = re.compile(rf"(?:\b(?:{_TIME}|{_MEMORY}|{_EVENTS}|{_COUNTED})\b|%)")
BARE_NUMBER = re.compile(rf"^\s*[~≈<>≤≥]?\s*{_NUMBER}\s*$")
MARKER_LIKE = re.compile(r"^\s*<!--\s*figures?\b", re.IGNORECASE)
MARKER = re.compile(r"^\s*<!--\s*figures:\s*(?P<kind>[\w-]+)\s*,\s*(?P<source>\S.*?)\s*-->\s*$")
SEPARATOR = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md")
                  if not any(g == p or g in p.parents for g in GENERATED))


def _cells(line: str) -> list[str]:
    row = line.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [c.strip() for c in re.split(r"(?<!\\)\|", row)]


def _plain(cell: str) -> str:
    """The cell without what is not a figure: inline code spans and link targets."""
    cell = re.sub(r"(`+).*?\1", " ", cell)
    return re.sub(r"\]\([^)]*\)", "]", cell)


def tables(text: str) -> list[tuple[int, list[str], list[tuple[int, list[str]]], tuple[int, str] | None]]:
    """Each table of a Markdown page outside code fences: its first line's number (1-based),
    its header cells, its body rows (line number, cells) and the figures marker comment above it
    (line number, line), if there is one."""
    lines = text.splitlines()
    out, fence, i = [], None, 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match and match.group(1)[0] == "`" and "`" in match.group(2):
            match = None                # a code span at the line's start, not a fence
        if fence:
            if (match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence)
                    and not match.group(2).strip()):
                fence = None
            i += 1
            continue
        if match:
            fence = match.group(1)
            i += 1
            continue
        if "|" in lines[i] and i + 1 < len(lines) and SEPARATOR.match(lines[i + 1]):
            start, header, body = i, _cells(lines[i]), []
            i += 2
            while i < len(lines) and lines[i].strip() and "|" in lines[i]:
                body.append((i + 1, _cells(lines[i])))
                i += 1
            above = start - 1
            while above >= 0 and not lines[above].strip():
                above -= 1
            marker = ((above + 1, lines[above]) if above >= 0 and MARKER_LIKE.match(lines[above])
                      else None)
            out.append((start + 1, header, body, marker))
            continue
        i += 1
    return out


def measured_cells(text: str) -> list[tuple[int, str, str]]:
    """(line, cell, why) for every hand-typed measured figure in a page's tables; a bad marker
    comment is reported as one too."""
    found = []
    for start, header, body, marker in tables(text):
        if marker is not None:
            match = MARKER.match(marker[1])
            if match and match.group("kind") in MARKER_KINDS:
                continue
            found.append((marker[0], marker[1].strip(),
                          f"not a figures marker: <!-- figures: {'|'.join(MARKER_KINDS)}, SOURCE -->"))
        measured_column = [bool(MEASURED_HEADER.search(_plain(h))) for h in header]
        for line, cells in body:
            for column, cell in enumerate(cells):
                plain = _plain(cell)
                if MEASURED_CELL.search(plain):
                    found.append((line, cell, "a number with a unit or a run's count"))
                elif (column < len(measured_column) and measured_column[column]
                      and BARE_NUMBER.match(plain)):
                    found.append((line, cell, f"a number under the column {header[column]!r}"))
    return found


def test_no_measured_figures_typed_in_docs_tables():
    offending = [f"{page.relative_to(DOCS.parent)}:{line}: {cell!r} ({why})"
                 for page in _pages()
                 for line, cell, why in measured_cells(page.read_text(encoding="utf-8"))]
    assert not offending, (
        "measured figures typed into a docs table (link the run's generated results page, or name "
        "the command that produces them; see docs/index.md):\n" + "\n".join(offending))


def _flagged(page: str) -> list[tuple[int, str]]:
    return [(line, cell) for line, cell, _ in measured_cells(page)]


def test_a_measured_table_is_named_by_line_and_cell():
    page = ("# Exp\n\nSome text.\n\n"
            "| arm | OOM kills | reserved GiB·s | note |\n"
            "|---|---|---|---|\n"
            "| `unlimited` | 0 | 35.7 | ran 3 min 52 s |\n"
            "| `static-toolcall` | 1 | 1,028.4 | 92.8 % as recorded |\n")
    assert _flagged(page) == [(7, "0"), (7, "35.7"), (7, "ran 3 min 52 s"),
                              (8, "1"), (8, "1,028.4"), (8, "92.8 % as recorded")]


def test_cells_with_units_or_run_counts_are_measured_whatever_the_header():
    page = ("| run | what |\n|---|---|\n"
            "| a | 415 s |\n| b | 40 MiB (62 MiB) |\n| c | 0 kills, 79.5 |\n| d | 60 passed |\n"
            "| e | 12 GiB·s |\n| f | 250ms |\n")
    assert [cell for _, cell in _flagged(page)] == [
        "415 s", "40 MiB (62 MiB)", "0 kills, 79.5", "60 passed", "12 GiB·s", "250ms"]


def test_reference_tables_pass():
    page = ("| option | default |\n|---|---|\n"
            "| `--memory-max-mb` | `4096` (MiB) |\n"           # a literal: in a code span
            "| `--step-timeout` | `120 s` |\n"
            "| python | 3.11, sympy 1.12, OpenHands 0.54 |\n"    # versions, no unit
            "| subsets | `smoke`, `dev` ([Traces](traces.md#the-50-ms-rule)) |\n\n"
            "```text\n| arm | kills |\n|---|---|\n| x | 5 kills |\n```\n\n"   # a fence, not a table
            "  ```` ```bash ```` block, then a table:\n\n"                   # a code span, not a fence
            "| family | what |\n|---|---|\n| `x/` | Python 3.9 |\n")
    assert _flagged(page) == []


def test_a_marked_table_names_its_source_or_is_flagged():
    table = "| metric | paper |\n|---|---|\n| tool time | 56-74 % |\n"
    assert _flagged("<!-- figures: literature, AgentCgroup paper, Table 2 -->\n\n" + table) == []
    assert _flagged("<!-- figures: config, experiments/agentcgroup.toml -->\n" + table) == []
    assert _flagged(table) == [(3, "56-74 %")]
    for bad in ("<!-- figures: literature -->", "<!-- figures: measured, results/ -->",
                "<!-- figure: literature, AgentCgroup paper -->"):
        assert _flagged(bad + "\n" + table) == [(1, bad), (4, "56-74 %")]
    assert _flagged("<!-- a comment -->\n" + table) == [(4, "56-74 %")]     # not a marker at all
