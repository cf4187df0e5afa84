"""The experiment configuration: arms and budgets are data; every mistake is one message naming the
file and the key; the shipped configuration itself is valid."""
from __future__ import annotations

from pathlib import Path

import pytest

from pytest_agentcgroup import config as cfgmod
from pytest_agentcgroup.arms import Arm
from pytest_agentcgroup.studies.budgets import check, predict

REPO = Path(__file__).resolve().parents[1]


def test_shipped_configuration_loads_and_names_the_six_arms():
    conf = cfgmod.load(REPO / "experiments" / "agentcgroup.toml")
    assert set(conf.experiments["exp1"].arms) == {"unlimited", "static-env", "static-toolcall", "static-high",
                                                  "agentcgroup", "bpf-soft"}
    assert conf.arms["static-env"].scope == "trace"
    assert conf.arms["static-high"].memory_high_mb and conf.arms["static-high"].memory_max_mb is None
    assert (conf.traces / "manifest.json").is_file()


def test_shipped_oracle_arm_limits_each_step_at_its_peak_plus_a_margin_and_is_in_no_experiment():
    conf = cfgmod.load(REPO / "experiments" / "agentcgroup.toml")
    oracle = conf.arms["oracle"]
    assert (oracle.scope, oracle.limit_from, oracle.memory_max_mb, oracle.policy) == ("step", "step_peak", None, None)
    assert 0 < oracle.margin_mb <= 16 and oracle.step_memory_max_mb(100.0) == 100.0 + oracle.margin_mb
    # defined only: adding it to an experiment's arms would change that experiment's run and baseline
    assert not [name for name, exp in conf.experiments.items() if "oracle" in exp.arms]


def test_shipped_policy_arms_differ_only_in_ebpf():
    from pytest_agentcgroup.arms import Rules
    conf = cfgmod.load(REPO / "experiments" / "agentcgroup.toml")
    dyn, soft = (Rules.from_arm(conf.arms[a]) for a in ("agentcgroup", "bpf-soft"))
    assert dyn.ebpf and not soft.ebpf
    assert (dyn.memory_high_mb, dyn.memory_max_mb) == (soft.memory_high_mb, soft.memory_max_mb) == (512, 2048)
    assert dyn.priority("test") == "low" and dyn.priority("edit") == "high" and dyn.priority("search") == "normal"
    # the control arm has the same priorities and cpu weights: only eBPF differs
    assert (dyn.priorities, dyn.cpu_weight) == (soft.priorities, soft.cpu_weight)
    assert dyn.cpu_weight["high"] > dyn.cpu_weight["normal"] > dyn.cpu_weight["low"]


