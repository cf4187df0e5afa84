"""The comparison core: one test (trace × arm × seed × params) of a base run against the same test
of a new run, metric by metric, within tolerances. The regression gate (gate.py) and `agentcgroup
compare` (reports/comparison.py) are this core; the gate looks only at the worse direction.

Rules are text, `METRIC=TOLERANCE`, comma- or newline-separated (docs/gate.md, "Tolerances"):

    oom_kills=+0               may not get worse at all
    mem_high_steps=+1          may get worse by 1 (in the metric's unit)
    latency_p95_ms=+100%+500   may get worse by 100 % of the base value plus 500 ms
    total_steps=exact          may not change in either direction

The leading `+` is optional (`100%+500` is the same rule). The tolerance is an allowance in the
metric's worse direction, which the registry knows (registry.py: a rise for lower-is-better, a fall
for higher-is-better). A two-sided check (reproducibility) allows the same amount either way.
A metric without a better direction takes only `exact`.

Verdicts, per test and metric: `same` (equal), `within` (moved, within tolerance), `worse`,
`better` (beyond tolerance), `changed` (beyond tolerance with no direction: an `exact` metric
without one, or a value that appeared or vanished), `missing-in-base` / `missing-in-new` (that run
does not hold the metric, e.g. a baseline saved before it existed: not compared). Per test:
`new-test` (in the new run only) and `lost-test` (in the base only).

What counts (fails the check): in a two-sided check every `worse`, `better`, `changed` and a test
in one run only; in a worse-only check (`worse_only=True`: the gate, `compare --only-worse`) only
`worse`, and any change under `exact`. A test in one run only is listed there, not counted: a `-k`
selection runs fewer tests, a new arm is not in the baseline yet.
"""
from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

from .records import summarize
from .registry import REGISTRY
from .store import run_key

_NUM = r"\d+(?:\.\d+)?"
_TOLERANCE = re.compile(rf"^\+?(?:(?P<pct>{_NUM})%(?:\+(?P<abs1>{_NUM}))?|(?P<abs2>{_NUM}))$")
_OLD_COMPARE = re.compile(rf"^{_NUM}%?$")          # the M of the old compare syntax `N%,M`
_EPSILON = 1e-9                                     # float noise of a slack, e.g. 10 % of 0.3
SYNTAX = "N, X% or X%+N (a leading + is optional) or exact"


class RuleError(ValueError):
    """A rule that cannot be used; the message names the rule."""


@dataclass(frozen=True)
class Rule:
    metric: str
    pct: float = 0.0            # allowance relative to the base value, in percent
    abs: float = 0.0            # absolute allowance, in the metric's unit
    exact: bool = False         # any change counts, better or worse

    @classmethod
    def parse(cls, text: str) -> "Rule":
        metric, sep, tol = (s.strip() for s in text.partition("="))
        if not sep or metric not in REGISTRY:
            what = f"no per-test metric {metric!r}; " if sep else ""
            raise RuleError(f"rule {text!r}: {what}expected METRIC=TOLERANCE with METRIC one of "
                            + ", ".join(REGISTRY))
        if tol == "exact":
            return cls(metric, exact=True)
        m = _TOLERANCE.match(tol)
        if not m:
            raise RuleError(f"rule {text!r}: tolerance must be {SYNTAX}")
        if REGISTRY[metric].better == "none":
            raise RuleError(f"rule {text!r}: {metric} has no better direction; use {metric}=exact")
        return cls(metric, pct=float(m["pct"] or 0), abs=float(m["abs1"] or m["abs2"] or 0))

    @property
    def unit(self) -> str:
        return REGISTRY[self.metric].unit

    @property
    def better(self) -> str:
        return REGISTRY[self.metric].better

    def slack(self, base: float) -> float:
        """How far the new value may move from `base` (in the worse direction, or either way)."""
        return 0.0 if self.exact else abs(base) * self.pct / 100.0 + self.abs

    def limit(self, base: float) -> float:
        """The worst value still accepted."""
        return base - self.slack(base) if self.better == "higher" else base + self.slack(base)

    def breaks(self, base: float, now: float) -> bool:
        """Worse than the tolerance allows (under `exact`: changed at all)."""
        if self.exact:
            return now != base
        return now < self.limit(base) - _EPSILON if self.better == "higher" else now > self.limit(base) + _EPSILON

    def describe_limit(self, base: float) -> str:
        if self.exact:
            return f"== {base:g}"
        return f"{'>=' if self.better == 'higher' else '<='} {round(self.limit(base), 3):g}"

    def __str__(self) -> str:
        if self.exact:
            return f"{self.metric}=exact"
        return f"{self.metric}=+" + (f"{self.pct:g}%" if self.pct else "") + (
            f"+{self.abs:g}" if self.abs and self.pct else f"{self.abs:g}" if not self.pct else "")


def parse_rules(text: str | list[str]) -> list[Rule]:
    """Rules from text (comma- or newline-separated) or a list of rule strings."""
    parts = [p.strip() for p in (text if isinstance(text, list) else re.split(r"[,\n]", text))]
    rules: list[Rule] = []
    for i, part in enumerate(parts):
        if not part:
            continue
        if "=" not in part and _OLD_COMPARE.match(part) and i and "=" in parts[i - 1]:
            # `latency_p95_ms=50%,100`: compare's old `N%,M` (the larger of the two) — refused, not
            # guessed at: percent and absolute are added now, so the number means something else
            metric, _, pct = parts[i - 1].partition("=")
            raise RuleError(f"rule {parts[i - 1] + ',' + part!r}: the old `N%,M` tolerance (the larger of the "
                            f"two) is gone; write {metric.strip()}={pct.strip()}+{part} (the two are added) or "
                            f"{metric.strip()}={pct.strip()} — see docs/gate.md, 'Tolerances'")
        rule = Rule.parse(part)
        if any(r.metric == rule.metric for r in rules):
            raise RuleError(f"rule {part!r}: a second rule for {rule.metric}")
        rules.append(rule)
    if not rules:
        raise RuleError("no rules given")
    return rules


