"""Issue 38: per-call limits computed before each tool call runs, never from its own peak: VPA's and
Autopilot's recommenders over the trace's earlier steps (limits/history.py), and the predictive
arm's model of command classes with folds that hold traces out (limits/model.py, predict.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_agentcgroup import cli
from pytest_agentcgroup import config as cfgmod
from pytest_agentcgroup.arms import Arm, ArmError
from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.limits import step_limits
from pytest_agentcgroup.limits.history import VPA, Window, vpa_bucket, vpa_bucket_start
from pytest_agentcgroup.limits.model import ALL, Model, ModelError, train, write
from pytest_agentcgroup.limits.predict import Predictor, accuracy
from pytest_agentcgroup.traces.classify import command_class
from pytest_agentcgroup.traces.ir import Measure, Profile, Step, Trace

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_MODEL = ROOT / "experiments" / "predict-recorded.json"


def vpa(**kw):
    return VPA(Arm.from_dict("v", {"limit_from": "vpa", **kw}).knobs)


def window(**kw):
    return Window(Arm.from_dict("w", {"limit_from": "window", **kw}).knobs)


def bucket_end(mib):
    return vpa_bucket_start(vpa_bucket(mib) + 1)


# -- VPA ----------------------------------------------------------------------------------------------
def test_vpas_buckets_are_its_exponential_memory_buckets():
    assert vpa_bucket_start(0) == 0 and vpa_bucket_start(1) == pytest.approx(1e7 / 2**20)      # 10^7 bytes wide
    assert vpa_bucket_start(2) - vpa_bucket_start(1) == pytest.approx(1.05e7 / 2**20)         # each 5 % wider
    for mib in (0.5, 9.6, 100.0, 2048.0):
        assert vpa_bucket_start(vpa_bucket(mib)) <= mib < bucket_end(mib) <= mib * 1.06 + 10


def test_vpa_starts_cold_then_takes_the_p90_plus_15_percent_never_below_its_floor():
    r = vpa(floor_mb=0, cold_start_mb=64)
    assert r.limit_mb() == 64                              # no earlier step: the stated cold start
    for peak in [20.0] * 9 + [400.0]:                      # 9 of 10 at 20 MiB: the p90 is 20's bucket
        r.observe(None, peak, False)
    assert r.limit_mb() == pytest.approx(bucket_end(20.0) * 1.15)
    r.observe(None, 400.0, False)                          # 9 of 11: below 0.9, the p90 moves to 400's
    assert r.limit_mb() == pytest.approx(bucket_end(400.0) * 1.15)
    floored = vpa()                                        # VPA's defaults: the 250 MiB floor
    floored.observe(None, 20.0, False)
    assert floored.limit_mb() == 250.0


def test_after_a_kill_vpas_next_limit_is_raised_by_its_oom_bump():
    r = vpa(floor_mb=0)
    for _ in range(19):                                    # so many small peaks that the bump's sample
        r.observe(None, 20.0, False)                       # alone cannot move the p90
    before = r.limit_mb()
    r.observe(before, before, True)                        # killed at its limit of ~24 MiB
    assert r.limit_mb() == pytest.approx(before + 100)     # max(x1.2, +100 MiB): +100 at this size
    r.observe(before + 100, 20.0, False)                   # the raise is the next step's only
    assert r.limit_mb() == pytest.approx(before)
    few = vpa(floor_mb=0)                                  # with few samples the bump's sample is the p90
    few.observe(None, 20.0, False)
    few.observe(30.0, 30.0, True)
    assert few.limit_mb() == pytest.approx(bucket_end(130.0) * 1.15)
    big = vpa(floor_mb=0)
    for _ in range(19):
        big.observe(None, 20.0, False)
    big.observe(1000.0, 1000.0, True)
    assert big.limit_mb() == pytest.approx(1200.0)         # x1.2 beats +100 MiB above 500 MiB


def test_vpas_half_life_lets_old_peaks_fade():
    steady, fading = vpa(floor_mb=0), vpa(floor_mb=0, half_life_steps=1)
    for peak in [400.0] * 5 + [20.0] * 5:
        steady.observe(None, peak, False)
        fading.observe(None, peak, False)
    assert steady.limit_mb() == pytest.approx(bucket_end(400.0) * 1.15)
    assert fading.limit_mb() == pytest.approx(bucket_end(20.0) * 1.15)


# -- Autopilot's window -------------------------------------------------------------------------------
def test_the_window_slides_over_the_last_n_peaks():
    w = window(window=3, cold_start_mb=32)
    assert w.limit_mb() == 32
    limits = []
    for peak in (100.0, 10.0, 12.0, 11.0):
        w.observe(None, peak, False)
        limits.append(w.limit_mb())
    assert limits == [100.0, 100.0, 100.0, 12.0]         # 100 leaves the window at the 4th peak
    p = window(window=4, statistic="percentile", percentile=0.5)
    for peak in (40.0, 10.0, 30.0, 20.0):
        p.observe(None, peak, False)
    assert p.limit_mb() == 20.0                           # nearest rank: the 2nd of 4
    floored = window(floor_mb=50, margin_fraction=0.1)
    floored.observe(None, 10.0, False)
    assert floored.limit_mb() == 50.0
    floored.observe(None, 100.0, False)
    assert floored.limit_mb() == pytest.approx(110.0)


def test_a_kill_counts_in_the_window_as_the_limit_reached_or_with_vpas_bump():
    plain, bumped = window(), window(oom_bump_ratio=1.2, oom_min_bump_mb=100)
    for w in (plain, bumped):
        w.observe(None, 5.0, False)
        w.observe(5.0, 5.0, True)
    assert plain.limit_mb() == 5.0 and bumped.limit_mb() == 105.0


# -- the knobs, checked at load -----------------------------------------------------------------------
@pytest.mark.parametrize("table, message", [
    ({"limit_from": "vpa", "window": 3}, "arms.a.window: a knob of limit_from = 'window'; this arm's limit_from is 'vpa'"),
    ({"limit_from": "vpa", "percentile": 1.5}, "arms.a.percentile: expected a number > 0 and <= 1, got 1.5"),
    ({"limit_from": "vpa", "half_life_steps": 0}, "arms.a.half_life_steps: expected a number > 0, got 0"),
    ({"limit_from": "vpa", "oom_bump_ratio": 0.5}, "arms.a.oom_bump_ratio: expected a number >= 1, got 0.5"),
    ({"limit_from": "window", "oom_bump_ratio": 1.2}, "arms.a: oom_bump_ratio and oom_min_bump_mb go together"),
    ({"limit_from": "window", "window": 0}, "arms.a.window: expected an integer >= 1, got 0"),
    ({"limit_from": "window", "statistic": "mean"}, "arms.a.statistic: expected one of max, percentile, got 'mean'"),
    ({"limit_from": "window", "percentile": 0.9}, "arms.a.percentile: the window's max takes no percentile"),
    ({"limit_from": "predict"}, "arms.a.model: expected the path of a model file"),
    ({"limit_from": "predict", "model": "m.json", "folds": "model"}, "arms.a.folds: expected one of task, repository"),
    ({"limit_from": "predict", "model": "m.json", "quantile": 0}, "arms.a.quantile: expected a number > 0"),
    ({"limit_from": "predict", "model": "m.json", "history": 1}, "arms.a.history: expected true or false, got 1"),
    ({"quantile": 0.9}, "arms.a.quantile: a knob of limit_from = 'predict'; this arm's limit_from is None"),
    ({"limit_from": "window", "scope": "trace"}, "arms.a.limit_from: a limit per step (window) goes on each step's"),
    ({"limit_from": "vpa", "policy": "agentcgroup"}, "arms.a: a policy arm with limit_from holds each step at its computed"),
    ({"limit_from": "vpa", "policy": "agentcgroup", "memory_max_mb": 512, "memory_high_mb": 64},
     "arms.a: a policy arm with limit_from holds each step"),
    ({"limit_from": "step_peak", "policy": "agentcgroup", "memory_max_mb": 512}, "arms.a.limit_from: a policy arm's"),
])
def test_a_bad_knob_is_one_message_naming_the_arm_and_key(table, message):
    with pytest.raises(ArmError) as err:
        Arm.from_dict("a", table)
    assert str(err.value).startswith(message), str(err.value)


def test_the_paper_configs_arms_and_their_model_path_relative_to_the_config(tmp_path):
    conf = cfgmod.load(ROOT / "experiments" / "exp1-paper.toml")
    v, w, p = conf.arms["vpa"], conf.arms["window"], conf.arms["predict"]
    assert v.knobs == {"percentile": 0.9, "margin_fraction": 0.15, "half_life_steps": None, "oom_bump_ratio": 1.2,
                       "oom_min_bump_mb": 100, "floor_mb": 250, "cold_start_mb": 250}
    assert (w.knobs["window"], w.knobs["statistic"]) == (10, "max")
    assert p.knobs["model"] == str(SHIPPED_MODEL) and p.margin_mb == 6 and p.knobs["history"] is True
    assert p.limits["quantile"] == 0.9 and p.limits["limit_from"] == "predict"
    stall = conf.arms["predict-stall"]                     # the same limits, as soft limits under a ceiling
    assert stall.knobs == p.knobs and (stall.policy, stall.memory_max_mb, stall.memory_high_mb) == ("agentcgroup", 2048, None)
    assert stall.rules["priorities"] == {"default": "low"} and stall.step_memory_max_mb(10.0) == 2048
    (tmp_path / "c.toml").write_text("[arms.p]\nlimit_from = 'predict'\nmodel = 'm.json'\n[experiments.exp1]\n"
                                     "[experiments.exp1.matrix]\nablations = [{ name = 'q', arms = { p = { quantile = 0.5 } } }]\n")
    swept = cfgmod.load(tmp_path / "c.toml").experiments["exp1"].variants(cfgmod.load(tmp_path / "c.toml").arms)
    assert swept[0][2]["p"].knobs == {"model": str(tmp_path / "m.json"), "quantile": 0.5, "folds": "task",
                                      "min_class_steps": 3, "history": False}


def test_only_the_placement_knows_a_per_call_limit():
    assert Arm.from_dict("v", {"limit_from": "vpa"}).step_memory_max_mb(100.0) is None
    assert Arm.from_dict("o", {"limit_from": "step_peak", "margin_mb": 6}).step_memory_max_mb(100.0) == 106.0


def test_a_placement_of_an_arm_with_per_call_limits_needs_them():
    with pytest.raises(ArmError, match="limit_from 'vpa' needs its limits"):
        ArmPlacement(Arm.from_dict("vpa", {"limit_from": "vpa"}), None, ())
    with pytest.raises(ArmError, match=r"arms.p.model: .*nope.json: no such model file"):
        step_limits(Arm.from_dict("p", {"limit_from": "predict", "model": "/nope.json"}), Trace("t", {}, ()))


# -- command classes ------------------------------------------------------------------------------------
@pytest.mark.parametrize("command, cls", [
    ("cd /testbed && python -m pytest tests/x.py -q 2>&1 | tail -20", "python -m pytest"),
    ("pip3 install -e . && echo done", "pip install"),
    ("python3.9 -m pip install -U pip", "pip install"),
    ("git -C /repo diff HEAD", "git diff"),
    ("grep -rn foo . | head", "grep"),
    ("python reproduce_issue.py", "python script"),
    ("python test_issue.py", "python test script"),
    ("python setup.py develop", "python setup.py develop"),
    ("cd /x", "cd"),
])
def test_a_steps_command_class_is_its_program_and_subcommand(command, cls):
    assert command_class(Step(0, "bash", {"command": command})) == cls
    assert command_class(Step(1, "edit", {})) == "edit"


# -- the model: recorded peaks only, folds that hold tasks and repositories out -----------------------
def step(i, command, peak, provenance="recorded"):
    return {"step_id": i, "tool": "bash", "args": {"command": command},
            "duration_ms": {"value": 1000.0, "provenance": "recorded"},
            "profile": {"peak_mb": {"value": peak, "provenance": provenance}}}


def corpus(tmp_path, traces: dict) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    entries = []
    for tid, steps in traces.items():
        f = tid.replace("/", "_") + ".json"
        (root / f).write_text(json.dumps({"schema": "agentcgroup-trace/1", "trace_id": tid,
                                          "source": {"format": "test"}, "steps": steps}))
        entries.append({"trace_id": tid, "file": f})
    (root / "manifest.json").write_text(json.dumps({"schema": "agentcgroup-manifest/1",
                                                    "subsets": {"all": list(traces)}, "traces": entries}))
    return root


TASKS = {f"m{m}/org{r}__repo{r}-{n}": [step(0, "git diff", 3.0 + r), step(1, "python -m pytest", 100.0 * r + n + m),
                                       step(2, "cat x", 50.0, "derived")]
         for m in (1, 2) for r in (1, 2, 3) for n in (1, 2)}


def test_the_model_keeps_recorded_peaks_and_groups_a_task_run_twice_in_one_fold(tmp_path):
    model = train(corpus(tmp_path, TASKS), "all", k=3)
    assert model["corpus"]["steps"] == 24 and model["corpus"]["provenance"] == "recorded"   # no derived cat
    assert all(c != "cat" for t in model["traces"].values() for c, *_ in t["steps"])
    held = {tid: name for name, f in model["folds"]["task"].items() for tid in f["traces"]}
    assert held["m1/org1__repo1-1"] == held["m2/org1__repo1-1"] and len(model["folds"]["task"]) == 3
    assert sorted(model["folds"]["repository"]) == ["org1/repo1", "org2/repo2", "org3/repo3"]
    assert model["folds"]["repository"]["org2/repo2"]["traces"] == sorted(t for t in TASKS if "repo2" in t)


def test_no_step_of_a_held_out_trace_reaches_its_folds_training(tmp_path):
    path = tmp_path / "m.json"
    write(train(corpus(tmp_path, TASKS), "all", k=3), path)
    model = Model(path)
    probe = Trace("m1/org2__repo2-1", {}, (Step(0, "bash", {"command": "python -m pytest"}),))
    for folds, group in (("task", "org2__repo2-1"), ("repository", "org2/repo2")):
        pred = Predictor(model, probe, quantile=1.0, folds=folds, min_class_steps=1)
        held = model.data["folds"][folds][pred.fold]["traces"]
        assert group in model.data["folds"][folds][pred.fold]["groups"]
        assert not set(held) & set(pred.table.training) and "m2/org2__repo2-1" in held
        # the held-out traces' peaks could change to anything: this fold's limits would not
        altered = json.loads(path.read_text())
        for tid in held:
            altered["traces"][tid]["steps"] = [[c, k, 9999.0, ms] for c, k, _, ms in altered["traces"][tid]["steps"]]
        (tmp_path / "alt.json").write_text(json.dumps(altered))
        alt = Predictor(Model(tmp_path / "alt.json"), probe, quantile=1.0, folds=folds, min_class_steps=1)
        assert alt.table == Predictor(model, probe, quantile=1.0, folds=folds, min_class_steps=1).table
        assert alt.limit_mb(probe.steps[0]) < 9999.0
    # under repository folds the largest pytest peak trained is repo 3's; repo 2 is not there
    pred = Predictor(model, probe, quantile=1.0, folds="repository", min_class_steps=1)
    assert pred.limit_mb(probe.steps[0]) == 100.0 * 3 + 2 + 2
    other = Predictor(model, Trace("x/elsewhere__other-9", {}, ()), quantile=1.0, folds="task", min_class_steps=1)
    assert other.fold == ALL and len(other.table.training) == len(TASKS)


def test_the_shipped_model_holds_each_trace_out_of_its_own_limits():
    model = Model(SHIPPED_MODEL)
    c = model.data["corpus"]
    assert (c["root"], c["subset"], c["provenance"]) == ("traces", "recorded", "recorded")
    # trained on the faithful traces only: the ones experiments' subsets take
    from pytest_agentcgroup.metrics.source_faithfulness import left_out
    from pytest_agentcgroup.traces.corpus import Corpus
    shipped = Corpus.open(ROOT / "traces")
    ids = shipped.ids("recorded")
    assert sorted(c["left_out"]) == sorted(t for t in ids if left_out(shipped.load(t)) is not None)
    assert c["traces"] == len(model.data["traces"]) == len(ids) - len(c["left_out"]) > 0
    for folds in ("task", "repository"):
        for tid, t in model.data["traces"].items():
            fold = model.fold_for(folds, t[folds])
            trained = set(model.training(folds, fold))
            assert tid not in trained and not any(model.data["traces"][x][folds] == t[folds] for x in trained)


def test_an_unseen_class_falls_back_to_its_kind_then_to_every_peak(tmp_path):
    path = tmp_path / "m.json"
    write(train(corpus(tmp_path, TASKS), "all", k=3), path)
    pred = Predictor(Model(path), Trace("new/x__y-1", {}, ()), quantile=1.0, folds="task", min_class_steps=1)
    assert pred.table.limit("git diff", "vcs") == (6.0, "class")
    assert pred.table.limit("git log", "vcs") == (6.0, "kind")          # vcs: git diff's peaks
    assert pred.table.limit("make", "build") == (100.0 * 3 + 2 + 2, "all")
    few = Predictor(Model(path), Trace("new/x__y-1", {}, ()), quantile=1.0, folds="task", min_class_steps=99)
    assert few.table.limit("git diff", "vcs")[1] == "all"


def test_accuracy_is_a_classifiers_per_class_and_in_all(tmp_path):
    path = tmp_path / "m.json"
    write(train(corpus(tmp_path, TASKS), "all", k=3), path)
    acc = accuracy(Model(path), quantile=1.0, folds="repository", min_class_steps=1)
    # held out by repository, repo 3's pytest peaks (up to 304) exceed what repos 1-2 trained (<= 204):
    # every repo-3 pytest step is missed, every git diff of repos 1-2 covered
    pytest_row, diff = acc["classes"]["python -m pytest"], acc["classes"]["git diff"]
    assert pytest_row["steps"] == 12 and pytest_row["covered"] == round(8 / 12, 4)
    assert diff["covered"] == round(8 / 12, 4) and acc["all"]["steps"] == 24


def test_with_history_a_classs_limit_never_falls_below_its_earlier_peaks_in_the_trace(tmp_path):
    path = tmp_path / "m.json"
    write(train(corpus(tmp_path, TASKS), "all", k=3), path)
    probe = Trace("new/x__y-1", {}, ())
    git = Step(0, "bash", {"command": "git diff"})
    plain = Predictor(Model(path), probe, quantile=1.0, folds="task", min_class_steps=1)
    hist = Predictor(Model(path), probe, quantile=1.0, folds="task", min_class_steps=1, history=True)
    for pred in (plain, hist):
        pred.observe(git, 50.0)                               # this trace's git diff reached 50 MiB
        pred.observe(Step(1, "bash", {"command": "ls"}), 80.0)  # another class: no bearing on git diff
    assert plain.limit_mb(git) == 6.0 and hist.limit_mb(git) == 50.0
    # in accuracy the trace's own earlier recorded peaks count the same way (never training data)
    base = accuracy(Model(path), quantile=1.0, folds="repository", min_class_steps=1)
    more = accuracy(Model(path), quantile=1.0, folds="repository", min_class_steps=1, history=True)
    assert more["history"] and more["all"]["covered"] >= base["all"]["covered"]


def test_the_train_command_writes_the_model_and_prints_its_held_out_accuracy(tmp_path, capsys):
    root = corpus(tmp_path, TASKS)
    out = tmp_path / "model.json"
    assert cli.main(["predict", "train", str(root), "--subset", "all", "-k", "3", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "24 recorded step peaks of 12 traces" in text and "python -m pytest" in text and "(all)" in text
    assert json.loads(out.read_text())["command"].startswith(f"agentcgroup predict train {root} --subset all -k 3")
    assert cli.main(["predict", "accuracy", str(out), "--folds", "repository", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["folds"] == "repository"
    (tmp_path / "bad.json").write_text('{"schema": "x"}')
    assert cli.main(["predict", "accuracy", str(tmp_path / "bad.json")]) == 1
    assert f"{tmp_path / 'bad.json'}: schema: expected 'agentcgroup-predict-model/1'" in capsys.readouterr().err
    with pytest.raises(ModelError, match="no such model file"):
        Model(tmp_path / "none.json")
    model = json.loads(out.read_text())
    fold = next(iter(model["folds"]["task"]))
    del model["folds"]["task"][fold]["groups"]
    (tmp_path / "nogroups.json").write_text(json.dumps(model))
    assert cli.main(["predict", "accuracy", str(tmp_path / "nogroups.json")]) == 1
    assert f"folds.task.{fold}.groups: expected a list of group names" in capsys.readouterr().err
    (tmp_path / "empty.json").write_text(json.dumps({**json.loads(out.read_text()), "traces": {}}))
    assert cli.main(["predict", "accuracy", str(tmp_path / "empty.json")]) == 1
    assert "traces: the model holds no trace to take limits from" in capsys.readouterr().err


def test_the_train_command_leaves_out_traces_whose_stored_verdict_is_not_faithful(tmp_path, capsys):
    from pytest_agentcgroup.metrics.source_faithfulness import RULE_VERSION
    root = corpus(tmp_path, TASKS)
    for tid, verdict in (("m1/org1__repo1-1", "fail"), ("m1/org2__repo2-1", "unverified")):
        f = root / (tid.replace("/", "_") + ".json")
        data = json.loads(f.read_text())
        data["source"] = {"format": "test", "profiled": {"host": "here"},
                          "faithfulness": {"rule": RULE_VERSION, "verdict": verdict}}
        f.write_text(json.dumps(data))
    out = tmp_path / "model.json"
    assert cli.main(["predict", "train", str(root), "--subset", "all", "-k", "3", "-o", str(out)]) == 0
    assert "left out 2 trace(s) whose stored faithfulness verdict is fail or unverified" in capsys.readouterr().out
    model = json.loads(out.read_text())
    assert sorted(model["corpus"]["left_out"]) == ["m1/org1__repo1-1", "m1/org2__repo2-1"]
    assert len(model["traces"]) == 10 and "m1/org1__repo1-1" not in model["traces"]
    assert cli.main(["predict", "train", str(root), "--subset", "all", "-k", "3", "-o", str(out),
                     "--include-unfaithful"]) == 0
    assert len(json.loads(out.read_text())["traces"]) == 12
