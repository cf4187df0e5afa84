"""Throughput benchmark for the openhands-rows converter (prints figures; asserts only sanity).

Writes N_ROWS rows in the real `nebius/SWE-rebench-openhands-trajectories` schema (each derived from
the structure of a real sample row, trimmed to a moderate size: system + user message, 12 tool calls
of execute_bash / str_replace_editor / think / finish with their tool results and cwd footers, the
`tools` schemas, model_patch, ...) to a JSONL file, then converts it in a child process pinned to one
CPU twice: streaming with `openhands_rows.iter_results` (a row at a time), and a naive reference
(read every line, json.loads each into a list held in memory, then convert every row, keeping the
traces). Each child reports its rows/s and its peak RSS (ru_maxrss / VmHWM). Goal of issue 3:
>= 2,000 trajectories/s on one core, peak RSS <= 500 MB.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

N_ROWS = 50_000
SAMPLE = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "openhands-swe-rebench-row" / "sample_raw.json"

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
try:
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
except (AttributeError, OSError):
    pass
from pytest_agentcgroup.traces.convert import openhands_rows as oh
from pytest_agentcgroup.traces.convert._common import guard, make_source
from pytest_agentcgroup.traces.ir import Trace
mode, path = sys.argv[1], Path(sys.argv[2])
t0 = time.perf_counter()
ok = bad = steps = 0
if mode == "stream":
    for r in oh.iter_results(path):
        if isinstance(r, Trace):
            ok += 1; steps += len(r.steps)
        else:
            bad += 1
else:  # naive: every row decoded and held in memory, then converted, traces kept
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    source = make_source(oh.FORMAT, path)
    traces = []
    for i, row in enumerate(rows):
        where = {"file": str(path), "record": i}
        r = guard(where, lambda: oh.convert_row(row, where, source, i))
        traces.append(r)
    for r in traces:
        if isinstance(r, Trace):
            ok += 1; steps += len(r.steps)
        else:
            bad += 1
dt = time.perf_counter() - t0
hwm = 0
try:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
except OSError:
    pass
rss = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, hwm)
print(json.dumps({"ok": ok, "bad": bad, "steps": steps, "seconds": dt, "rows_per_s": (ok + bad) / dt,
                  "peak_rss_mb": rss / 2**20}))
"""


def _slim(schema):
    """A tool's JSON schema without its long descriptions (names, types, enums and `required` kept)."""
    if isinstance(schema, dict):
        return {k: _slim(v) for k, v in schema.items() if k != "description"}
    if isinstance(schema, list):
        return [_slim(v) for v in schema]
    return schema


def _trim_args(msg: dict) -> dict:
    """Cut long string arguments (think/finish prose, file_text) to 200 characters; still a JSON string."""
    for call in msg.get("tool_calls") or []:
        args = json.loads(call["function"]["arguments"])
        call["function"]["arguments"] = json.dumps({k: v[:200] if isinstance(v, str) else v for k, v in args.items()})
    return msg


def _template() -> dict:
    """A moderate row with the real row's structure (from the sample when present)."""
    if SAMPLE.is_file():
        base = json.loads(SAMPLE.read_text())[0]
    else:
        pytest.skip(f"{SAMPLE} absent: no real row to derive the benchmark rows from")
    traj = base["trajectory"]
    msgs = [dict(traj[0], content=str(traj[0]["content"])[:600]), dict(traj[1], content=str(traj[1]["content"])[:600])]
    calls = 0
    for m in traj[2:]:
        m = copy.deepcopy(m)
        if m["role"] == "tool":
            text = m["content"] if isinstance(m["content"], str) else json.dumps(m["content"])
            foot = text[text.rfind("[Current working directory"):] if "[Current working directory" in text else ""
            m["content"] = text[:200] + ("\n" + foot if foot else "")
        elif m["role"] == "assistant":
            if calls >= 11:
                break
            m["content"] = str(m.get("content") or "")[:120]
            calls += len(m.get("tool_calls") or [])
            _trim_args(m)
        msgs.append(m)
    fin = next(m for m in reversed(traj) if m["role"] == "assistant")
    msgs.append(_trim_args(dict(copy.deepcopy(fin), content=str(fin.get("content") or "")[:120])))
    tools = [{"type": t.get("type"), "function": {"name": t["function"]["name"],
                                                   "description": t["function"].get("description", "")[:200],
                                                   "parameters": _slim(t["function"].get("parameters"))}}
             for t in base["tools"]]
    return dict(base, trajectory=msgs, tools=tools, model_patch=base["model_patch"][:600])


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory) -> tuple[Path, int]:
    row = _template()
    path = tmp_path_factory.mktemp("bench") / "rows.jsonl"
    head, tail = json.dumps(dict(row, trajectory_id="@@ID@@", instance_id="@@INST@@")).split('"@@ID@@"')
    t_head, t_tail = tail.split('"@@INST@@"')
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(N_ROWS):
            fh.write(f'{head}"traj-{i:06d}"{t_head}"{row["instance_id"]}-{i}"{t_tail}\n')
    steps = sum(len(m.get("tool_calls") or []) for m in row["trajectory"] if m["role"] == "assistant")
    yield path, steps
    path.unlink(missing_ok=True)   # ~0.7 GB: do not leave it in pytest's kept temp dirs


def _run(mode: str, path: Path) -> dict:
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_openhands_rows_throughput(rows_file, capsys, request):
    path, steps_per_row = rows_file
    stream = _run("stream", path)
    naive = _run("naive", path)
    size_mb = path.stat().st_size / 2**20
    lines = [
        f"openhands-rows throughput: {N_ROWS} rows ({size_mb:.0f} MB JSONL, {steps_per_row} steps/row), one CPU",
        f"  streaming iter_results : {stream['rows_per_s']:8.0f} trajectories/s   peak RSS {stream['peak_rss_mb']:7.1f} MB"
        f"   ({stream['seconds']:.1f} s)",
        f"  naive (json.loads all) : {naive['rows_per_s']:8.0f} trajectories/s   peak RSS {naive['peak_rss_mb']:7.1f} MB"
        f"   ({naive['seconds']:.1f} s)",
        f"  ratio streaming/naive  : speed x{stream['rows_per_s'] / naive['rows_per_s']:.2f}, "
        f"peak RSS x{stream['peak_rss_mb'] / naive['peak_rss_mb']:.2f}"
        f"   (goal: >= 2000 trajectories/s, <= 500 MB)",
    ]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    request.node.user_properties.append(("throughput", {"stream": stream, "naive": naive}))
    for r in (stream, naive):
        assert r["ok"] == N_ROWS and r["bad"] == 0 and r["steps"] == N_ROWS * steps_per_row
        assert r["rows_per_s"] > 0 and r["peak_rss_mb"] > 0
