"""The regression gate: compare a run with a baseline per trace × arm (× seed × params) and per
metric, and fail on what got worse beyond a tolerance. It is the comparison core (compare.py) in
its worse-only mode: the rules, their syntax (docs/gate.md, "Tolerances"), the metrics (registry.py) and
the treatment of a test in one run only are the core's, shared with `agentcgroup compare`.

Rules (`--agentcgroup-gate-rules`, ini `agentcgroup_gate_rules`) default to the registry's
regression metrics (DEFAULT_RULES). A baseline saved before a metric existed does not hold it: the
verdict lists such rules as unchecked. A trace × arm in this run but not in the baseline is reported
as `new`, one in the baseline but not in this run as `missing`; neither fails the gate (a `-k`
selection or a newly added arm must not fail it; regenerate the baseline to cover them).

A baseline is a file written by `save()` (schema `agentcgroup-baseline/1`), a run directory or its
metrics.jsonl (a saved run), a results directory (its newest run, as `results/latest`), or a
pytest-benchmark JSON written by this plugin.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import compare as core
from .compare import Rule
from .registry import REGISTRY
from .store import METRICS_FILE, PACKED_METRICS_FILE, NoRun, read_records, resolve_run, run_key

SCHEMA = "agentcgroup-baseline/1"
SHOW = 10                     # new/missing entries listed by name; the rest are counted
# oom_kills=+0,timeouts=+0,mem_high_steps=+1,latency_p95_ms=+100%+500,executed_steps=exact,unstarted_steps=+0
DEFAULT_RULES = core.default_rules(worse_only=True)


class GateError(ValueError):
    """A rule or baseline that cannot be used; the message names the rule or the file."""


def parse_rules(text: str | list[str]) -> list[Rule]:
    if not (text if isinstance(text, list) else text.strip(" ,\n")):
        raise GateError("no gate rules given")
    try:
        return core.parse_rules(text)
    except core.RuleError as exc:
        raise GateError(f"gate {exc}") from None


# ---------------------------------------------------------------------------------------------
# Per-test metrics: a run, a saved run, or a baseline file, all as {key: {metric: value}}

Key = tuple          # store.run_key: (experiment, arm, trace_id, seed, params as sorted JSON)


def per_test(records: list[dict]) -> dict[Key, dict]:
    return core.test_values(records)


def _key(obj: dict) -> Key:
    """A baseline entry's key (a saved test, or a benchmark's extra_info): its arm is `arm`."""
    return run_key(obj.get("experiment"), obj["arm"], obj["trace_id"], obj.get("seed", 0), obj.get("params"))


def load(path: str | Path) -> dict[Key, dict]:
    """A baseline: a file, a run directory, or a results directory (= its newest run; `latest`)."""
    path = Path(path)
    if path.is_dir():
        try:
            path = resolve_run(path) / METRICS_FILE
        except NoRun as exc:
            raise GateError(f"baseline {exc}") from None
        if not path.exists() and path.with_name(PACKED_METRICS_FILE).exists():
            raise GateError(f"baseline {path.parent}: a published run, its records gzip'd ({PACKED_METRICS_FILE}); "
                            f"gunzip it into {METRICS_FILE} to gate against it")
    if not path.exists():
        raise GateError(f"baseline {path}: no such file (regenerate it: see docs/gate.md, 'Regression gate')")
    if path.suffix == ".jsonl":
        return per_test(read_records(path))
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GateError(f"baseline {path}: not valid JSON: {exc}") from None
    except OSError as exc:
        raise GateError(f"baseline {path}: cannot read: {exc.strerror}") from None
    try:
        if isinstance(doc, dict) and doc.get("schema") == SCHEMA:
            return {_key(t): t["metrics"] for t in doc["tests"]}
        if isinstance(doc, dict) and "benchmarks" in doc:          # pytest-benchmark JSON
            out = {}
            for b in doc["benchmarks"]:
                info = b.get("extra_info") or {}
                if "arm" in info and "metrics" in info:
                    out[_key(info)] = {m: d["value"] for m, d in info["metrics"].items()}
            return out
    except (KeyError, TypeError, AttributeError) as exc:
        raise GateError(f"baseline {path}: missing or malformed field {exc}") from None
    raise GateError(f"baseline {path}: neither an {SCHEMA} file, a results metrics.jsonl nor a "
                    "pytest-benchmark JSON")


def save(records: list[dict], path: str | Path, *, note: str = "") -> int:
    """Write the baseline of a run; returns the number of trace × arm entries."""
    tests = []
    for (exp, arm, trace, seed, params), metrics in sorted(per_test(records).items(), key=lambda kv: str(kv[0])):
        tests.append({"experiment": exp, "arm": arm, "trace_id": trace, "seed": seed,
                      "params": json.loads(params),
                      "metrics": {m: v for m, v in metrics.items() if m in REGISTRY}})
    doc = {"schema": SCHEMA, "made": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "note": note, "units": {m: d.unit for m, d in REGISTRY.items()}, "tests": tests}
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise GateError(f"baseline NOT saved to {path}: {exc.strerror}") from None
    return len(tests)


# ---------------------------------------------------------------------------------------------
# The comparison

@dataclass(frozen=True)
class Finding:
    key: Key
    rule: Rule
    baseline: float
    now: float


@dataclass
class Verdict:
    regressions: list[Finding]
    new: list[Key]
    missing: list[Key]
    checked: int                  # trace × arm entries compared
    unchecked: list[str] = field(default_factory=list)    # rule metrics the baseline does not hold

    @property
    def failed(self) -> bool:
        return bool(self.regressions)


def compare(baseline: dict[Key, dict], current: dict[Key, dict], rules: list[Rule]) -> Verdict:
    c = core.compare_tests(baseline, current, rules, worse_only=True)
    regressions = [Finding(r.key, r.rule, r.base, r.new) for r in sorted(c.counted, key=lambda r: str(r.key))]
    return Verdict(regressions, sorted(c.tests_with("new-test"), key=str), sorted(c.tests_with("lost-test"), key=str),
                   c.tests, c.unchecked)


def _where(key: Key) -> list[str]:
    exp, arm, trace, seed, params = key
    extra = ([f"seed={seed}"] if seed else []) + [f"{k}={v}" for k, v in json.loads(params).items()]
    return [trace + (" [" + " ".join(extra) + "]" if extra else ""), f"{exp}/{arm}"]


def format_table(verdict: Verdict) -> str:
    heads = ["trace", "arm", "metric", "baseline", "now", "limit"]
    rows = [[*_where(f.key), f"{f.rule.metric} ({f.rule.unit})", f"{f.baseline:g}", f"{f.now:g}",
             f"{f.rule.describe_limit(f.baseline)} ({f.rule})"] for f in verdict.regressions]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(heads), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_verdict(verdict: Verdict, baseline_path) -> list[str]:
    """The lines the terminal summary shows."""
    out = [f"baseline: {baseline_path}; {verdict.checked} trace x arm compared, "
           f"{len(verdict.regressions)} regression(s), {len(verdict.new)} new, {len(verdict.missing)} missing"]
    if verdict.regressions:
        out += format_table(verdict).splitlines()
    if verdict.unchecked:
        out.append(f"not in the baseline, not gated: {', '.join(verdict.unchecked)} (regenerate the baseline)")
    for what, keys in (("new (not in the baseline, not gated)", verdict.new),
                       ("missing (in the baseline, not in this run)", verdict.missing)):
        out += [f"{what}: {' '.join(_where(k)[::-1])}" for k in keys[:SHOW]]
        if len(keys) > SHOW:
            out.append(f"{what}: ... and {len(keys) - SHOW} more")
    return out
