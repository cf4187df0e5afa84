"""Shared pieces of the converter fuzz tests: walk and mutate decoded JSON, and the one property
every converter must have (only TraceError escapes; whatever converts is a valid trace)."""
from __future__ import annotations

import copy

from pytest_agentcgroup.traces.ir import TOOLS, TraceError, parse_trace


def check_converter(conv, path) -> None:
    try:
        results = list(conv.iter_results(path))
    except TraceError:
        return
    for r in results:
        if not isinstance(r, TraceError):
            parse_trace(r.to_json())
            assert all(s.tool in TOOLS for s in r.steps)
            r.dumps().encode("utf-8")


def json_nodes(obj, path=()):
    """Every path (tuple of keys/indexes) into a decoded JSON value, the root included."""
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from json_nodes(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from json_nodes(v, path + (i,))


def mutate(obj, path, op, value):
    """A copy of obj with the node at path deleted ("delete"), given a NUL ("nul"), given a fenced
    block ("fence"), or replaced by value (anything else)."""
    obj = copy.deepcopy(obj)
    if not path:
        return value
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if op == "delete":
        del parent[path[-1]]
    elif op == "nul" and isinstance(parent[path[-1]], str):
        parent[path[-1]] += "\u0000"
    elif op == "fence" and isinstance(parent[path[-1]], str):
        parent[path[-1]] += "\n```\n" + str(value)[:20] + "\n```"
    else:
        parent[path[-1]] = value
    return obj
