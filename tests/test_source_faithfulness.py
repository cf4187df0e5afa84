"""The one faithfulness rule (metrics/source_faithfulness.py) on hand-made steps and traces, and the
command that prints it (`agentcgroup traces faithfulness`) on shipped traces and bad input."""
from __future__ import annotations

import json
from pathlib import Path

from pytest_agentcgroup.cli import main
from pytest_agentcgroup.metrics import source_faithfulness as rule
from pytest_agentcgroup.traces.corpus import Corpus
from pytest_agentcgroup.traces.ir import Measure, Original, Outcome, Step, Trace, read_traces

REPO = Path(__file__).resolve().parents[1]
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && git add -A && git diff --cached"
DIFF = ("diff --git a/sympy/core/add.py b/sympy/core/add.py\nindex 1..2 100644\n--- a/sympy/core/add.py\n"
        "+++ b/sympy/core/add.py\n@@ -10,6 +10,7 @@ class Add:\n+    x = 1\n")


def step(i=0, *, got=("ok", 0), rec=("ok", 0), here_ms=100.0, rec_ms=None, tool="bash", cmd="true",
         recorded_output=None, output=None) -> Step:
    """A profiled step: ended `got` here in `here_ms`; its source recorded `rec` (None: nothing)
    and `rec_ms` (None: no duration)."""
    return Step(i, tool, {"command": cmd} if tool == "bash" else {"path": "/x"},
                duration_ms=Measure(here_ms, "recorded"), outcome=Outcome(*got) if got else None,
                original=Original(duration_ms=Measure(rec_ms, "recorded") if rec_ms is not None else None),
                recorded_outcome=Outcome(*rec) if rec else None, recorded_output=recorded_output, output=output)


def test_an_exit_mismatch_is_unfaithful_by_exit():
    v = rule.judge_step(step(got=("failed", 127), rec=("ok", 0)))
    assert (v.verdict, v.broke) == ("unfaithful", ("exit",)) and "exit 127, recorded exit 0" in v.why
    assert rule.judge_step(step(got=("failed", 1), rec=("failed", 1))).verdict == "faithful"
    # a status without an exit code (the source's "Error", a timeout) is compared by status
    assert rule.judge_step(step(got=("failed", 2), rec=("failed", None))).verdict == "faithful"
    assert rule.judge_step(step(got=("failed", None), rec=("timeout", None))).broke == ("exit",)


def test_an_edit_is_judged_by_applied_or_refused():
    assert rule.judge_step(step(tool="edit", got=("ok", 0), rec=("ok", None))).verdict == "faithful"
    assert rule.judge_step(step(tool="edit", got=("failed", 1), rec=("ok", None))).broke == ("exit",)
    assert rule.judge_step(step(tool="edit", got=("failed", 1), rec=("failed", None))).verdict == "faithful"


def test_a_step_23x_slower_than_recorded_is_unfaithful_by_duration_and_the_bound_has_slack():
    # the xonsh case: 41.9 s here, 1.8 s recorded, the same exit
    slow = step(got=("failed", 1), rec=("failed", 1), here_ms=41934.0, rec_ms=1771.0)
    v = rule.judge_step(slow)
    assert (v.verdict, v.broke) == ("unfaithful", ("duration",)) and "bound 6.3 s" in v.why
    # 3 x 0.1 s + 1 s = 1.3 s: 1.2 s is within, 1.4 s is not; the factor and slack are parameters
    assert rule.judge_step(step(here_ms=1200.0, rec_ms=100.0)).verdict == "faithful"
    assert rule.judge_step(step(here_ms=1400.0, rec_ms=100.0)).broke == ("duration",)
    assert rule.judge_step(step(here_ms=1400.0, rec_ms=100.0), factor=5.0).verdict == "faithful"
    assert rule.judge_step(step(here_ms=1400.0, rec_ms=100.0), slack_s=2.0).verdict == "faithful"
    # both rules broken: counted under each
    assert rule.judge_step(step(got=("failed", 2), here_ms=9000.0, rec_ms=100.0)).broke == ("exit", "duration")


