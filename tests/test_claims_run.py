"""Claims end to end, in pytest subprocesses on real cgroups: a copy
of the shipped config with a claim turned around fails a test, `<module>::claims[<experiment>]`,
with the claim, its values and its verdict (in the counts, `-rA` and JUnit XML); and a config without
an experiment skips that experiment's tests naming the missing section."""
from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from helpers import cgroups_or_skip

pytestmark = pytest.mark.slow   # every test runs pytest subprocesses of exp1 or an exp3 stand-in

REPO = Path(__file__).resolve().parents[1]
CLAIM = '"static-toolcall.oom_kills > unlimited.oom_kills"'
TURNED = '"static-toolcall.oom_kills <= unlimited.oom_kills"'
# the one smoke trace with a step above the static per-step limit (512 MiB): pydicom step 32, 1778 MiB
TRACE = "claude-code/local/pydicom__pydicom-2065"


# exp1's claims in the copy: the shipped ones speak of the faithful smoke traces (no step reaches
# 512 MiB); these speak of TRACE, and two of them name arms the run leaves out
CLAIMS = f"""claims = [
  {CLAIM},
  "agentcgroup.oom_kills < static-toolcall.oom_kills",
  "agentcgroup.throttles_total >= 1",
]
"""


def _copy_config(root: Path, *, turn: bool) -> Path:
    text = (REPO / "experiments" / "agentcgroup.toml").read_text()
    exp1 = text.index("[experiments.exp1]")
    start = text.index("\nclaims = [", exp1) + 1
    end = text.index("\n]\n", start) + 3
    text = text[:start] + CLAIMS + text[end:]
    if turn:
        text = text.replace(CLAIM, TURNED)
    path = root / ("turned.toml" if turn else "shipped.toml")
    path.write_text(text.replace('traces = "../traces"', f'traces = "{REPO / "traces"}"'))
    return path


def _exp1(pytester, config: Path, *args):
    shutil.copy(REPO / "experiments" / "test_exp1_domain_mismatch.py", pytester.path)
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--agentcgroup-config", str(config), "--agentcgroup-out", "out",
        "--agentcgroup-arms", "unlimited,static-toolcall", "--agentcgroup-subset", TRACE,
        "--agentcgroup-time-scale", "0.01", "test_exp1_domain_mismatch.py", *args)


