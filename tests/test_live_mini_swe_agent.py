"""mini-swe-agent (the real package, pinned in the `minisweagent` extra) on the live runtime, end to end:
its own agent loop (DefaultAgent, and the `mini` command) driven by its own scripted model
(DeterministicModel) on a git workspace, each action in a cgroup of its own under the arm
(live/mini_swe_agent.py): a normal session, an action killed at its limit whose note is in the
model's next input, and the trace the session wrote accepted by `agentcgroup traces validate`."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cgroups_or_skip, git_workspace
from pytest_agentcgroup.notes import stopped_note
from pytest_agentcgroup.traces.ir import read_traces

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")      # mini-swe-agent prints a banner on import otherwise
minisweagent = pytest.importorskip("minisweagent",
                                   reason="mini-swe-agent not installed (pip install -e '.[minisweagent]')")

from minisweagent.agents.default import DefaultAgent                      # noqa: E402
from minisweagent.environments import get_environment                     # noqa: E402
from minisweagent.models.test_models import DeterministicModel, make_output  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ENVIRONMENT_CLASS = "pytest_agentcgroup.live.mini_swe_agent.AgentCgroupEnvironment"
HOG = "python3 -c 'b = bytearray(200 * 1024 * 1024); print(len(b))'"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
AGENT = {"system_template": "You run commands.", "instance_template": "Task: {{task}}", "step_limit": 10,
         "cost_limit": 0}


class RecordingModel(DeterministicModel):
    """mini-swe-agent's scripted model, keeping the messages it is given at each turn."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inputs: list[list[dict]] = []

    def query(self, messages, **kwargs):
        self.inputs.append([dict(m) for m in messages])
        return super().query(messages, **kwargs)


@pytest.fixture
def host():
    return cgroups_or_skip()


@pytest.fixture
def workspace(tmp_path):
    return git_workspace(tmp_path)


@pytest.fixture
def arms(tmp_path):
    path = tmp_path / "arms.toml"
    path.write_text("[arms.small]\nmemory_max_mb = 64\n")
    return path


def actions(*commands):
    return [make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(commands)]