@pytest.mark.parametrize("toml, message", [
    ("[arms.a]\nmemory_max_mb = 0\n", "arms.a.memory_max_mb: expected a positive number, got 0"),
    ("[arms.a]\nscope = 'tenant'\n", "arms.a.scope: expected one of step, trace, got 'tenant'"),
    # CPU settings: v2 semantics, the kernel's bounds, named field by field
    ("[arms.a]\ncpu_weight = 0\n", "arms.a.cpu_weight: expected an integer 1..10000"),
    ("[arms.a]\ncpu_weight = 10001\n", "arms.a.cpu_weight: expected an integer 1..10000"),
    ("[arms.a]\ncpu_weight = 1.5\n", "arms.a.cpu_weight: expected an integer 1..10000"),
    ("[arms.a]\ncpu_max = '50000'\n", "arms.a.cpu_max: expected \"QUOTA PERIOD\" in microseconds"),
    ("[arms.a]\ncpu_max = '500 100000'\n", "arms.a.cpu_max: expected \"QUOTA PERIOD\" in microseconds (quota >= 1000"),
    ("[arms.a]\ncpu_max = '50000 5000000'\n", "period 1000..1000000"),
    ("[arms.a]\ncpu_max = '50000 100000'\ncpu_max_cpus = 0.5\n", "arms.a: cpu_max and cpu_max_cpus both set"),
    ("[arms.a]\ncpu_max_cpus = 0.001\n", "arms.a.cpu_max_cpus: expected a number of CPUs >= 0.01"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\ncpu_weight = { urgent = 500 }\n",
     "arms.a.rules.cpu_weight: expected a table priority (low, normal, high) -> weight"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\ncpu_weight = { low = 0 }\n",
     "arms.a.rules.cpu_weight.low: expected an integer 1..10000"),
    ("[arms.a]\nmemroy_max_mb = 5\n", "arms.a: unknown key(s) memroy_max_mb"),
    ("[arms.a]\nmemory_max_mb = 100\nmemory_high_mb = 200\n", "above memory_max_mb (100) can never be reached"),
    ("[arms.a]\n[experiments.e]\narms = ['b']\n", "experiments.e.arms: no arm named 'b'"),
    ("[arms.a]\n[experiments.e.budgets.a]\noom_kill = 0\n", "experiments.e.budgets.a.oom_kill: unknown budget"),
    ("[arms.a]\n[experiments.e]\nbudgets = 5\n", "experiments.e.budgets: expected a table of [experiments.e.budgets.<arm>] tables, got 5"),
    ("[arms.a]\n[experiments.e]\nbudgets = { a = 5 }\n", "experiments.e.budgets.a: expected a table of counter = budget, got 5"),
    ("[arms.a]\n[experiments.e.budgets.a]\noom_kills = 'some'\n", "experiments.e.budgets.a.oom_kills: expected a number >= 0 or \"predicted\""),
    ("[defaults]\ntime_scale = 1\nspeed = 2\n", "defaults.speed: unknown"),
    ("arms = [", "not valid TOML"),
    ("[arms.a]\npolicy = 'agentcgroup'\nscope = 'trace'\n", "arms.a.scope: a policy acts on each step's cgroup"),
    ("[arms.a]\npolicy = 'senpai'\n", "arms.a.policy: unknown policy 'senpai'"),
    ("[arms.a]\nrules = { hold_ms = 5 }\n", "arms.a.rules: rules without a policy"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\nhold = 5\n", "arms.a.rules: unknown key(s) hold;"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\nhold_ms = -1\n", "arms.a.rules.hold_ms: expected a number >= 0, got -1"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\nebpf = 'no'\n", "arms.a.rules.ebpf: expected true or false"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\nfreeze_after = 0\n", "arms.a.rules.freeze_after: expected a number >= 1"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules.priorities]\ntest = 'lowest'\n",
     "arms.a.rules.priorities: expected one of low, normal, high"),
    ("[arms.a]\npolicy = 'agentcgroup'\n[arms.a.rules]\nmemory_high_mb = 5\n",
     "arms.a.rules.memory_high_mb: set the limits on the arm itself (arms.a.memory_high_mb)"),
    ("[arms.a]\n[experiments.e.budgets.a]\npolicy_kills = 'predicted'\n",
     "experiments.e.budgets.a.policy_kills: expected a number >= 0, got 'predicted'"),
    # a sweep's ablation of a policy arm's rules is checked like the arm's own rules
    ("[arms.a]\npolicy = 'agentcgroup'\n[experiments.e.matrix]\n"
     "ablations = [{ name = 'x', arms = { a = { rules = { hold = 5 } } } }]\n", "rules: unknown key(s) hold;"),
    # a hard limit from each step's own peak (the oracle arm): on step cgroups of a static arm only
    ("[arms.o]\nlimit_from = 'step_peak'\nmargin_mb = -1\n", "arms.o.margin_mb: expected a number >= 0, got -1"),
    ("[arms.o]\nlimit_from = 'step_peak'\nmargin_mb = 'six'\n", "arms.o.margin_mb: expected a number >= 0"),
    ("[arms.o]\nlimit_from = 'trace_peak'\n", "arms.o.limit_from: expected one of step_peak, vpa, window, predict, got 'trace_peak'"),
    ("[arms.o]\nlimit_from = 'step_peak'\nscope = 'trace'\n", "arms.o.limit_from: a limit from each step's peak goes "
     "on each step's cgroup; scope must be \"step\", got 'trace'"),
    ("[arms.o]\nlimit_from = 'step_peak'\nmemory_max_mb = 512\n", "arms.o.memory_max_mb: limit_from gives each step "
     "its hard limit"),
    ("[arms.o]\nlimit_from = 'step_peak'\npolicy = 'agentcgroup'\n", "arms.o.limit_from: a policy arm's controller"),
    ("[arms.o]\nmargin_mb = 6\n", "arms.o.margin_mb: a margin without limit_from"),
    ("[arms.o]\nlimit_from = 'step_peak'\n[experiments.e.matrix]\n"
     "ablations = [{ name = 'x', arms = { o = { scope = 'trace' } } }]\n", "arms.o.limit_from: a limit from each step's"),
    # two axes each fine alone, impossible together: named at load, not a traceback at collection
    ("[arms.a]\n[experiments.e.matrix]\nablations = [{ name = 'tight', arms = { a = { memory_max_mb = 256 } } }]\n"
     "sizes = [{ name = 'big', arms = { a = { memory_high_mb = 512 } } }]\n",
     "experiments.e.matrix point ablation=tight, size=big.arms.a: memory_high_mb (512) above memory_max_mb (256)"),
])
def test_config_mistakes_are_one_message_naming_file_and_key(tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load(path)
    assert str(err.value).startswith(str(path))
    assert message in str(err.value)


def test_missing_config_file_says_which_option_sets_it(tmp_path):
    with pytest.raises(cfgmod.ConfigError, match="--agentcgroup-config"):
        cfgmod.load(tmp_path / "nope.toml")


@pytest.mark.parametrize("peak, limit, expected", [
    (1778, 512, True), (100, 512, False), (500, 512, None), (540, 512, None), (600, 512, True), (50, None, False)])
def test_prediction_leaves_a_margin_around_the_limit(peak, limit, expected):
    assert predict(peak, limit) is expected


def _rec(step_id, peak, oom, high=0, latency=10.0):
    return {"trace_id": "t", "step_id": step_id, "executed": True, "replayed_peak_mb": peak,
            "oom_kills": oom, "mem_high_events": high, "latency_ms": latency, "replayed_duration_ms": 0.0}


def test_predicted_budget_catches_a_missing_and_an_extra_kill():
    arm = Arm("static-toolcall", memory_max_mb=512)
    good = [_rec(0, 1778, 1), _rec(1, 20, 0)]
    assert check(good, {"oom_kills": "predicted"}, arm) == []
    bad = [_rec(0, 1778, 0), _rec(1, 20, 1)]
    got = [str(v) for v in check(bad, {"oom_kills": "predicted"}, arm)]
    assert got == ["t step 0: oom_kills = 0, budget >= 1 (replayed peak 1778 MiB > max limit 512 MiB)",
                   "t step 1: oom_kills = 1, budget 0 (replayed peak 20 MiB < max limit 512 MiB)"]


def test_latency_budget_names_the_slowest_step():
    recs = [_rec(i, 1, 0, latency=10.0) for i in range(19)] + [_rec(19, 1, 0, latency=900.0)]
    (v,) = check(recs, {"latency_overhead_p95_ms": 50}, Arm("unlimited"))
    assert v.step_id == 19 and v.counter == "latency_overhead_p95_ms"
    # a real command its trace gives no duration has no overhead: its wall time is its own; under
    # emulate the step is asked to last 0 ms, and its wall time is all overhead
    recs[19]["replayed_duration_ms"] = None
    both = {"latency_overhead_p95_ms": 50, "latency_overhead_max_ms": 100}
    assert check([{**r, "executor": "sandbox"} for r in recs], both, Arm("unlimited")) == []
    got = check([{**r, "executor": "emulate"} for r in recs], both, Arm("unlimited"))
    assert [(v.step_id, v.counter) for v in got] == [(19, "latency_overhead_ms"), (19, "latency_overhead_p95_ms")]
    # a real command its trace gives a duration (profiled in another run): its noise beside that run
    # is not the harness's, so only the worst step is held to a budget
    recs[19]["replayed_duration_ms"] = 0.0
    got = check([{**r, "executor": "sandbox"} for r in recs], both, Arm("unlimited"))
    assert [(v.step_id, v.counter) for v in got] == [(19, "latency_overhead_ms")]


def test_predicted_throttles_only_for_low_priority_steps_above_the_soft_limit():
    arm = Arm("agentcgroup", memory_high_mb=512, memory_max_mb=2048, policy="agentcgroup")
    rec = lambda i, peak, n, pri: {**_rec(i, peak, 0), "throttles": n, "priority": pri}   # noqa: E731
    good = [rec(0, 1778, 5, "low"), rec(1, 1778, 0, "normal"), rec(2, 20, 0, "low")]
    assert check(good, {"throttles": "predicted"}, arm) == []
    bad = [rec(0, 1778, 0, "low"), rec(1, 1778, 2, "high"), rec(2, 20, 1, "low")]
    assert [str(v) for v in check(bad, {"throttles": "predicted"}, arm)] == [
        "t step 0: throttles = 0, budget >= 1 (replayed peak 1778 MiB > high limit 512 MiB)",
        "t step 1: throttles = 2, budget 0 (high priority)",
        "t step 2: throttles = 1, budget 0 (replayed peak 20 MiB < high limit 512 MiB)"]


def test_policy_kills_and_worst_step_latency_budgets():
    recs = [{**_rec(i, 1, 0, latency=10.0), "policy_kills": 0} for i in range(5)]
    recs[3].update(policy_kills=1, latency_ms=20000.0)
    got = [str(v) for v in check(recs, {"policy_kills": 0, "latency_overhead_max_ms": 10000}, Arm("agentcgroup"))]
    assert got == ["t step 3: policy_kills = 1, budget <= 0 for the trace",
                   "t step 3: latency_overhead_ms = 20000, budget <= 10000 ms (latency_overhead_max_ms)"]


def test_a_step_that_waited_too_long_for_memory_breaks_its_stall_budget():
    recs = [{**_rec(i, 1, 0), "mem_stall_ms": s} for i, s in enumerate((0.0, 12.5, None, 3.0))]
    assert check(recs, {"mem_stall_max_ms": 20}, Arm("static-high")) == []
    recs[2].update(mem_stall_ms=108000.0, timed_out=True)            # held at memory.high until its timeout
    assert [str(v) for v in check(recs, {"mem_stall_max_ms": 10000}, Arm("static-high"))] == [
        "t step 2: mem_stall_ms = 108000, budget <= 10000 ms (mem_stall_max_ms: the step waited for memory, "
        "then timed out)"]
    assert check([{**r, "mem_stall_ms": None} for r in recs], {"mem_stall_max_ms": 0}, Arm("static-high")) == []