def test_a_claim_turned_around_fails_with_the_claim_its_values_and_its_verdict(pytester):
    cgroups_or_skip()
    shipped = _exp1(pytester, _copy_config(pytester.path, turn=False))
    shipped.assert_outcomes(passed=2, skipped=1)      # the claims' test: some claims' arms did not run
    assert shipped.ret == 0
    shipped.stdout.fnmatch_lines(["*agentcgroup claims*",
                                  "exp1: claim static-toolcall.oom_kills > unlimited.oom_kills: 1 > 0 -> holds"])
    # the arms this run left out: not checked, named, and not counted as a pass
    shipped.stdout.fnmatch_lines(["exp1: claim agentcgroup.oom_kills < static-toolcall.oom_kills: not checked: "
                                  "arm agentcgroup did not run in this session (deselected)"])

    turned = _copy_config(pytester.path, turn=True)
    for args in ((), ("-n", "2")):          # serially, and with the arms in two xdist workers
        junit = pytester.path / f"junit{len(args)}.xml"
        result = _exp1(pytester, turned, "-rA", f"--junitxml={junit}", *args)
        result.assert_outcomes(passed=2, failed=1)          # every test's budget held; the claims' test failed
        assert result.ret == pytest.ExitCode.TESTS_FAILED, args
        result.stdout.fnmatch_lines([
            "*_ claims[[]exp1[]] _*",
            "exp1: claims comparing arms, checked at the end of the session (claims: 1 refuted, 2 not checked):",
            "  claim static-toolcall.oom_kills <= unlimited.oom_kills: 1 <= 0 -> refuted"])
        result.stdout.fnmatch_lines(["exp1: claim static-toolcall.oom_kills <= unlimited.oom_kills: 1 <= 0 -> refuted",
                                     "*claims: 1 refuted, 2 not checked; a refuted or unmeasured claim fails its "
                                     "experiment's claims[[]...[]] test*",
                                     "FAILED test_exp1_domain_mismatch.py::claims[[]exp1[]] - exp1: claims comparing*",
                                     "*1 failed, 2 passed*"])
        [case] = [c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name") == "claims[exp1]"]
        assert case.get("classname") == "test_exp1_domain_mismatch"
        assert "1 <= 0 -> refuted" in case.find("failure").get("message") + (case.find("failure").text or "")


def test_a_config_without_an_experiment_skips_its_tests_naming_the_section(pytester):
    cgroups_or_skip()
    for f in (REPO / "experiments").glob("test_exp*.py"):
        shutil.copy(f, pytester.path)
    config = pytester.path / "only-exp1.toml"
    config.write_text(f'traces = "{REPO / "traces"}"\n[defaults]\ntime_scale = 0.05\n[arms.unlimited]\n'
                      '[experiments.exp1]\nsubset = "claude-code/haiku/xonsh__xonsh-3255"\narms = ["unlimited"]\n')
    base = ("-p", "no:cacheprovider", "--agentcgroup-config", str(config), "--agentcgroup-out", "out", "-rs")
    result = pytester.runpytest_subprocess(*base, "-k", "exp1")
    result.assert_outcomes(passed=1)
    assert result.ret == 0
    # every experiment's tests (but the harness's own per-step cost, which reads no config)
    result = pytester.runpytest_subprocess(*base, "--deselect", "test_exp4_overhead.py::test_exp4_step_overhead")
    result.assert_outcomes(passed=1, skipped=5)
    for name in ("exp2", "exp3", "exp4", "exp5"):
        result.stdout.fnmatch_lines([f"SKIPPED*experiment {name} is not in {config} (no [[]experiments.{name}[]] section)"])
    assert "error" not in result.stdout.str().lower().split("short test summary")[-1]


# A stand-in for exp3's test (the real one needs docker and chromium and takes ~40 s per arm): one
# test per arm through `agentcgroup_arm`, publishing its figures as experiments/test_exp3 does. What
# is under test is the harness: claims comparing arms of a one-test-per-arm experiment are checked
# at the end of the session on those figures, serially and from xdist workers.
EXP3_STANDIN = '''
import pytest
from pytest_agentcgroup.harness import experiment as harness_exp

pytestmark = pytest.mark.experiment(name="exp3")
PIDS_MAX_EVENTS = {"unlimited": 64, "static-high": 12}


def test_exp3_standin(agentcgroup_arm, request):
    if agentcgroup_arm == "static-env":
        pytest.skip("tenant A: no chromium here")
    harness_exp.publish(request, {"c_pids_max_events": PIDS_MAX_EVENTS[agentcgroup_arm], "a_oom_kills": None})
'''


def test_exp3_claims_comparing_arms_are_checked_at_the_end_of_the_session(pytester):
    text = (REPO / "experiments" / "agentcgroup.toml").read_text()
    first = '  "*.c_pids_max_events >= 1",\n'
    assert first in text
    cross = ('  "static-high.c_pids_max_events < unlimited.c_pids_max_events",\n'
             '  "static-high.c_pids_max_events > unlimited.c_pids_max_events",\n'
             '  "static-env.c_pids_max_events > unlimited.c_pids_max_events",\n'
             '  "static-high.a_oom_kills <= unlimited.a_oom_kills",\n')
    config = pytester.path / "exp3.toml"
    config.write_text(text.replace(first, first + cross))
    pytester.makepyfile(test_exp3_standin=EXP3_STANDIN)
    for args in ((), ("-n", "2")):
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", str(config),
                                               "--agentcgroup-arms", "unlimited,static-high,static-env", *args)
        result.assert_outcomes(passed=2, skipped=1, failed=1)     # failed: test_exp3_standin.py::claims[exp3]
        assert result.ret == pytest.ExitCode.TESTS_FAILED, args
        result.stdout.fnmatch_lines(["FAILED test_exp3_standin.py::claims[[]exp3[]] - exp3: claims comparing arms*"])
        result.stdout.fnmatch_lines([
            "*agentcgroup claims (across arms, at the end of the session)*",
            "exp3: claim static-high.c_pids_max_events < unlimited.c_pids_max_events: 12 < 64 -> holds",
            "exp3: claim static-high.c_pids_max_events > unlimited.c_pids_max_events: 12 > 64 -> refuted",
            "exp3: claim static-env.c_pids_max_events > unlimited.c_pids_max_events: not checked: "
            "arm static-env skipped: tenant A: no chromium here",
            "exp3: claim static-high.a_oom_kills <= unlimited.a_oom_kills: static-high.a_oom_kills, "
            "unlimited.a_oom_kills: no value measured -> not measured",
        ], consecutive=True)


def test_claims_that_cannot_be_checked_because_the_config_broke_fail_the_session(pytester):
    """Under xdist the controller loads the config at the end for the claims: a file broken meanwhile
    is said, and the session fails (the claims were not checked: no pass)."""
    config = pytester.path / "exp3.toml"
    config.write_text((REPO / "experiments" / "agentcgroup.toml").read_text())
    pytester.makepyfile(test_exp3_standin=EXP3_STANDIN + f'''

def test_zz_breaks_the_config():
    open({str(config)!r}, "a").write("[[[ not toml\\n")
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", str(config),
                                           "--agentcgroup-arms", "unlimited,static-high", "-n", "2")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"agentcgroup: claims not checked: {config}: not valid TOML*"])