def validate(trace: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_agentcgroup.cli", "traces", "validate", str(trace)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_bad_environment_section_is_one_message(tmp_path):
    from pytest_agentcgroup.live import SessionError
    with pytest.raises(SessionError, match="environment: unknown field image; expected some of environment_class, arm"):
        get_environment({"environment_class": ENVIRONMENT_CLASS, "image": "python:3.11"})
    with pytest.raises(SessionError, match="no arm 'nope'; arms: .*static-toolcall"):
        get_environment({"environment_class": ENVIRONMENT_CLASS, "arm": "nope", "cwd": str(tmp_path)})
    with pytest.raises(SessionError, match="environment.env: the sandbox executor runs actions in its own"):
        get_environment({"environment_class": ENVIRONMENT_CLASS, "executor": "sandbox", "env": {"PAGER": "cat"}})


def test_the_config_names_the_environment_and_each_action_runs_in_its_own_cgroup(host, workspace, arms, tmp_path):
    trace = tmp_path / "run" / "trace.json"
    env = get_environment({"environment_class": ENVIRONMENT_CLASS, "arm": "small", "config": str(arms),
                           "cwd": str(workspace), "trace_out": str(trace)})
    model = RecordingModel(outputs=actions("sed -i 's/a - b/a + b/' calc.py && git diff --stat; cat /proc/self/cgroup",
                                           "python3 -c 'b = bytearray(20 << 20); print(\"ok\")'", SUBMIT))
    agent = DefaultAgent(model, env, **AGENT)
    session = Path(env.session.described_cgroup["paths"]["unified"])
    try:
        done = agent.run("fix add")
    finally:
        env.close()
    assert done["exit_status"] == "Submitted" and not session.exists()     # closed: its cgroup is gone
    observations = [m for m in agent.messages if m["role"] == "user" and "agentcgroup" in m.get("extra", {})]
    first, second = (m["extra"] for m in observations)
    assert first["returncode"] == 0 and "1 file changed" in first["raw_output"]
    leaves = [line for line in first["raw_output"].splitlines() if line.startswith("0::")]
    assert len(leaves) == 1 and leaves[0].endswith(f"/{session.name}/s0"), leaves       # the call's own cgroup
    assert (workspace / "calc.py").read_text().endswith("a + b\n")    # the host executor works in the workspace
    measured = second["agentcgroup"]
    assert second["returncode"] == 0 and measured["call_id"] == 1 and not measured["killed"]
    assert 15 <= measured["peak_mb"] <= 64 and measured["limit_mb"] == 64 and measured["note"] is None
    recorded = next(read_traces(trace))
    steps = recorded.steps
    assert [s.recorded_outcome.status for s in steps] == ["ok", "ok", "ok"] and "ended_at" in recorded.source
    assert steps[1].profile.peak_mb.value == pytest.approx(measured["peak_mb"], abs=0.01)
    assert validate(trace).returncode == 0


def test_an_action_killed_at_its_limit_is_in_the_models_next_input_with_the_note(host, workspace, arms, tmp_path):
    trace = tmp_path / "trace.json"
    env = get_environment({"environment_class": ENVIRONMENT_CLASS, "arm": "small", "config": str(arms),
                           "cwd": str(workspace), "trace_out": str(trace)})
    model = RecordingModel(outputs=actions(HOG, "echo still here", SUBMIT))
    agent = DefaultAgent(model, env, **AGENT)
    try:
        agent.run("use memory")
    finally:
        env.close()
    killed = model.inputs[1][-1]                         # the last message of the turn after the action
    measured = killed["extra"]["agentcgroup"]
    note = stopped_note("memory", limit_mb=64, used_mb=measured["peak_mb"])
    assert measured["killed"] and measured["kill_cause"] == "memory" and measured["note"] == note
    assert killed["extra"]["returncode"] == 137 and note in killed["content"] and "209715200" not in killed["content"]
    assert "still here" in model.inputs[2][-1]["content"] and model.inputs[2][-1]["extra"]["returncode"] == 0
    steps = next(read_traces(trace)).steps
    assert [s.recorded_outcome.status for s in steps] == ["oom", "ok", "ok"]
    assert validate(trace).returncode == 0, validate(trace).stderr


def test_mini_runs_a_session_under_the_arm_from_its_config(host, workspace, arms, tmp_path):
    """The documented command: `mini` with the environment named in its config (docs/live.md)."""
    trace, traj = tmp_path / "run" / "trace.json", tmp_path / "traj.json"
    model = tmp_path / "model.yaml"
    model.write_text(json.dumps({"model": {"model_class": "deterministic", "model_name": "deterministic",
                                           "outputs": actions(HOG, "git status --short", SUBMIT)}}))
    mini = Path(sys.executable).with_name("mini")
    done = subprocess.run(
        [str(mini), "-c", "mini.yaml", "-c", str(model), "--environment-class", ENVIRONMENT_CLASS,
         "-c", "environment.arm=small", "-c", f"environment.config={arms}", "-c", f"environment.trace_out={trace}",
         "-t", "use memory", "--yolo", "--exit-immediately", "-o", str(traj)],
        cwd=workspace, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "MSWEA_CONFIGURED": "1", "MSWEA_SILENT_STARTUP": "1",
             "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mini-config")})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    saved = json.loads(traj.read_text())
    messages = saved["messages"]
    roles = [m["role"] for m in messages]
    assert roles[-1] == "exit" and roles.count("assistant") == 3
    killed = messages[roles.index("assistant") + 1]
    assert killed["extra"]["agentcgroup"]["kill_cause"] == "memory"
    assert "stopped: this tool call was killed at its 64 MiB memory limit" in killed["content"]
    recorded = next(read_traces(trace))
    assert [s.recorded_outcome.status for s in recorded.steps] == ["oom", "ok", "ok"]
    assert recorded.source["arm"] == "small" and recorded.steps[1].args["cwd"] == str(workspace)
    assert validate(trace).returncode == 0
    session = Path(saved["info"]["agentcgroup"]["session_cgroup"])
    assert session.name.startswith("agentcgroup-live-") and not session.exists(), "the session's cgroup outlived mini"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_under_the_sandbox_executor_actions_run_as_nobody_in_a_copy_of_the_workspace(host, workspace, arms):
    if os.geteuid() != 0:
        pytest.skip("the sandbox drops to nobody only when started as root")
    env = get_environment({"environment_class": ENVIRONMENT_CLASS, "arm": "small", "config": str(arms),
                           "executor": "sandbox", "cwd": str(workspace)})
    model = RecordingModel(outputs=actions("id -u; sed -i 's/a - b/a + b/' calc.py && cat calc.py", HOG, SUBMIT))
    try:
        done = DefaultAgent(model, env, **AGENT).run("fix add")
    finally:
        env.close()
    first, killed = model.inputs[1][-1], model.inputs[2][-1]
    assert done["exit_status"] == "Submitted"
    assert first["extra"]["raw_output"] == "65534\ndef add(a, b):\n    return a + b\n"
    assert workspace.joinpath("calc.py").read_text().endswith("a - b\n")       # the sandbox's writes stay in it
    assert killed["extra"]["agentcgroup"]["kill_cause"] == "memory"
    assert "stopped: this tool call was killed" in killed["content"]
