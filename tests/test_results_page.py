"""The Markdown results page (`agentcgroup report --markdown`) and the published pages (`--publish`):
from a real run of the synthetic study, its provenance (run.json, complete.json) and the same
figures as its summary.json; from handwritten runs, one message for what is missing or malformed."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

pytest.importorskip("pandas", reason="pandas is not installed (the `report` extra)")
pytest.importorskip("matplotlib", reason="matplotlib is not installed (the `report` extra)")

from helpers import EXP_MODULE, cgroups_or_skip, step_rec, write_results, write_study  # noqa: E402

from pytest_agentcgroup import cli  # noqa: E402
from pytest_agentcgroup.reports.markdown import SUMMARY_TABLES  # noqa: E402

LABEL_KEY = {label: key for _, cols in SUMMARY_TABLES for key, label in cols}


def tables(page: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every pipe table of a Markdown page: (headings, rows of cells), escaped pipes kept in their cell."""
    out, block = [], []
    for line in [*page.splitlines(), ""]:
        if line.startswith("|"):
            block.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]])
        elif block:
            out.append((block[0], block[2:]))
            block = []
    return out


def facts(page: str) -> dict[str, str]:
    """The page's `- **label**: value` lines."""
    return dict(re.findall(r"^- \*\*(.+?)\*\*: (.*)$", page, re.M))


def per_arm(page: str) -> dict[str, dict[str, str]]:
    """arm -> {summary key: cell} over the page's per-arm tables (headings `label (unit, provenance)`)."""
    arms: dict[str, dict[str, str]] = {}
    for heads, rows in tables(page.split("## Per arm")[1].split("\n## ")[0]):
        keys = [LABEL_KEY.get(h.split(" (")[0]) for h in heads]
        for row in rows:
            cells = arms.setdefault(row[heads.index("arm")].strip("`"), {})
            cells.update({k: c for k, c in zip(keys, row) if k})
    return arms


def test_the_page_of_a_real_run_names_its_run_and_holds_its_summary(pytester):
    cgroups_or_skip()
    config = write_study(pytester.path)
    pytester.makepyfile(test_exp1=EXP_MODULE)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                  "--agentcgroup-out", "out").assert_outcomes(passed=4)
    run = (pytester.path / "out" / "latest").resolve()
    recorded = json.loads((run / "run.json").read_text())
    args = recorded["pytest_args"]                  # pytester puts its --basetemp first
    assert args[0].startswith("--basetemp=") and args[1:] == ["-p", "no:cacheprovider", "--agentcgroup-config",
                                                              "study.toml", "--agentcgroup-out", "out"]
    assert (recorded["run"], recorded["config"]) == (f"out/{run.name}", "study.toml")
    assert recorded["host"]["kernel"]["release"] == os.uname().release

    page_dir = pytester.path / "page"
    assert cli.main(["report", str(pytester.path / "out"), "-o", str(page_dir), "--markdown",
                     "--config", str(config), "--title", "The synthetic study"]) == 0
    page = (page_dir / "results.md").read_text()
    assert page.startswith("# The synthetic study\n")
    said = facts(page)
    assert said["run directory"] == str(run).replace("_", "\\_")
    assert said["started"] == f"{recorded['started']} (UTC)"
    assert said["finished"].endswith("pytest exit status 0 (all tests passed)")
    assert said["command"] == f"`pytest {' '.join(args)}`"
    assert said["kernel"].startswith(os.uname().release.replace("_", "\\_"))
    assert said["cgroup layout"].startswith(cgroups_or_skip().mode)
    assert said["config"].startswith("study.toml (sha256 ")
    assert said["arm limits on the figures"].endswith("the file the run read (the same sha256)")
    # the per-arm tables hold every number of summary.json, as the file spells it
    summary = json.loads((run / "summary.json").read_text())
    shown = per_arm(page)
    assert set(shown) == {s["config"] for s in summary} == {"unlimited", "static-env", "static-toolcall", "static-high"}
    for s in summary:
        for key, value in s.items():
            if key not in ("experiment", "config", "seed", "params"):
                assert shown[s["config"]][key] == ("—" if value is None else json.dumps(value)), (s["config"], key)
    assert shown["static-toolcall"]["oom_kills"] == "1"
    # every figure is beside the page, and the page shows every one
    pngs = sorted(p.name for p in (page_dir / "figures").iterdir())
    assert pngs == ["kills_breaches.png", "latency_cdf.png", "memory_synthetic_oom-once.png"]
    assert sorted(re.findall(r"^```\{figure\} figures/(\S+)$", page, re.M)) == pngs
    assert (page_dir / "runs.csv").is_file() and "{download}`runs.csv <runs.csv>`" in page

    # published: the same page from a list, under pages/<name>/; a run that did not finish is refused
    listing = pytester.path / "published.toml"
    listing.write_text(f'[[run]]\nname = "study"\nrun = "out/{run.name}"\ntitle = "Study"\nconfig = "study.toml"\n')
    assert cli.main(["report", "--publish", str(listing)]) == 0
    published = (pytester.path / "pages" / "study" / "results.md").read_text()
    assert published.startswith("# Study\n") and per_arm(published) == shown
    assert facts(published)["run directory"] == str(pytester.path / "out" / run.name).replace("_", "\\_")
    (run / "complete.json").unlink()
    assert cli.main(["report", str(run), "-o", str(page_dir), "--markdown"]) == 0
    assert facts((page_dir / "results.md").read_text())["finished"].startswith("no: the run has no complete.json")
    assert cli.main(["report", "--publish", str(listing)]) == 1