def default_rules(worse_only: bool) -> str:
    """The rules a check uses when none are given: a regression check (worse only) the registry's
    `regression` metrics, a reproducibility check every metric with a default tolerance."""
    return ",".join(f"{m.name}={m.tolerance}" for m in REGISTRY.values()
                    if m.tolerance is not None and (m.regression or not worse_only))


# ---------------------------------------------------------------------------------------------
# Per-test values: a run's step records as {key: {metric: value}}

Key = tuple          # store.run_key: (experiment, arm, trace_id, seed, params as sorted JSON)


def test_key(record: dict) -> Key:
    """Which test wrote a step record (its arm is `config`); no experiment is None, no seed 0."""
    return run_key(record.get("experiment") or None, record["config"], record["trace_id"],
                   record.get("seed") or 0, record.get("params"))


def test_values(records: list[dict]) -> dict[Key, dict]:
    """Every registry metric of each test, from its step records, in first-seen order."""
    groups: dict[Key, list[dict]] = defaultdict(list)
    for r in records:
        groups[test_key(r)].append(r)
    out = {}
    for key, recs in groups.items():
        s = summarize(recs, key[1])
        executed = [r for r in recs if r.get("executed", True)]

        def total(k):
            vals = [r[k] for r in recs if r.get(k) is not None]
            return round(sum(vals), 3) if vals else None

        peaks = [r["max_rss_mb"] for r in recs if r.get("max_rss_mb") is not None]
        s.update(failed_steps=sum(1 for r in executed if r.get("exit_code") not in (0, None) or r.get("signal")),
                 latency_total_ms=total("latency_ms"), cpu_total_ms=total("cpu_ms"),
                 peak_rss_mb=max(peaks) if peaks else None)
        out[key] = {m: s[m] for m in REGISTRY if m in s}
    return out


# ---------------------------------------------------------------------------------------------
# The comparison

TEST = "test"                 # the metric name of a row about a test in one run only


@dataclass(frozen=True)
class Row:
    key: Key
    metric: str               # a registry metric, or TEST for a test in one run only
    base: float | None
    new: float | None
    rule: Rule | None
    verdict: str              # see the module docstring
    counts: bool              # fails the check

    @property
    def delta(self) -> float | None:
        return None if self.base is None or self.new is None else self.new - self.base

    @property
    def allowed(self) -> float | None:
        return None if self.rule is None or self.base is None else self.rule.slack(self.base)


@dataclass
class Comparison:
    rules: list[Rule]
    worse_only: bool
    rows: list[Row] = field(default_factory=list)
    tests: int = 0            # tests in both runs

    @property
    def counted(self) -> list[Row]:
        return [r for r in self.rows if r.counts]

    def tests_with(self, verdict: str) -> list[Key]:
        return [r.key for r in self.rows if r.metric == TEST and r.verdict == verdict]

    @property
    def unchecked(self) -> list[str]:
        """Rule metrics some test of the base run does not hold (e.g. a baseline older than them)."""
        return list(dict.fromkeys(r.metric for r in self.rows if r.verdict == "missing-in-base"))


def _number(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _verdict(rule: Rule, base, new, worse_only: bool) -> tuple[str, bool]:
    if base == new:
        return "same", False
    if base is None or new is None:                # a value appeared or vanished: no direction
        return "changed", rule.exact or not worse_only
    if not rule.exact and abs(new - base) <= rule.slack(base) + _EPSILON:
        return "within", False
    verdict = "changed" if rule.better == "none" else (
        "worse" if (new > base) == (rule.better == "lower") else "better")
    return verdict, rule.exact or verdict == "worse" or not worse_only


def compare_tests(base: dict[Key, dict], new: dict[Key, dict], rules: list[Rule], *,
                  worse_only: bool) -> Comparison:
    """Every test of `base` (in its order), then those only in `new`, against the rules."""
    out = Comparison(rules, worse_only)
    for key in [*base, *(k for k in new if k not in base)]:
        if key not in new or key not in base:
            out.rows.append(Row(key, TEST, None, None, None, "lost-test" if key not in new else "new-test",
                                not worse_only))
            continue
        out.tests += 1
        for rule in rules:
            if rule.metric not in base[key] or rule.metric not in new[key]:
                verdict = "missing-in-base" if rule.metric not in base[key] else "missing-in-new"
                out.rows.append(Row(key, rule.metric, base[key].get(rule.metric), new[key].get(rule.metric),
                                    rule, verdict, False))
                continue
            b, n = _number(base[key][rule.metric]), _number(new[key][rule.metric])
            verdict, counts = _verdict(rule, b, n, worse_only)
            out.rows.append(Row(key, rule.metric, b, n, rule, verdict, counts))
    return out


def describe_key(key: Key) -> dict:
    """A key as named fields (arm as `config`, as in metrics.jsonl); params as an object."""
    exp, arm, trace, seed, params = key
    return {"experiment": exp, "trace_id": trace, "config": arm, "seed": seed, "params": json.loads(params)}
