"""The comparison core (metrics/compare.py) shared by the regression gate and `agentcgroup compare`:
one rule syntax, one metric registry, and the gate = compare restricted to the worse direction."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import step_rec, write_results

from pytest_agentcgroup import cli
from pytest_agentcgroup.metrics import compare as core
from pytest_agentcgroup.metrics import gate
from pytest_agentcgroup.metrics.records import SUMMARY_METRICS
from pytest_agentcgroup.metrics.registry import REGISTRY
from pytest_agentcgroup.metrics.store import read_records
from pytest_agentcgroup.reports.comparison import compare


def _run(path, change=None, drop=(), add=()):
    """A run directory: traces t/a and t/b under two arms, 3 steps each; `change(arm, trace, i)`
    returns fields to override, `drop` (arm, trace) tests to leave out, `add` extra ones."""
    recs = []
    for arm in ("unlimited", "static-toolcall", *(a for a, _ in add)):
        for trace in ("t/a", "t/b"):
            if (arm, trace) in drop or (arm not in ("unlimited", "static-toolcall") and (arm, trace) not in add):
                continue
            for i in range(3):
                recs.append(step_rec(trace, arm, i, **{"latency_ms": 100.0 * (i + 1), "throttles": 1,
                                                       **(change(arm, trace, i) if change else {})}))
    return str(write_results(path, recs))


def _base_and_new(tmp_path):
    def change(arm, trace, i):
        if arm == "static-toolcall" and trace == "t/a":
            return {"oom_kills": int(i == 1), "latency_ms": 50.0 * (i + 1)}    # a kill more; p95 290 -> 145 ms
        if arm == "unlimited" and trace == "t/b":
            return {"executed": i != 2, "throttles": 3}                       # a step less ran; 3 -> 9 throttles
        if arm == "static-toolcall" and trace == "t/b":
            return {"latency_ms": 1000.0 * (i + 1), "max_rss_mb": 4.0}          # p95 290 -> 2900 ms; less memory
        return {}
    base = _run(tmp_path / "base")
    new = _run(tmp_path / "new", change, drop={("unlimited", "t/a")}, add=[("added", "t/a")])
    return base, new


def _gate_worse(base, new, rules):
    verdict = gate.compare(gate.load(base), gate.per_test(read_records(Path(new) / "metrics.jsonl")),
                           gate.parse_rules(rules))
    return verdict, {(f.key[2], f.key[1], f.rule.metric, f.baseline, f.now) for f in verdict.regressions}


@pytest.mark.parametrize("rules", [
    None,                                                   # each side's default: the gate's rules
    "oom_kills=+0,latency_p95_ms=+100%+500,executed_steps=exact",
    "oom_kills=0, latency_p95_ms=10%, throttles_total=100%+5, peak_rss_mb=0",     # + is optional
    "latency_p95_ms=exact,peak_rss_mb=exact,throttles_total=+200%",
    "cpu_total_ms=+0,failed_steps=+0,unstarted_steps=+0,throttles_total=+50%",
])
def test_gate_and_compare_give_the_same_worse_direction_verdict(tmp_path, capsys, rules):
    base, new = _base_and_new(tmp_path)
    verdict, gated = _gate_worse(base, new, rules or gate.DEFAULT_RULES)
    result = compare(base, new, rules, only_worse=True)
    compared = {(d.key["trace_id"], d.key["config"], d.metric, d.a, d.b) for d in result.beyond}
    assert compared == gated
    # a baseline file saved from the base run, as `make run` gates against, gives the same verdict
    gate.save(read_records(Path(base) / "metrics.jsonl"), tmp_path / "baseline.json")
    saved = compare(tmp_path / "baseline.json", new, rules, only_worse=True)
    assert {(d.key["trace_id"], d.key["config"], d.metric, d.a, d.b) for d in saved.beyond} == gated
    # on the command line too: the same rule text, the same exit code
    args = ["compare", base, new, "--only-worse", *(["--tol", rules] if rules else [])]
    assert cli.main(args) == (1 if verdict.failed else 0)
    # a test in one run only is listed by both and fails neither
    assert [k[1] for k in verdict.missing] == ["unlimited"] and [k[1] for k in verdict.new] == ["added"]
    assert {(d.key["config"], d.verdict) for d in result.differences if d.metric == "test"} == {
        ("unlimited", "lost-test"), ("added", "new-test")}
    capsys.readouterr()


def test_the_pair_differs_in_both_directions_and_only_worse_ones_fail_the_gate(tmp_path):
    base, new = _base_and_new(tmp_path)
    _, gated = _gate_worse(base, new, gate.DEFAULT_RULES)
    assert gated == {("t/a", "static-toolcall", "oom_kills", 0, 1), ("t/b", "unlimited", "executed_steps", 3, 2),
                     ("t/b", "static-toolcall", "latency_p95_ms", 290.0, 2900.0)}
    both = compare(base, new, gate.DEFAULT_RULES)               # two-sided: the faster p95 and lost/new tests count
    assert {(d.key["trace_id"], d.key["config"], d.metric, d.verdict) for d in both.beyond} == {
        ("t/a", "static-toolcall", "oom_kills", "worse"), ("t/b", "unlimited", "executed_steps", "changed"),
        ("t/b", "static-toolcall", "latency_p95_ms", "worse"), ("t/a", "unlimited", "test", "lost-test"),
        ("t/a", "added", "test", "new-test")}
    tight = compare(base, new, "latency_p95_ms=10%")
    assert ("t/a", "static-toolcall", "better") in {
        (d.key["trace_id"], d.key["config"], d.verdict) for d in tight.beyond}
    assert "better" not in {d.verdict for d in compare(base, new, "latency_p95_ms=10%", only_worse=True).beyond}


def test_exact_counts_either_direction_in_both_checks():
    k = ("e", "arm", "t", 0, "{}")
    for worse_only in (True, False):
        c = core.compare_tests({k: {"oom_kills": 2}}, {k: {"oom_kills": 1}}, core.parse_rules("oom_kills=exact"),
                               worse_only=worse_only)
        assert [(r.verdict, r.counts) for r in c.rows] == [("better", True)]
        c = core.compare_tests({k: {"oom_kills": 2}}, {k: {"oom_kills": 1}}, core.parse_rules("oom_kills=+0"),
                               worse_only=worse_only)
        assert [(r.verdict, r.counts) for r in c.rows] == [("better", not worse_only)]
    # a value that vanished has no direction: counted by a two-sided check only
    c = core.compare_tests({k: {"latency_p95_ms": 5.0}}, {k: {"latency_p95_ms": None}},
                           core.parse_rules("latency_p95_ms=+0"), worse_only=True)
    assert [(r.verdict, r.counts) for r in c.rows] == [("changed", False)]
    # a metric the base does not hold is not compared, and is named
    c = core.compare_tests({k: {}}, {k: {"oom_kills": 9}}, core.parse_rules("oom_kills=+0"), worse_only=False)
    assert [(r.verdict, r.counts) for r in c.rows] == [("missing-in-base", False)] and c.unchecked == ["oom_kills"]


def test_the_registry_covers_every_summary_metric_and_its_defaults_parse():
    assert set(SUMMARY_METRICS) <= set(REGISTRY), "a summary metric without a registry entry is never compared"
    for m in REGISTRY.values():
        assert m.better in ("lower", "higher", "none") and m.unit and m.source, m
        assert m.provenance in ("recorded", "derived", "synthetic", "measured"), m
        if m.name in SUMMARY_METRICS:
            assert (m.unit, m.better, m.provenance) == (SUMMARY_METRICS[m.name].unit, SUMMARY_METRICS[m.name].better,
                                                       SUMMARY_METRICS[m.name].provenance)
        if m.tolerance is not None:
            assert str(core.Rule.parse(f"{m.name}={m.tolerance}")) == f"{m.name}={m.tolerance}"
    # the gate's defaults are those it has always had (experiments/baseline/smoke.json is gated by them)
    assert gate.DEFAULT_RULES == ("oom_kills=+0,timeouts=+0,mem_high_steps=+1,latency_p95_ms=+100%+500,"
                                  "executed_steps=exact,unstarted_steps=+0")


@pytest.mark.parametrize("rules, message", [
    ("oom=+0", "rule 'oom=+0': no per-test metric 'oom'; expected METRIC=TOLERANCE with METRIC one of oom_kills, "),
    ("throttles=+0", "rule 'throttles=+0': no per-test metric 'throttles'; expected METRIC=TOLERANCE"),
    ("oom_kills", "rule 'oom_kills': expected METRIC=TOLERANCE with METRIC one of "),
    ("oom_kills=lots", "rule 'oom_kills=lots': tolerance must be N, X% or X%+N (a leading + is optional) or exact"),
    ("oom_kills=-5", "rule 'oom_kills=-5': tolerance must be N, X% or X%+N"),
    ("latency_p95_ms=50%100", "rule 'latency_p95_ms=50%100': tolerance must be N, X% or X%+N"),
    ("latency_p95_ms=+50%+", "rule 'latency_p95_ms=+50%+': tolerance must be N, X% or X%+N"),
    ("total_steps=+1", "rule 'total_steps=+1': total_steps has no better direction; use total_steps=exact"),
    ("oom_kills=+0,oom_kills=+1", "rule 'oom_kills=+1': a second rule for oom_kills"),
    ("latency_p95_ms=50%,100", "rule 'latency_p95_ms=50%,100': the old `N%,M` tolerance (the larger of the two) "
                               "is gone; write latency_p95_ms=50%+100 (the two are added) or latency_p95_ms=50%"),
])
def test_a_bad_rule_is_one_message_naming_it_in_the_gate_and_in_compare(tmp_path, capsys, rules, message):
    with pytest.raises(core.RuleError) as exc:
        core.parse_rules(rules)
    assert str(exc.value).startswith(message)
    with pytest.raises(gate.GateError) as exc:
        gate.parse_rules(rules)
    assert str(exc.value).startswith("gate " + message)
    a = _run(tmp_path / "a")
    assert cli.main(["compare", a, a, "--tol", rules]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentcgroup compare: --tol: " + message) and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_no_rules_is_an_error_too(capsys):
    with pytest.raises(core.RuleError, match="^no rules given$"):
        core.parse_rules(" , ")
    with pytest.raises(gate.GateError, match="^no gate rules given$"):
        gate.parse_rules("")


def test_compare_json_names_the_rule_of_each_row(tmp_path, capsys):
    base, new = _base_and_new(tmp_path)
    assert cli.main(["compare", base, new, "--tol", "oom_kills=+0", "--json", "--only-worse"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["rules"] == "oom_kills=+0" and report["only_worse"] is True
    assert [(d["trace_id"], d["config"], d["metric"], d["verdict"], d["rule"], d["unit"])
            for d in report["differences"]] == [("t/a", "static-toolcall", "oom_kills", "worse", "oom_kills=+0", "count")]
