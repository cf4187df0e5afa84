"""Sphinx configuration of pytest-agentcgroup's documentation (`make docs`).

Pages are MyST Markdown. The build runs with warnings as errors (`-W --keep-going -n`): a broken
cross-reference, a heading anchor that does not exist or a docstring that does not parse fails it.
"""
from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))           # the checkout's package, also without an editable install

project = "pytest-agentcgroup"
author = "pytest-agentcgroup developers"
copyright = "pytest-agentcgroup developers"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# MyST: `#anchor` links to headings (levels 1-3) are resolved and checked like any cross-reference.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

# autodoc imports the modules it documents: bcc (the eBPF toolchain, a system package made
# importable by `make setup`) is mocked, so the API pages build without root, bcc or a kernel.
autodoc_mock_imports = ["bcc"]
autodoc_member_order = "bysource"
autodoc_typehints = "none"               # signatures as written; the docstrings say the types
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
# Annotations are strings (`from __future__ import annotations`): Sphinx cuts a generic such as
# `dict[str, Path]` at its comma and looks up the pieces as classes. Those are not links of ours.
nitpick_ignore_regex = [("py:class", r".*[\[\]].*")]
# The docstrings use single backticks for code, as the README did: render them as literals.
default_role = "literal"

# External links are not checked here: the build machine has no internet (see the Makefile's docs
# target). Internal references are checked by -n and MyST's own warnings.
linkcheck_ignore = [r"https?://.*"]

html_theme = "alabaster"
html_title = "pytest-agentcgroup"
html_theme_options = {"description": "Trace-driven OS resource-control experiments for AI-agent workloads"}


# The package's docstrings are plain text in the README's style, not reStructuredText: paragraphs
# of prose with `code` in single backticks, `- ` lists, and indented blocks (examples, config,
# tables) with no `::` before them; `*`, `|` and `name_` are plain characters there. The hook below
# renders them as such: prose as text, each indented block as a literal block, lists as lists,
# and the characters docutils would read as markup escaped outside the backticks.
_LIST_ITEM = re.compile(r"^([-*+]|\d+[.)]) +\S")
_CODE_SPAN = re.compile(r"(`+)(?:.|\n)+?\1")
_MARKUP = re.compile(r"([*|\\])|(?<=\w)(_)(?!\w)|^(?=[-:.#=~^+>]{2}|:\w)", re.MULTILINE)


def _escape(text: str) -> str:
    """Plain prose as reStructuredText: markup characters escaped outside code spans."""
    def escape(part: str) -> str:
        return _MARKUP.sub(lambda m: "\\" + (m.group(1) or m.group(2) or ""), part)
    out, end = [], 0
    for span in _CODE_SPAN.finditer(text):
        out += [escape(text[end:span.start()]), span.group(0)]
        end = span.end()
    return "".join(out + [escape(text[end:])])


def _plain_text_as_rst(lines: list[str]) -> list[str]:
    """A docstring's lines (as autodoc gives them, dedented) as reStructuredText lines."""
    out: list[str] = []
    i = 0

    def block(new: list[str]) -> None:
        if out and out[-1]:
            out.append("")
        out.extend(new + [""])

    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif line[0] == " ":                                 # an indented block: shown as written
            start = i
            while i < len(lines) and (not lines[i].strip() or lines[i][0] == " "):
                i += 1
            body = lines[start:i]
            while body and not body[-1].strip():
                body.pop()
            body = textwrap.dedent("\n".join(body)).split("\n")
            block([".. code-block:: text", ""] + ["    " + b if b.strip() else "" for b in body])
        elif _LIST_ITEM.match(line):                          # a list: item lines with their continuations
            items = []
            while i < len(lines) and lines[i].strip() and (_LIST_ITEM.match(lines[i]) or lines[i][0] == " "):
                if _LIST_ITEM.match(lines[i]):
                    marker = _LIST_ITEM.match(lines[i]).group(1)
                    items.append([marker, lines[i][len(marker):].strip()])
                else:
                    items[-1][1] += "\n" + lines[i].strip()
                i += 1
            block("\n".join(f"{m} " + _escape(t).replace("\n", "\n" + " " * (len(m) + 1))
                             for m, t in items).split("\n"))
        else:                                                 # a paragraph, up to a blank, indented or list line
            start = i
            while i < len(lines) and lines[i].strip() and lines[i][0] != " " and (
                    i == start or not _LIST_ITEM.match(lines[i])):
                i += 1
            block(_escape("\n".join(lines[start:i])).split("\n"))
    while out and not out[-1]:
        out.pop()
    return out


def _docstring_as_text(app, what, name, obj, options, lines):
    lines[:] = _plain_text_as_rst(lines) + ([""] if lines else [])


def setup(app):
    app.connect("autodoc-process-docstring", _docstring_as_text)
