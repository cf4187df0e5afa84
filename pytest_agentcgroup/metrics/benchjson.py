"""pytest-benchmark's JSON schema, for the entries pytest-benchmark cannot write itself.

Under xdist pytest-benchmark disables itself, so each worker puts what a benchmark entry needs on
the test report (`report.agentcgroup_benchmark`, plain JSON data that survives xdist's report
serialization) and the controller writes the file (harness/controller.py). An entry has exactly
the keys `BenchmarkStats.as_dict()` gives (`group, name, fullname, params, param, extra_info,
options, stats`), so `pytest-benchmark compare` reads the file like one of its own.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from pytest_benchmark import __version__ as BENCHMARK_VERSION
from pytest_benchmark.stats import Stats
from pytest_benchmark.utils import funcname, safe_dumps

REPORT_ATTR = "agentcgroup_benchmark"


def plain_params(params: dict | None) -> dict | None:
    """Callspec params as JSON: an object that is not JSON (our `Case`) becomes its test id, so
    serial and parallel runs write the same `params`."""
    if params is None:
        return None
    out = {}
    for k, v in params.items():
        try:
            json.dumps(v)
            out[k] = v
        except (TypeError, ValueError):
            out[k] = str(v)
    return out


def options(fixture) -> dict:
    """The options pytest-benchmark records for a benchmark (its fixture's `_make_stats`)."""
    opts = {"disable_gc": fixture._disable_gc, "timer": fixture._timer, "min_rounds": fixture._min_rounds,
            "max_time": fixture._max_time, "min_time": fixture._min_time, "precision": fixture._precision,
            "confidence": fixture._confidence, "warmup": fixture._warmup}
    return {k: funcname(v) if callable(v) else v for k, v in opts.items()}


def one_round_stats(seconds: float) -> dict:
    """pytest-benchmark's stats of one round of one iteration (what `pedantic(rounds=1)` gives)."""
    s = Stats()
    s.update(seconds)
    return {**s.as_dict(), "data": [seconds], "iterations": 1}


def entry(fixture, seconds: float) -> dict:
    """The benchmark entry of a test whose `benchmark` fixture ran (in disabled mode) for `seconds`."""
    raw = {"group": fixture.group, "name": fixture.name, "fullname": fixture.fullname,
           "params": plain_params(fixture.params), "param": fixture.param, "extra_info": fixture.extra_info,
           "options": options(fixture), "stats": one_round_stats(seconds)}
    # exactly what pytest-benchmark's own encoder would write, as plain data xdist can carry
    return json.loads(safe_dumps(raw))


def document(entries: list[dict], machine_info: dict, commit_info: dict) -> dict:
    """The whole file, as pytest-benchmark's `pytest_benchmark_generate_json` lays it out."""
    return {"machine_info": machine_info, "commit_info": commit_info,
            "benchmarks": sorted(entries, key=lambda e: e["fullname"]),
            "datetime": datetime.now(timezone.utc).isoformat(), "version": BENCHMARK_VERSION}


def write(path, doc: dict) -> None:
    with open(path, "wb") as fh:
        fh.write(safe_dumps(doc, ensure_ascii=True, indent=4).encode())