def test_the_output_rule_where_the_source_records_output_but_no_duration():
    # first line, digits and blanks normalised
    assert rule.judge_step(step(recorded_output="total 120\nx", output="total  96\ny")).verdict == "faithful"
    v = rule.judge_step(step(recorded_output="hello\n", output="bash: hello: command not found"))
    assert v.broke == ("output",) and "first line" in v.why
    # pytest's summary counts, where both show one
    ok = "== test session starts ==\n...\n===== 2 failed, 10 passed in 3.10s ====="
    assert rule.judge_step(step(recorded_output=ok, output=ok.replace("3.10s", "9.87s"))).verdict == "faithful"
    v = rule.judge_step(step(recorded_output=ok, output=ok.replace("2 failed, 10", "12")))
    assert v.broke == ("output",) and "pytest counts" in v.why
    # no output kept here: (b) not checked, judged by (a), and said so
    v = rule.judge_step(step(recorded_output="hello"))
    assert v.verdict == "faithful" and v.unchecked
    # a recorded duration takes precedence over the output
    assert rule.judge_step(step(rec_ms=100.0, recorded_output="a", output="b")).verdict == "faithful"


def test_the_submit_step_is_compared_by_its_recorded_diff():
    submit = step(cmd=SUBMIT, rec=None, recorded_output=DIFF, got=("ok", 0), output=DIFF + "more\n")
    assert rule.recorded_outcome(submit) == Outcome("ok", 0)
    assert rule.judge_step(submit).verdict == "faithful"
    # git failing here (no repository): an exit mismatch, not unknown
    assert rule.judge_step(step(cmd=SUBMIT, rec=None, recorded_output=DIFF, got=("failed", 128))).broke == ("exit",)
    # another file changed: the output rule
    other = DIFF.replace("sympy/core/add.py", "sympy/core/mul.py")
    v = rule.judge_step(step(cmd=SUBMIT, rec=None, recorded_output=DIFF, output=other))
    assert v.broke == ("output",) and v.why.startswith("diff:")
    assert rule.judge_step(step(cmd=SUBMIT, rec=None, recorded_output=DIFF, output="")).broke == ("output",)


def test_unknown_steps_are_counted_apart_and_never_faithful():
    v = rule.judge_step(step(rec=None))
    assert v.verdict == "unknown"
    # but a step whose outcome is unknown and that ran far longer than recorded is unfaithful
    assert rule.judge_step(step(rec=None, here_ms=41934.0, rec_ms=1771.0)).verdict == "unfaithful"
    # a step not replayed here is not counted at all
    assert rule.judge_step(step(got=None)) is None


def trace(steps) -> Trace:
    return Trace("t/x", {"format": "test", "profiled": {"complete": True}}, tuple(steps))


def test_trace_verdicts_pass_fail_and_unverified():
    good = [step(i) for i in range(5)]
    assert rule.judge_trace(trace(good)).verdict == "pass"
    # one unfaithful of 5 is 20 %: passes at 0.2, fails at 0.1
    one = good[:4] + [step(4, got=("failed", 1))]
    assert rule.judge_trace(trace(one)).verdict == "pass"
    v = rule.judge_trace(trace(one), threshold=0.1)
    assert v.verdict == "fail" and "first: step 4" in v.why and v.by_rule == {"exit": 1, "duration": 0, "output": 0}
    # fewer than 5 compared steps: unverified, however faithful
    v = rule.judge_trace(trace(good[:4]))
    assert (v.verdict, v.compared) == ("unverified", 4) and "fewer than 5" in v.why
    # more unknown than compared: unverified
    v = rule.judge_trace(trace(good + [step(i, rec=None) for i in range(5, 11)]))
    assert (v.verdict, v.compared, v.faithful, v.unknown) == ("unverified", 5, 5, 6)
    assert rule.judge_trace(trace([step(0, got=None)])).verdict == "unverified"
    stored = rule.judge_trace(trace(one)).stored()
    assert stored["rule"] == rule.RULE_VERSION and stored["compared"] == 5 and stored["unfaithful_exit"] == 1


def test_factor_shift_counts_the_steps_and_traces_that_change_verdict():
    # 2.2 s where 0.5 s was recorded: within 3 x 0.5 + 1 s, beyond 2 x 0.5 + 1 s
    steps = [step(i) for i in range(4)] + [step(4, here_ms=2200.0, rec_ms=500.0)]
    t = trace(steps)
    assert rule.judge_trace(t, threshold=0.0).verdict == "pass"            # 2.2 s <= 3 x 0.5 + 1 = 2.5 s
    shift = rule.factor_shift([t], 2.0, threshold=0.0)                       # 2 x 0.5 + 1 = 2.0 s < 2.2 s
    assert shift == {"factor": 2.0, "steps_changed": 1, "traces_changed": 1, "traces_passing": 0}


