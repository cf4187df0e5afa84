"""exp2's gate both ways, on the real observer and controllers: in one run, the in-kernel controller
holds its claim (`ran_on_lower_pct <= 1`) and the same claim on a controller slowed on purpose (its
SIGSTOP sent 2 ms after the reclaim began, `ebpf_delayed_2000us`) is refuted, failing the test with
the claim, its values and its verdict."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from helpers import cgroups_or_skip

pytestmark = pytest.mark.slow   # a pytest subprocess of exp2: 2 x 50 bursts

REPO = Path(__file__).resolve().parents[1]


def test_the_gate_passes_the_in_kernel_stop_and_fails_a_controller_two_ms_slower(pytester):
    cgroups_or_skip()
    from pytest_agentcgroup.bpf import controller, features, task_stop
    why = features.missing(*controller.NEEDS, *task_stop.NEEDS)
    if why:
        pytest.skip(why)
    text = (REPO / "experiments" / "agentcgroup.toml").read_text()
    exp2 = re.search(r"(?ms)^\[experiments\.exp2\]\n.*?^claims = \[\n.*?^\]\n", text)
    assert exp2, "the shipped [experiments.exp2] arms and claims are gone"
    text = text.replace(exp2.group(0), (
        '[experiments.exp2]\nkind = "timescale"\narms = ["ebpf_kernel", "ebpf_delayed_2000us"]\n'
        'claims = ["ebpf_kernel.ran_on_lower_pct <= 1", "ebpf_delayed_2000us.ran_on_lower_pct <= 1"]\n'))
    assert "count = 100 " in text
    text = text.replace("count = 100 ", "count = 50 ").replace('traces = "../traces"', f'traces = "{REPO / "traces"}"')
    config = pytester.path / "gate.toml"
    config.write_text(text)
    shutil.copy(REPO / "experiments" / "test_exp2_timescale.py", pytester.path)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--agentcgroup-config", str(config),
                                           "--agentcgroup-out", "out", "test_exp2_timescale.py")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert re.search(r"claim ebpf_kernel\.ran_on_lower_pct <= 1: 0 <= 1 -> holds", out), out[-3000:]
    slowed = re.search(r"claim ebpf_delayed_2000us\.ran_on_lower_pct <= 1: ([0-9.]+) <= 1 -> refuted", out)
    assert slowed and float(slowed.group(1)) > 1, out[-3000:]
    # the table still prints the full onset -> stop figures for both
    assert re.search(r"(?m)^ebpf_kernel +50 +0 ", out) and re.search(r"(?m)^ebpf_delayed_2000us +\d+ ", out), out[-3000:]
