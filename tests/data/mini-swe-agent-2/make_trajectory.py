"""Writes local-run.traj.json: mini-swe-agent 2.x's own agent loop (DefaultAgent), its scripted test model
(DeterministicToolcallModel) and its local environment, run on a small workspace in a temporary folder.
Run it with the interpreter of a venv holding mini-swe-agent 2.x (not a dependency of this project):

    python3 -m venv /tmp/msa2 && /tmp/msa2/bin/pip install 'mini-swe-agent>=2,<3'
    MSWEA_GLOBAL_CONFIG_DIR=/tmp/msa2/config /tmp/msa2/bin/python tests/data/mini-swe-agent-2/make_trajectory.py tests/data/mini-swe-agent-2/local-run.traj.json

The model's turns are scripted (tool calls in the chat-completions shape the package's tool-call models
return); their actions are parsed by the package's own tool-call parser, as its chat-completions model
does; everything else (running the commands, the observation and format-error messages, the exit
message, the file) is the package's. Turns carry no `timestamp`: a scripted model has no query time.
"""
import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import yaml
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments.local import LocalEnvironment
from minisweagent.models.test_models import DeterministicToolcallModel
from minisweagent.models.utils.actions_toolcall import parse_toolcall_actions

CONFIG = yaml.safe_load(Path(package_dir / "config" / "mini.yaml").read_text())


def turn(text, *commands, n=[0]):
    """An assistant message with one bash tool call per command (none: the model forgot the tool)."""
    calls = []
    for command in commands:
        n[0] += 1
        calls.append({"id": f"call_{n[0]}", "type": "function",
                      "function": {"name": "bash", "arguments": json.dumps({"command": command})}})
    return {"role": "assistant", "content": text, "tool_calls": calls, "extra": {"cost": 0.0}}


class ScriptedToolcallModel(DeterministicToolcallModel):
    """The package's scripted tool-call model, with each turn's actions parsed from its tool calls by the
    package's parser (a turn without one raises the FormatError the agent records)."""

    def query(self, messages, **kwargs):
        message = json.loads(json.dumps(super().query(messages, **kwargs)))
        calls = [SimpleNamespace(id=c["id"], function=SimpleNamespace(**c["function"])) for c in message["tool_calls"]]
        message["extra"]["actions"] = parse_toolcall_actions(
            calls, format_error_template=CONFIG["model"]["format_error_template"])
        return message


def main(out: Path) -> None:
    work = Path(tempfile.mkdtemp(prefix="msa2-work-"))
    (work / "notes.txt").write_text("alpha\nbeta\n")
    (work / "sum.py").write_text("import sys\nprint(sum(int(a) for a in sys.argv[1:]))\n")
    outputs = [
        turn("Let me look at the workspace.", "ls"),
        turn("Read the notes and try the script.", "cat notes.txt", "python3 sum.py 1 2 3"),
        turn("Done, I think."),
        turn("Is there a config file?", "ls missing.txt"),
        turn("Run the script with a bad argument.", "python3 sum.py x"),
        turn("Wait for a slow command.", "sleep 5"),
        turn("Submit.", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat notes.txt"),
    ]
    model = ScriptedToolcallModel(outputs=outputs, observation_template=CONFIG["model"]["observation_template"])
    env = LocalEnvironment(cwd=str(work), timeout=2, env=CONFIG["environment"]["env"])
    agent = DefaultAgent(model, env, **CONFIG["agent"], output_path=out)
    agent.run("Add up the numbers in the notes.")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve())
