"""Checks shared by the settings tables of the kinds of study (timescale.py, multitenant.py,
density.py): a table's keys, numbers and lists, each mistake one TableError
naming the key. config.py prefixes the file.

May import: nothing of the package (pure).
"""
from __future__ import annotations


class TableError(ValueError):
    """An experiment's setting that cannot be used; the message names the key."""


def table(raw, where: str, required: set, optional: set) -> dict:
    if not isinstance(raw, dict):
        raise TableError(f"{where}: expected a table")
    missing, unknown = required - set(raw), set(raw) - required - optional
    if missing:
        raise TableError(f"{where}: missing key(s) {', '.join(sorted(missing))}")
    if unknown:
        raise TableError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected "
                         f"{', '.join(sorted(required | optional))}")
    return dict(raw)


def number(val, where: str, *, least: float = 0.0, strict: bool = True, integer: bool = False):
    ok = not isinstance(val, bool) and isinstance(val, int if integer else (int, float)) \
        and (val > least if strict else val >= least)
    if not ok:
        raise TableError(f"{where}: expected {'an integer' if integer else 'a number'} "
                         f"{'>' if strict else '>='} {least:g}, got {val!r}")
    return val


def trace_list(val, where: str) -> list[str]:
    if not isinstance(val, list) or not val or not all(isinstance(t, str) and t for t in val):
        raise TableError(f"{where}: expected a non-empty list of trace ids")
    return list(val)
