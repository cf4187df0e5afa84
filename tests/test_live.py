"""The live runtime (live/): an agent's tool calls in cgroups of their own under a session's, with real
cgroups and real processes — a normal call, a call killed at its limit and the session going on,
calls at once, what a call leaves running, the trace it writes (valid, its secrets gone), the
sandbox, and `agentcgroup exec` end to end. The note an agent gets is one function (notes.py), the
replay's kill reasons use it too."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import cgroups_or_skip
from pytest_agentcgroup.arms import Arm
from pytest_agentcgroup.live import AgentSession, SessionError
from pytest_agentcgroup.live.redact import MARKER, redact
from pytest_agentcgroup.metrics.faithfulness import arm_kill
from pytest_agentcgroup.notes import background_note, stopped_note
from pytest_agentcgroup.traces.ir import read_traces

REPO = Path(__file__).resolve().parents[1]
HOG = "python3 -c 'b = bytearray(200 * 1024 * 1024); print(len(b))'"
CANARY = "ghp_CanaryCanaryCanaryCanary0123456789"


def test_the_note_says_what_stopped_the_call_and_at_which_limit():
    assert stopped_note("memory", limit_mb=512, used_mb=512.2) == (
        "stopped: this tool call was killed at its 512 MiB memory limit (it had used 512 MiB); "
        "the rest of the session is unaffected")
    shared = stopped_note("memory", limit_mb=1024, scope="trace")
    assert "the session's 1024 MiB memory limit, shared by all its tool calls" in shared
    assert "unaffected" not in shared                # a shared limit may have stopped other calls too
    late = stopped_note("timeout", timeout_s=30, stall_ms=1500, background=2)
    assert "past its 30 s timeout (1.5 s of it stalled at a memory limit)" in late and "2 background processes" in late
    assert "(held at a memory limit 2 times)" in stopped_note("timeout", timeout_s=1, stall_ms=3, held=2)
    assert background_note(0) is None and "1 background process " in background_note(1)
    with pytest.raises(ValueError, match="unknown cause 'oom'"):
        stopped_note("oom")


def test_the_replay_words_an_arm_kill_with_the_same_note():
    class Replayed:
        counters = {"oom_kills": 1, "peak_bytes": 48 * 1024 * 1024}
    assert arm_kill(Replayed) == stopped_note("memory", used_mb=48)


def test_secrets_are_replaced_by_the_marker():
    text = ("curl -H 'Authorization: Bearer abc.def-1' --token tok123 --password=pw1 password=hunter2 "
            f"sk-ant-0123456789abcdefghij AKIAABCDEFGHIJKLMNOP {CANARY} value-from-env-42 keep me")
    out = redact(text, ["value-from-env-42", "short"])
    for secret in ("abc.def-1", "tok123", "pw1", "hunter2", "sk-ant", "AKIA", CANARY, "value-from-env-42"):
        assert secret not in out, (secret, out)
    assert out.count(MARKER) == 8 and out.endswith("keep me") and "--token " in out and "Bearer " in out
    assert redact("a short value stays", ["short"]) == "a short value stays"


@pytest.fixture
def host():
    return cgroups_or_skip()


def session_cgroups(host) -> list[Path]:
    return sorted(host.unified.glob("agentcgroup-live-*"))


def test_a_call_runs_in_its_own_cgroup_and_reports_exit_output_duration_and_peak(host, tmp_path):
    with AgentSession(Arm("small", memory_max_mb=64), workspace=tmp_path) as s:
        name = Path(s.described_cgroup["paths"]["unified"]).name
        r = s.run("python3 -c 'b = bytearray(20 * 1024 * 1024); print(\"hello\")'; cat /proc/self/cgroup; exit 3")
    assert r.exit_code == 3 and r.output.startswith("hello\n") and not r.killed and r.note is None
    assert f"/{name}/s0\n" in r.output                                        # its own cgroup
    assert 15 <= r.peak_mb <= 64 and r.duration_ms > 0 and r.oom_kills == 0 and r.cwd == str(tmp_path)
    assert r.limit_mb == 64 and "memory_max_mb = 64 on each call's cgroup" in r.limit_why
    assert not (host.unified / name).exists()                                 # removed with the session


def test_a_call_killed_at_its_limit_gets_the_note_and_the_next_call_runs(host, tmp_path):
    with AgentSession(Arm("small", memory_max_mb=64), workspace=tmp_path) as s:
        killed = s.run(HOG)
        after = s.run("echo still here")
    assert killed.killed and killed.kill_cause == "memory" and killed.oom_kills >= 1
    assert killed.exit_code == 137 and killed.note == stopped_note("memory", limit_mb=64, used_mb=killed.peak_mb)
    assert killed.output.rstrip("\n").endswith(killed.note) and "209715200" not in killed.output
    assert after.exit_code == 0 and after.output == "still here\n" and not after.killed and after.call_id == 1


def test_calls_at_once_each_get_a_cgroup_under_the_one_session_limit(host, tmp_path):
    arm = Arm("shared", scope="trace", memory_max_mb=96)
    results = {}

    def call(i):
        results[i] = s.run(f"sleep 0.6; cat /proc/self/cgroup; echo call {i}")
    with AgentSession(arm, workspace=tmp_path) as s:
        paths = s.described_cgroup["paths"]
        limit = int(Path(paths["memory"], "memory.limit_in_bytes").read_text())
        t0 = time.monotonic()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
    assert limit == 96 * 1024 * 1024                 # the trace-scope limit is on the session's cgroup
    leaves = {next(line for line in r.output.splitlines() if line.startswith("0::")) for r in results.values()}
    assert len(leaves) == 3 and all(f"/{Path(paths['unified']).name}/s" in x for x in leaves), leaves
    assert all(r.exit_code == 0 for r in results.values()) and wall < 1.6, wall      # they ran at once
    assert all("on the session's cgroup, shared by its calls" in r.limit_why for r in results.values())


def test_what_a_call_leaves_running_is_stopped_at_its_end_and_counted(host, tmp_path):
    with AgentSession(Arm("small", memory_max_mb=64), workspace=tmp_path) as s:
        r = s.run("sleep 300 & echo $!")
    pid = int(r.output.splitlines()[0])
    assert r.exit_code == 0 and r.background_killed == 1 and not r.killed
    assert r.note == background_note(1) and r.output.rstrip("\n").endswith(r.note)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_the_trace_written_validates_and_carries_no_secret(host, tmp_path):
    out = tmp_path / "trace.json"
    with AgentSession(Arm("small", memory_max_mb=64), workspace=tmp_path, trace_out=out) as s:
        s.run(f"echo {CANARY}; echo $MY_VALUE", env={"MY_VALUE": "env-value-canary-77"})
        s.run(HOG)
    text = out.read_text()
    assert CANARY not in text and "env-value-canary-77" not in text and "MY_VALUE=" not in text
    trace = next(read_traces(out))
    first, hog = trace.steps
    assert first.args["command"] == f"echo {MARKER}; echo $MY_VALUE" and first.recorded_output == f"{MARKER}\n{MARKER}"
    assert first.recorded_outcome.status == "ok" and first.duration_ms.provenance == "recorded"
    assert hog.recorded_outcome.status == "oom" and hog.profile.peak_mb.value == pytest.approx(64, abs=1)
    assert hog.profile.curve.provenance == "recorded" and len(hog.profile.curve.t_ms) >= 3
    assert trace.source["format"] == "agentcgroup-live" and trace.source["arm"] == "small"
    done = subprocess.run([sys.executable, "-m", "pytest_agentcgroup.cli", "traces", "validate", str(out)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr


def test_bad_input_is_one_message(tmp_path):
    with pytest.raises(SessionError, match="no arm 'nope'; arms: .*static-toolcall"):
        AgentSession("nope", workspace=tmp_path)
    with pytest.raises(SessionError, match="executor: expected one of host, sandbox"):
        AgentSession("unlimited", workspace=tmp_path, executor="docker")
    with pytest.raises(SessionError, match="not a directory"):
        AgentSession("unlimited", workspace=tmp_path / "missing")
    with pytest.raises(SessionError, match="arm vpa: limit_from = 'vpa' sets each step's limit from a replayed trace"):
        AgentSession("vpa", REPO / "experiments" / "exp1-paper.toml", workspace=tmp_path)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_under_the_sandbox_a_call_runs_as_nobody_without_network(host, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("the sandbox drops to nobody only when started as root")
    (tmp_path / "seen.txt").write_text("from the workspace\n")
    with AgentSession(Arm("small", memory_max_mb=64), workspace=tmp_path, executor="sandbox") as s:
        r = s.run("id -u; cat seen.txt; cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; echo x > made.txt")
        s.run("mkdir sub && cd sub")
        moved = s.run("pwd; cat ../made.txt")
        killed = s.run(HOG)
    assert r.exit_code == 0, r.output
    assert r.output.splitlines() == ["65534", "from the workspace", "lo"]
    # the shell's directory and the workspace's files carry from call to call, as in an agent's shell
    assert moved.output == f"{tmp_path}/sub\nx\n" and moved.cwd == f"{tmp_path}/sub"
    assert not (tmp_path / "made.txt").exists()       # its writes stay in the sandbox's workspace
    assert killed.killed and killed.kill_cause == "memory" and killed.note.startswith("stopped: ")


def agentcgroup(*args, cwd):
    return subprocess.run([sys.executable, "-m", "pytest_agentcgroup.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def test_exec_keeps_a_session_across_invocations_and_ends_it(host, tmp_path):
    session = tmp_path / "session"
    config = tmp_path / "arms.toml"
    config.write_text('[arms.small]\nmemory_max_mb = 64\n')
    first = agentcgroup("exec", "--session", str(session), "--arm", "small", "--config", str(config),
                        "--", "echo", "one", cwd=tmp_path)
    assert (first.returncode, first.stdout, first.stderr) == (0, "one\n", "")
    cgroup = Path(json.loads((session / ".session.json").read_text())["cgroup"]["paths"]["unified"])
    assert cgroup.is_dir()
    killed = agentcgroup("exec", "--session", str(session), "--", HOG, cwd=tmp_path)
    assert killed.returncode == 137 and killed.stderr.startswith("stopped: this tool call was killed at its 64 MiB")
    late = agentcgroup("exec", "--session", str(session), "--timeout", "0.5", "--", "sleep 5", cwd=tmp_path)
    assert late.returncode == 124 and "past its 0.5 s timeout" in late.stderr
    failed = agentcgroup("exec", "--session", str(session), "--", "exit 3", cwd=tmp_path)
    assert failed.returncode == 3
    other = agentcgroup("exec", "--session", str(session), "--arm", "unlimited", "--", "true", cwd=tmp_path)
    assert other.returncode == 125 and "runs arm 'small', not 'unlimited'" in other.stderr
    ended = agentcgroup("exec", "--session", str(session), "--end", cwd=tmp_path)
    assert ended.returncode == 0 and not cgroup.exists() and not (session / ".session.json").exists()
    trace = next(read_traces(session / "trace.json"))
    assert [s.recorded_outcome.status for s in trace.steps] == ["ok", "oom", "timeout", "failed"]
    assert "ended_at" in trace.source
    assert json.loads((session / "manifest.json").read_text())["subsets"]["live"] == [trace.trace_id]
    gone = agentcgroup("exec", "--session", str(session), "--end", cwd=tmp_path)
    assert gone.returncode == 125 and "no session to end" in gone.stderr


def test_a_recorded_session_replays_under_the_plugin(host, tmp_path):
    session = tmp_path / "session"
    assert agentcgroup("exec", "--session", str(session), "--arm", "static-toolcall", "--",
                       "python3 -c 'b = bytearray(30 << 20)'", cwd=tmp_path).returncode == 0
    assert agentcgroup("exec", "--session", str(session), "--end", cwd=tmp_path).returncode == 0
    done = subprocess.run([sys.executable, "-m", "pytest", "experiments/test_exp1_domain_mismatch.py", "-q", "-n", "0",
                           "-p", "no:cacheprovider", "--agentcgroup-traces", str(session), "--agentcgroup-subset",
                           "live", "-k", "unlimited", "--agentcgroup-out", str(tmp_path / "results")],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=300)
    assert "1 passed" in done.stdout, done.stdout[-3000:]


def test_time_held_at_a_soft_limit_counts_against_the_timeout(host, tmp_path):
    """The policy arm holds a low-priority call at its soft limit (5 s); the call's 1.5 s timeout is
    wall-clock, so the hold runs it into its timeout: stopped, and said so."""
    from pytest_agentcgroup.arms import Rules
    from pytest_agentcgroup.bpf.controller import missing_features
    arm = Arm("held", policy="agentcgroup", memory_high_mb=32, memory_max_mb=512,
              rules={"priorities": {"default": "low"}, "hold_ms": 5000, "kill_after": 0})
    missing = missing_features(Rules.from_arm(arm))
    if missing:
        pytest.skip(f"the policy arm cannot run here: {missing}")
    with AgentSession(arm, workspace=tmp_path) as s:
        r = s.run("python3 -c 'b = bytearray(100 << 20); print(len(b))'", timeout_s=1.5)
        after = s.run("echo next")
    assert r.timed_out and r.killed and r.kill_cause == "timeout" and r.throttles >= 1, r
    assert 1400 <= r.duration_ms < 4000
    assert re.match(r"stopped: this tool call ran past its 1.5 s timeout \(held at a memory limit \d+ times?\) and was "
                    r"killed; the rest of the session is unaffected$", r.note), r.note
    assert after.exit_code == 0 and after.output == "next\n"


def test_exec_calls_at_once_share_the_session_and_its_trace(host, tmp_path):
    session = tmp_path / "session"
    assert agentcgroup("exec", "--session", str(session), "--", "true", cwd=tmp_path).returncode == 0   # default arm
    procs = [subprocess.Popen([sys.executable, "-m", "pytest_agentcgroup.cli", "exec", "--session", str(session), "--",
                               f"sleep 0.5; echo {i}"], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO)}) for i in range(3)]
    outs = sorted(p.communicate(timeout=120)[0] for p in procs)
    assert outs == ["0\n", "1\n", "2\n"] and all(p.returncode == 0 for p in procs)
    assert agentcgroup("exec", "--session", str(session), "--end", cwd=tmp_path).returncode == 0
    trace = next(read_traces(session / "trace.json"))
    assert [s.step_id for s in trace.steps] == [0, 1, 2, 3] and trace.source["arm"] == "static-toolcall"


def test_a_session_that_cannot_start_leaves_no_cgroup(host, tmp_path):
    before = set(session_cgroups(host))
    with pytest.raises(SessionError, match="cannot put a workspace at /usr"):
        AgentSession(Arm("small", memory_max_mb=64), workspace="/usr", executor="sandbox", keep_cgroup=True).open()
    assert set(session_cgroups(host)) == before


def test_a_session_whose_cgroup_is_gone_says_so(host, tmp_path):
    session = tmp_path / "session"
    assert agentcgroup("exec", "--session", str(session), "--", "true", cwd=tmp_path).returncode == 0
    state = json.loads((session / ".session.json").read_text())
    Path(state["cgroup"]["paths"]["unified"]).rmdir()                 # e.g. after a reboot
    gone = agentcgroup("exec", "--session", str(session), "--", "true", cwd=tmp_path)
    assert gone.returncode == 125 and "the session's cgroup is gone" in gone.stderr and "--end" in gone.stderr
    assert agentcgroup("exec", "--session", str(session), "--end", cwd=tmp_path).returncode == 0
    assert not any(Path(p).exists() for p in state["cgroup"]["paths"].values())
