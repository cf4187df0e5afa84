"""The API pages render the package's plain-text docstrings as text (docs/conf.py's
autodoc-process-docstring hook): prose stays prose with its markup characters escaped outside
code spans, an indented block becomes a literal block, a `- ` list with continuation lines a list.
The Sphinx build (`make docs`, warnings as errors) checks that the result parses for every
documented module; this checks what it is made into.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

CONF = Path(__file__).resolve().parents[1] / "docs" / "conf.py"


def _conf():
    spec = importlib.util.spec_from_file_location("docs_conf", CONF)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_plain_text_docstring_becomes_text_literal_blocks_and_lists():
    docstring = [
        "Budgets: what an experiment expects, as data:",
        "",
        "    [experiments.exp1.budgets.static-toolcall]",
        "    oom_kills = \"predicted\"      # or a number",
        "",
        "    mem_high_events = 2",
        "A verdict is `holds` or `*.p99_ms` refuted; *every* arm | agcg_ programs,",
        "- a list item",
        "  continued",
        "- another",
        "--agentcgroup-out DIR is an option, not an option list",
    ]
    assert _conf()._plain_text_as_rst(docstring) == [
        "Budgets: what an experiment expects, as data:",
        "",
        ".. code-block:: text",
        "",
        "    [experiments.exp1.budgets.static-toolcall]",
        "    oom_kills = \"predicted\"      # or a number",
        "",
        "    mem_high_events = 2",
        "",
        "A verdict is `holds` or `*.p99_ms` refuted; \\*every\\* arm \\| agcg\\_ programs,",
        "",
        "- a list item",
        "  continued",
        "- another",
        "",
        "\\--agentcgroup-out DIR is an option, not an option list",
    ]
