"""Experiment 5's pure logic (studies/density.py): agents and priorities, the budget arithmetic, what
"held" means and the largest K held, survival, claims; its settings checked at load; and a config
without Experiment 5 skipping both of its tests with the reason."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_agentcgroup import config as cfgmod
from pytest_agentcgroup.studies import density as dens, kinds

REPO = Path(__file__).resolve().parents[1]


def test_agents_cycle_the_traces_and_only_the_first_are_high():
    got = dens.agents(["a", "b", "c"], 5, 1)
    assert [(x.index, x.trace_id, x.priority) for x in got] == [
        (0, "a", "high"), (1, "b", "low"), (2, "c", "low"), (3, "a", "low"), (4, "b", "low")]
    assert got[0].kind == "agent-high" and dens.AGENT_PRIORITY_KINDS[got[1].kind] == "low"


def test_budget_must_hold_every_agent_alone_and_bind_at_the_largest_k():
    assert dens.budget_problem(2560, [1778, 1594, 1089], [1778, 1594, 1089, 1778]) is None
    assert "does not hold the largest agent alone" in dens.budget_problem(1500, [1778, 100], [1778, 100])
    assert "never binds" in dens.budget_problem(4000, [1778, 1594], [1778, 1594])
    assert "never binds" in dens.budget_problem(3372, [1778, 1594], [1778, 1594])      # equal: fits exactly


@pytest.mark.parametrize("kills, done, n, p95, ok", [
    (0, 3, 3, 1.5, True), (1, 3, 3, 1.0, False), (0, 2, 3, 1.0, False), (0, 3, 3, 3.5, False),
    (0, 3, 3, None, False), (0, 3, 3, 3.0, True)])
def test_a_k_is_held_with_no_kill_every_trace_done_and_p95_slowdown_in_budget(kills, done, n, p95, ok):
    assert dens.held(kills, done, n, p95, 3.0) is ok


@pytest.mark.parametrize("results, expected", [
    ({1: True, 2: True, 3: False, 4: True}, 2),      # a ramp: a later success does not count
    ({1: False}, 0), ({1: True, 2: True}, 2),        # 3 not run (the ramp stopped): ends the count
    ({}, 0), ({1: True, 2: True, 3: True, 4: True, 6: True}, 6)])
def test_largest_k_held_is_the_top_of_an_unbroken_ramp(results, expected):
    assert dens.largest_k_held(results, [1, 2, 3, 4, 6]) == expected


def test_slowdown_and_survival():
    assert dens.slowdown(300.0, 100.0) == 3.0
    assert dens.slowdown(None, 100.0) is None and dens.slowdown(100.0, 0) is None
    assert dens.survival([False, True, False]) == pytest.approx(200 / 3)
    assert dens.survival([]) is None


def test_every_figure_a_claim_reads_is_declared_with_its_unit_direction_and_provenance():
    assert set(dens.CLAIM_METRICS) <= set(dens.METRICS)
    for m in dens.METRICS.values():
        assert m.unit and m.better in ("lower", "higher", "none") and m.provenance in ("recorded", "derived"), m


def test_shipped_exp5_settings_load_and_the_budget_binds():
    conf = cfgmod.load(REPO / "experiments" / "agentcgroup.toml")
    t = conf.experiments["exp5"].tables
    assert t["density"]["k"][0] == 1 and t["density"]["budget_mb"] > 0
    assert set(t["replication"]["arms"]) == {"unlimited", "bpf-soft", "agentcgroup"}
    # the control arm carries the same memory.high as the dynamic arm
    over = t["replication"]["arm_overrides"]
    assert over["agentcgroup"]["memory_high_mb"] == over["bpf-soft"]["memory_high_mb"]


BASE = "[arms.a]\n[arms.b]\n[experiments.exp5]\nkind = 'density'\n"


@pytest.mark.parametrize("toml, message", [
    (BASE + "[experiments.exp5.density]\ntraces = ['t']\nk = [1, 3, 2]\nbudget_mb = 10\n",
     "experiments.exp5.density.k: expected a non-empty increasing list"),
    (BASE + "[experiments.exp5.density]\ntraces = ['t']\nk = [1]\n", "experiments.exp5.density: missing key(s) budget_mb"),
    (BASE + "[experiments.exp5.density]\ntraces = ['t']\nk = [1]\nbudget_mb = 0\n",
     "experiments.exp5.density.budget_mb: expected a number > 0"),
    (BASE + "[experiments.exp5.density]\ntraces = []\nk = [1]\nbudget_mb = 5\n", "density.traces: expected a non-empty list"),
    (BASE + "[experiments.exp5.density]\ntraces = ['t']\nk = [1]\nbudget_mb = 5\nslowdown_p95_max = 0.5\n",
     "density.slowdown_p95_max: expected a number >= 1"),
    (BASE + "[experiments.exp5.density]\ntraces = ['t']\nk = [1]\nbudget_mb = 5\nkk = 1\n", "density: unknown key(s) kk"),
    (BASE + "[experiments.exp5.replication]\nhigh = 't'\nlow = ['t']\narms = ['c']\nbudget_mb = 5\n",
     "experiments.exp5.replication.arms: no arm named 'c'"),
    (BASE + "[experiments.exp5.replication]\nhigh = 't'\nlow = ['t']\narms = ['a']\nbudget_mb = 5\n"
     "arm_overrides = { c = { memory_high_mb = 1 } }\n", "replication.arm_overrides: expected a table"),
    # claims: one language (studies/claims.py), exp5's metrics, one test's metrics per claim
    (BASE + "claims = ['a.survival >= b.survival']\n",
     "experiments.exp5.claims[0]: claim 'a.survival >= b.survival': a.survival: no metric 'survival'"),
    (BASE + "claims = ['a.survival_pct >= z.survival_pct']\n", "claim 'a.survival_pct >= z.survival_pct': z.survival_pct: no arm 'z'"),
    (BASE + "claims = ['a.survival_pct >= b.largest_k_held']\n",
     "reads metrics of different tests (survival_pct: the replication test; largest_k_held: the density test)"),
    # the replication test runs its own arms: a claim on its metrics naming another would never be checked
    (BASE + "claims = ['b.survival_pct >= a.survival_pct']\n[experiments.exp5.replication]\nhigh = 't'\n"
     "low = ['t']\narms = ['a']\nbudget_mb = 5\n",
     "claim 'b.survival_pct >= a.survival_pct': survival_pct is measured only for the arms of "
     "[experiments.exp5.replication] arms (a), not b"),
])
def test_exp5_mistakes_are_one_message_naming_file_and_key(tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_replication_claims_read_every_replication_arm(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[arms.a]\n[arms.b]\n[arms.c]\n[experiments.exp5]\nkind = 'density'\narms = ['a', 'b']\n"
                    "claims = ['*.survival_pct >= 50', '*.largest_k_held >= 1']\n[experiments.exp5.replication]\n"
                    "high = 't'\nlow = ['t']\narms = ['b', 'c']\nbudget_mb = 5\n")
    exp = cfgmod.load(path).experiments["exp5"]
    rep = exp.tables["replication"]["arms"]
    mine = kinds.claims_of(exp, test="replication", arms=rep)
    assert [c.text for c in mine] == ["b.survival_pct >= 50", "c.survival_pct >= 50"]
    assert [c.text for c in kinds.claims_of(exp, test="density")] == \
        ["a.largest_k_held >= 1", "b.largest_k_held >= 1"]


def test_a_config_without_exp5_skips_both_tests_naming_the_section(pytester):
    shutil.copy(REPO / "experiments" / "test_exp5_density.py", pytester.path / "test_exp5_density.py")
    (pytester.path / "study.toml").write_text(f'traces = "{REPO / "traces"}"\n[arms.unlimited]\n'
                                              "[experiments.exp1]\narms = ['unlimited']\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                           "-rs", "test_exp5_density.py")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED [[]2[]]*experiment exp5 is not in *study.toml (no [[]experiments.exp5[]] section)*"])
    # with the section but no replication table: only that test skips, naming the table
    (pytester.path / "study.toml").write_text(f'traces = "{REPO / "traces"}"\n[arms.unlimited]\n'
                                              "[experiments.exp5]\nkind = 'density'\narms = ['unlimited']\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                           "-rs", "test_exp5_density.py")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*no [[]experiments.exp5.density[]] table*", "*no [[]experiments.exp5.replication[]] table*"])


STUDY_BY_KIND = '''
import pytest

@pytest.mark.experiment(name="crowd")
def test_crowd(agentcgroup_study):
    agentcgroup_study("density").assert_holds()

@pytest.mark.experiment(name="crowd")
def test_crowd_part(agentcgroup_study):
    agentcgroup_study("ramp").assert_holds()

@pytest.mark.experiment(name="plain")
def test_plain(agentcgroup_study):
    agentcgroup_study().assert_holds()
'''


def test_a_study_runs_by_its_kind_whatever_its_name(pytester):
    """`kind` picks the procedure: an experiment named `crowd` of kind density is run as exp5 is (here
    it skips naming its missing table); a part it does not have, or a trace x arm experiment (kind
    replay), fails saying what is wrong."""
    (pytester.path / "study.toml").write_text(f'traces = "{REPO / "traces"}"\n[arms.unlimited]\n'
                                              "[experiments.crowd]\nkind = 'density'\narms = ['unlimited']\n"
                                              "[experiments.plain]\narms = ['unlimited']\n")
    pytester.makepyfile(test_study=STUDY_BY_KIND)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml", "-rA")
    result.assert_outcomes(skipped=1, failed=2)
    result.stdout.fnmatch_lines_random([
        "SKIPPED*study.toml: no [[]experiments.crowd.density[]] table*",
        "test_study.py::test_crowd_part: a density study has two tests*got 'ramp'",
        "*study.toml: experiments.plain.kind is 'replay', which has no study procedure*uses agentcgroup_run"])