# ---------------------------------------------------------------------------------------------
# agentcgroup traces faithfulness

SHIPPED = ["mini-swe-agent/sympy__sympy-20154.json", "claude-code-recorded/haiku/xonsh__xonsh-3255.json",
           "openhands-rows/PyPSA__linopy-79/1.json"]


def _count_by_reading(path: Path) -> dict:
    """The counts of one trace, read straight from its JSON (not through the rule's module)."""
    d = json.loads(path.read_text())
    (trace,) = read_traces(path)
    parsed = {x.step_id: x for x in trace.steps}
    compared = faithful = unknown = 0
    for s in d["steps"]:
        if s.get("outcome") is None:
            continue
        rec = s.get("recorded_outcome")
        if rec is None and "COMPLETE_TASK_AND_SUBMIT" in s["args"].get("command", "") \
                and (s.get("recorded_output") or "").startswith("diff --git"):
            rec = {"status": "ok", "exit_code": 0}
        o = s["outcome"]
        bad = False
        if rec is not None:
            if s["tool"] in ("edit", "read", "search", "browser"):
                bad = (o["status"] == "ok") != (rec["status"] == "ok")
            elif rec["exit_code"] is not None and o["exit_code"] is not None:
                bad = rec["exit_code"] != o["exit_code"]
            else:
                bad = rec["status"] != o["status"]
        orig = ((s.get("original") or {}).get("duration_ms") or {}).get("value")
        if orig is not None and s["duration_ms"]["value"] > 3 * orig + 1000:
            bad = True
        elif orig is None and s.get("recorded_output") is not None and s.get("output") is not None:
            # the output comparison itself is the rule's (its own tests above); the counting is read here
            bad = bad or not rule.output_agrees(parsed[s["step_id"]], s["recorded_output"], s["output"])[0]
        if bad:
            compared += 1
        elif rec is None:
            unknown += 1
        else:
            compared += 1
            faithful += 1
    return {"compared": compared, "faithful": faithful, "unknown": unknown}


def test_the_cli_prints_the_counts_the_files_hold(capsys):
    files = [REPO / "traces" / f for f in SHIPPED]
    assert main(["traces", "faithfulness", *map(str, files)]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()[:1]
            and "/" in line.split()[0]}
    want_total = {"compared": 0, "faithful": 0, "unknown": 0}
    for f in files:
        want = _count_by_reading(f)
        (t,) = read_traces(f)
        got = rows[t.trace_id]
        assert (int(got[0]), int(got[1]), int(got[5])) == (want["compared"], want["faithful"], want["unknown"]), \
            t.trace_id
        for k in want_total:
            want_total[k] += want[k]
        # the verdict the tool command stored with the profile is the one printed
        assert got[6] == t.source["faithfulness"]["verdict"]
    assert (f"total: 3 trace(s); {want_total['compared']} compared step(s), {want_total['faithful']} faithful"
            in out)
    assert "at factor 2x:" in out and "at factor 5x:" in out


def test_the_cli_reads_a_subset_and_prints_json(capsys):
    assert main(["traces", "faithfulness", str(REPO / "traces"), "--subset", "recorded-here", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["total"]["traces"] == 5 and res["rule"] == rule.RULE_VERSION
    # recorded here: its source is this machine, so nothing is recorded to be faithful to
    assert {t["verdict"] for t in res["traces"]} == {"unverified"} and res["total"]["compared"] == 0


def test_bad_input_is_one_clear_message(tmp_path, capsys):
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    assert main(["traces", "faithfulness", str(bad)]) == 1
    err = capsys.readouterr().err
    assert str(bad) in err and "trace_id" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["traces", "faithfulness", str(tmp_path / "none.json")]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    assert main(["traces", "faithfulness", str(REPO / "traces"), "--subset", "no-such-subset"]) == 1
    assert "no-such-subset" in capsys.readouterr().err
    assert main(["traces", "faithfulness", str(bad), "--factor", "-1"]) == 1
    assert "--factor" in capsys.readouterr().err


def test_the_shipped_profiled_traces_store_the_verdict_the_rule_gives():
    corpus = Corpus.open(REPO / "traces")
    for tid in corpus.ids("recorded"):
        t = corpus.load(tid)
        assert t.source["faithfulness"] == rule.judge_trace(t).stored(), tid