def test_a_run_missing_files_is_one_message(tmp_path, capsys):
    bare = write_results(tmp_path / "r", [step_rec()])           # metrics.jsonl alone: no summary.json
    assert cli.main(["report", str(bare), "-o", str(tmp_path / "out"), "--markdown"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"agentcgroup report: {bare}: no summary.json — a results page is made from a run's metrics.jsonl, "
        "summary.json (a run writes summary.json as its session ends, complete.json once it ended, run.json when "
        "it starts)"]
    assert not (tmp_path / "out").exists(), "nothing is written for a run that cannot be read"
    (tmp_path / "empty").mkdir()
    assert cli.main(["report", str(tmp_path / "empty"), "--markdown"]) == 1
    assert "not a results directory" in capsys.readouterr().err
    # a published run must also be finished and say how it was made: every missing file named at once
    (bare / "summary.json").write_text(json.dumps([{"experiment": "exp1", "config": "unlimited", "oom_kills": 0}]))
    listing = tmp_path / "published.toml"
    listing.write_text('[[run]]\nname = "r"\nrun = "r"\ntitle = "R"\n')
    assert cli.main(["report", "--publish", str(listing)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"agentcgroup report: {bare}: no run.json, complete.json — ")
    (bare / "summary.json").write_text("[1, 2]")
    assert cli.main(["report", str(bare), "--markdown"]) == 1
    assert "summary.json: expected a list of objects with a `config`" in capsys.readouterr().err


@pytest.mark.parametrize("listing, message", [
    ("", "expected one [[run]] table or more"),
    ('[[run]]\nname = "a"\nrun = "r"\n', "run 1: missing key(s) title"),
    ('[[run]]\nname = "A b"\nrun = "r"\ntitle = "t"\n', "run 1: name 'A b': lower-case letters, digits and '-' only"),
    ('[[run]]\nname = "a"\nrun = "r"\ntitle = "t"\ncolour = "red"\n', "run 1: unknown key colour"),
    ('[[run]]\nname = "a"\nrun = "r"\ntitle = "t"\ntraces = "x"\n', "run 1: traces: expected a list of trace ids"),
    ('[[run]]\nname = "a"\nrun = "r"\ntitle = "t"\n[[run]]\nname = "a"\nrun = "r"\ntitle = "u"\n',
     "run 2: name 'a' is used twice"),
    ('[[run]\n', "not valid TOML"),
    ('[[run]]\nname = "a"\nrun = "nowhere"\ntitle = "t"\n', "nowhere: no such results directory"),
])
def test_a_bad_published_list_is_one_message_naming_file_and_entry(tmp_path, capsys, listing, message):
    (tmp_path / "published.toml").write_text(listing)
    assert cli.main(["report", "--publish", str(tmp_path / "published.toml")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0] and str(tmp_path) in err[0], err


@pytest.mark.parametrize("args, message", [
    ([], "give a run or results directory (DIR), or --publish FILE"),
    (["r", "--publish", "p.toml"], "--publish takes its runs and their settings from FILE, not from DIR"),
    (["r", "--markdown", "--characterize", "t"], "--characterize makes a page of the HTML report"),
    (["r", "--title", "x"], "--title is the --markdown page's"),
])
def test_report_usage_errors(capsys, args, message):
    assert cli.main(["report", *args]) == 2
    assert message in capsys.readouterr().err


def test_hostile_trace_ids_stay_text_in_their_cell(tmp_path):
    hostile = '<img src=x onerror="alert(1)">|a__b`c'
    run = write_results(tmp_path / "r", [step_rec(trace_id=hostile)])
    (run / "summary.json").write_text(json.dumps([{"experiment": "exp1", "config": "unlimited", "oom_kills": 0}]))
    assert cli.main(["report", str(run), "-o", str(tmp_path / "out"), "--markdown"]) == 0
    page = (tmp_path / "out" / "results.md").read_text()
    heads, rows = tables(page.split("## Per test")[1])[0]
    assert len(rows) == 1 and len(rows[0]) == len(heads)
    assert rows[0][0] == f"`` {hostile} ``", "a code span: no HTML, no emphasis, the pipe escaped"
    caption = page.split("## Figures")[1].split("\n## ")[0]
    assert f"\\<img src=x onerror=\"alert(1)\"\\>\\|a\\_\\_b\\`c: each step" in caption, "escaped in the caption"
    outside = [line.replace(f"`` {hostile.replace('|', chr(92) + '|')} ``", "") for line in page.splitlines()
               if not line.startswith(":alt:")]          # an option value: an attribute, escaped by docutils
    assert not [line for line in outside if re.search(r"(?<!\\)<img", line)], "no raw HTML anywhere else"


def test_the_page_says_which_traces_each_fold_tested_and_how_many_trained_it(tmp_path):
    """A predict arm's steps carry the fold that held their trace out: the page lists the traces per
    fold and the size of its training set (the model the config names)."""
    from pytest_agentcgroup.limits.model import Model
    root = Path(__file__).resolve().parents[1]
    model = Model.load(root / "experiments" / "predict-recorded.json")
    recs = [step_rec(trace_id=t, config="predict", step_id=i, limit_fold=f, step_limit_mb=50.0)
            for t, f in (("t/a", "task-2"), ("t/b", "task-2"), ("t/c", "task-4")) for i in range(2)]
    recs += [step_rec(trace_id="t/a", config="unlimited", step_id=i) for i in range(2)]
    run = write_results(tmp_path / "r", recs)
    (run / "summary.json").write_text(json.dumps([{"experiment": "exp1", "config": c, "oom_kills": 0}
                                                  for c in ("predict", "unlimited")]))
    config = root / "experiments" / "exp1-paper.toml"
    assert cli.main(["report", str(run), "-o", str(tmp_path / "page"), "--markdown", "--config", str(config)]) == 0
    page = (tmp_path / "page" / "results.md").read_text()
    section = page.split("## Held-out folds", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows == [
        f"| `predict` | `task-2` | 2 | {len(model.training('task', 'task-2'))} of predict-recorded.json (by task) | `t/a`, `t/b` |",
        f"| `predict` | `task-4` | 1 | {len(model.training('task', 'task-4'))} of predict-recorded.json (by task) | `t/c` |"]
    assert cli.main(["report", str(run), "-o", str(tmp_path / "bare"), "--markdown"]) == 0
    assert "(no config given)" in (tmp_path / "bare" / "results.md").read_text()
