"""Sphinx configuration of pytest-agentcgroup's documentation (`make docs`).

Pages are MyST Markdown. The build runs with warnings as errors (`-W --keep-going -n`): a broken
cross-reference, a heading anchor that does not exist or a docstring that does not parse fails it.
"""
from __future__ import annotations

import sys
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


def _docstring_as_written(app, what, name, obj, options, lines):
    """The package's docstrings are plain text in the README's style (indented examples, `*` and
    `|` in prose), not reStructuredText: show each one as written, in a literal block, rather
    than let docutils misread it (and -W fail the build on its warnings)."""
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        return
    lines[:] = ["::", ""] + ["    " + line if line.strip() else "" for line in lines] + [""]


def setup(app):
    app.connect("autodoc-process-docstring", _docstring_as_written)
