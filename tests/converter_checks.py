"""What every converter's tests share: where the real samples are (and the skip when they are not),
the one-trace and bad-input checks, and the fuzz pieces — the one property every converter must
have (only TraceError escapes; whatever converts is a valid trace), JSON values built from a
format's own words and keys, and mutations of a real sample (walk its nodes, replace/delete/corrupt
1-3 of them, maybe cut the text short). Each converter's test file keeps only what is particular to
its format: the samples, the words and keys, how a sample is made small, how a document is written."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest

from hypothesis import HealthCheck, settings, strategies as st

from pytest_agentcgroup.traces.ir import TOOLS, TraceError, parse_trace

# 100 examples per property; the mutated-sample tests draw from a module-scoped sample fixture,
# which hypothesis warns about although the tests never change it (mutate() copies).
FUZZ = settings(max_examples=100, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# ../shared/datasets beside the checkout: the real samples (their README gives origin and licence)
DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def real_sample(path: Path) -> Path:
    """`path`, or a skip naming it when the real samples are not on this machine."""
    if not path.exists():
        pytest.skip(f"real sample not present: {path}")
    return path


def only_trace(conv, path):
    """The single trace `conv` makes of `path` (fails if it makes more or fewer)."""
    (trace,) = conv.convert(path)
    return trace


def expect_trace_error(conv, path, match=()):
    """Converting `path` raises one TraceError whose message names the file and contains every
    string of `match`; returns it."""
    with pytest.raises(TraceError) as ei:
        list(conv.convert(path))
    msg = str(ei.value)
    assert str(path) in msg
    for m in match:
        assert m in msg, msg
    return ei.value


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


def json_values(words, keys, *, width: int = 4, max_leaves: int = 20):
    """Any JSON value, biased towards a format: leaves include its `words` (and a NUL), object keys
    are drawn from its `keys`; lists up to `width` items, objects up to `width` + 2 keys."""
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                     st.text(max_size=30), st.sampled_from([*words, "\u0000"]))
    return st.recursive(leaf, lambda kids: st.lists(kids, max_size=width) | st.dictionaries(
        st.sampled_from(keys), kids, max_size=width + 2), max_leaves=max_leaves)


def mutated(data, doc, values, ops=("replace", "delete", "nul")):
    """`doc` after 1-3 mutations drawn with `data` (hypothesis st.data()) at random nodes; the root
    can only be replaced."""
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(list(json_nodes(doc))))
        op = data.draw(st.sampled_from(ops if path else ("replace",)))
        doc = mutate(doc, path, op, data.draw(values))
    return doc


def maybe_cut(data, text: str) -> str:
    """`text`, or (half the time) a prefix of it: a file truncated mid-write."""
    if data.draw(st.booleans()):
        return text[:data.draw(st.integers(0, len(text)))]
    return text
