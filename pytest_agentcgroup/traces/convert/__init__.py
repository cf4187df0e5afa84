"""Converters from public agent-trace formats to the trace IR.

Each converter is one module here exposing:

    FORMAT: str                                   # the name users pass to `--format`
    def sniff(path: Path) -> bool                 # does this file look like my format? (cheap)
    def convert(path: Path) -> Iterator[Trace]    # the traces in it; raises TraceError naming
                                                  # file, record/step and field on bad input

Modules are imported lazily so that one format's optional dependency never breaks another. `ir`
reads the IR itself back, so that `convert --to atif` takes our own traces too (atif.py writes ATIF).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

_MODULES = {
    "atif": "atif",                               # before ir: our ATIF output names the IR schema in `extra`
    "ir": "ir",                                   # our own traces, read back (e.g. for --to atif)
    "claude-code": "claude_code",
    "openhands-rows": "openhands_rows",
    "openhands-resolver": "openhands_resolver",   # before openhands-events: its pairs may carry `source`
    "openhands-events": "openhands_events",
    "swe-agent-rows": "swe_agent_rows",
    "swe-agent-traj": "swe_agent_traj",
    "mini-swe-agent": "mini_swe_agent",
    "playwright": "playwright",
}


def formats() -> tuple[str, ...]:
    return tuple(_MODULES)


def converter(fmt: str) -> ModuleType:
    if fmt not in _MODULES:
        raise KeyError(f"unknown format {fmt!r}; known: {', '.join(_MODULES)}")
    return importlib.import_module(f"{__name__}.{_MODULES[fmt]}")


def sniff(path: Path) -> str | None:
    """The format of `path`, or None when no converter recognises it."""
    for fmt in _MODULES:
        try:
            mod = converter(fmt)
        except ImportError:
            continue
        if mod.sniff(Path(path)):
            return fmt
    return None
