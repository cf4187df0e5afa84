"""Reports: terminal tables (table.py, loaded with the plugin), run-vs-run comparison (comparison.py:
the comparison core on two runs, no extra needed), and — with the `report` extra (pandas,
matplotlib) — DataFrames of results directories (frames.py), figures (figures.py) and what a
report writes beside its page (outputs.py), the static HTML report (html.py), the Markdown results
page of a run with its provenance (markdown.py, provenance.py) and the pages of the runs the
documentation publishes (publish.py).

    from pytest_agentcgroup.reports import load, build_report, build_page, publish, compare

May import: config, metrics/, traces/. Nothing below imports reports/ but the pytest side (table.py)
and the command line.
"""
from __future__ import annotations

_LAZY = {"load": "frames", "Results": "frames", "ResultsError": "frames", "build_report": "html",
         "build_page": "markdown", "publish": "publish", "compare": "comparison"}


def __getattr__(name: str):
    # pandas and matplotlib are imported only when asked for: the pytest plugin imports table.py.
    if name in _LAZY:
        from importlib import import_module
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_LAZY)
