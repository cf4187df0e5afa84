"""`agentcgroup traces profile`: real commands under the sandbox executor, each step in a
cgroup of its own, give recorded profiles and outcomes; resume; one clear message for bad input or
missing privileges; the shipped recorded-here corpus is what the profiler writes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import signal
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from pytest_agentcgroup import cli
from pytest_agentcgroup.profile.run import ProfileError, Settings, profile_traces, to_curve
from pytest_agentcgroup.tools import recorded_here
from pytest_agentcgroup.traces.corpus import Corpus
from pytest_agentcgroup.traces import select
from pytest_agentcgroup.traces.ir import Step, Trace, read_traces, write_trace
from pytest_agentcgroup.workspaces.lock import RegistryUnreachable

from helpers import EXP_MODULE, cgroups_or_skip

REPO = Path(__file__).resolve().parents[1]
MB = 1024 * 1024


def bash(i, cmd, **args):
    return Step(i, "bash", {"command": cmd, **args}, native_tool="Bash")


def tiny(tmp_path: Path, steps, trace_id="t/tiny") -> Path:
    path = tmp_path / "in" / (trace_id.replace("/", "_") + ".json")
    path.parent.mkdir(exist_ok=True)
    write_trace(Trace(trace_id, {"format": "test"}, tuple(steps)), path)
    return path


def profiled(out: Path, trace_id: str) -> Trace:
    (trace,) = read_traces(out / f"{trace_id}.json")
    return trace


def test_real_steps_get_recorded_profiles_and_outcomes(tmp_path, can_profile):
    from pytest_agentcgroup.traces.ir import Measure, Profile
    first = Step(0, "bash", {"command": "echo state > f; python3 -c 'x = bytearray(120 * 2**20); "
                                        "import time; time.sleep(0.3)'", "cwd": "/workspace"},
                 duration_ms=Measure(40.0, "recorded"), profile=Profile(peak_mb=Measure(7.0, "derived")))
    path = tiny(tmp_path, [
        first,
        Step(1, "read", {"file_path": "/workspace/f"}, profile=Profile(peak_mb=Measure(3.0, "derived"))),
        bash(2, "test \"$(cat f)\" = state"),           # the state the first step left
        bash(3, "exit 3"),
        bash(4, "sleep 10", timeout_ms=700),
        bash(5, "python3 -c 'x = bytearray(400 * 2**20)'"),
        bash(6, "true", cwd="/workspace/../etc"),         # refused: not started, nothing measured
    ])
    done = profile_traces([path], tmp_path / "out", Settings(memory_max_mb=200))
    assert (done["profiled"], done["skipped"]) == (["t/tiny"], [])
    # this process's own peak (the profiler's), which the 400 MiB step is not part of
    import resource
    assert abs(done["peak_rss_mib"]["profiler"] - resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024) < 1
    t = profiled(tmp_path / "out", "t/tiny")
    s = t.steps
    assert [x.outcome.status if x.outcome else None for x in s] == ["ok", None, "ok", "failed", "timeout", "oom",
                                                                      "error"]
    assert (s[3].outcome.exit_code, s[4].outcome.exit_code) == (3, None)
    # the allocation: the kernel's peak sees the 120 MiB, the curve rises to it, CPU was spent
    p = s[0].profile
    assert 120 <= p.peak_mb.value < 200 and p.cpu_ms.value > 0 and s[0].duration_ms.value >= 300
    assert p.curve.mb[0] < 5 and max(p.curve.mb) >= 115 and p.curve.t_ms[-1] >= 300
    assert 0 < p.ramp_ms.value <= s[0].duration_ms.value
    for x in (s[0], s[2], s[3], s[4], s[5]):
        prov = {m.provenance for m in (x.duration_ms, x.profile.peak_mb, x.profile.ramp_ms, x.profile.cpu_ms)}
        assert prov == {"recorded"} and x.profile.curve.provenance == "recorded"
    assert s[0].original.duration_ms == Measure(40.0, "recorded") and s[0].original.profile.peak_mb.value == 7.0
    assert s[1] == Step(1, "read", {"file_path": "/workspace/f"}, profile=Profile(peak_mb=Measure(3.0, "derived")))
    assert 600 <= s[4].duration_ms.value < 5000                     # killed at its own 700 ms timeout
    assert s[5].profile.peak_mb.value <= 200 + 1                     # held at the bound, then killed
    assert s[6].duration_ms is None and s[6].profile.to_json() == {} and s[6].original is not None
    src = t.source["profiled"]
    assert src["complete"] and src["executor"] == "sandbox" and src["steps_profiled"] == 5
    assert src["sample_hz"]["median"] >= 100                         # the floor
    assert src["peak"] == "kernel (recorded)" and "peak_from_curve" not in src
    # the python3 the steps ran (the host's, bound into the sandbox), not only the profiler's
    assert src["machine"]["steps_python3"].startswith("/usr/") and src["machine"]["profiler_python"]
    # the manifest lists it: a corpus the plugin loads
    assert Corpus.open(tmp_path / "out").load("t/tiny") == t


def test_a_profiled_trace_stores_its_faithfulness_verdict_and_the_output_it_compared(tmp_path, can_profile):
    from pytest_agentcgroup.metrics.source_faithfulness import judge_trace
    from pytest_agentcgroup.traces.ir import Measure, Outcome

    def said(i, cmd, output, **kw):
        return Step(i, "bash", {"command": cmd}, native_tool="bash", recorded_outcome=Outcome("ok", 0),
                    recorded_output=output, **kw)
    path = tiny(tmp_path, [
        *(said(i, f"echo hello {i}", f"hello {i}\n") for i in range(5)),
        said(5, "exit 3", ""),                                                   # exit
        Step(6, "bash", {"command": "sleep 1.6"}, duration_ms=Measure(100.0, "recorded"),
             recorded_outcome=Outcome("ok", 0)),                                 # duration: 1.6 s > 3 x 0.1 + 1 s
        said(7, "echo other", "hello\n"),                                       # output
        Step(8, "bash", {"command": "true"}),                                    # unknown: nothing recorded
    ])
    profile_traces([path], tmp_path / "out", Settings())
    t = profiled(tmp_path / "out", "t/tiny")
    assert [s.output for s in t.steps[:2]] == ["hello 0\n", "hello 1\n"] and t.steps[6].output is None
    got = t.source["faithfulness"]
    assert got == judge_trace(t).stored()
    assert (got["compared"], got["faithful"], got["unknown"], got["verdict"]) == (8, 5, 1, "fail")
    assert (got["unfaithful_exit"], got["unfaithful_duration"], got["unfaithful_output"]) == (1, 1, 1)


def test_resume_skips_complete_traces_redoes_partial_ones_and_keeps_other_files(tmp_path, can_profile):
    a = tiny(tmp_path, [bash(0, "true", cwd="/workspace")], "t/a")
    b = tiny(tmp_path, [bash(0, "true", cwd="/workspace")], "t/b")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    profile_traces([a], out, Settings())
    first = (out / "t" / "a.json").read_bytes()
    (out / "t" / "b.json").write_text('{"schema": "agentcgroup-trace/1", "trace_id": "t/b", "source": {}, "st')
    done = profile_traces([a, b], out, Settings())
    assert (done["profiled"], done["skipped"]) == (["t/b"], ["t/a"])
    assert (out / "t" / "a.json").read_bytes() == first and (out / "notes.txt").read_text() == "mine"
    assert profiled(out, "t/b").steps[0].outcome.status == "ok"
    assert set(Corpus.open(out).ids("profiled")) == {"t/a", "t/b"}


def test_resume_lists_a_complete_trace_missing_from_the_manifest_and_redoes_changed_steps(tmp_path, can_profile):
    a = tiny(tmp_path, [bash(0, "true", cwd="/workspace")], "t/a")
    out = tmp_path / "out"
    profile_traces([a], out, Settings())
    (out / "manifest.json").unlink()                 # as if the run had stopped between the trace and the manifest
    again = profile_traces([a], out, Settings())
    assert (again["profiled"], again["skipped"]) == ([], ["t/a"])
    assert Corpus.open(out).ids("profiled") == ("t/a",)
    # the same trace id with another command is not complete: profiled again
    a = tiny(tmp_path, [bash(0, "exit 2", cwd="/workspace")], "t/a")
    again = profile_traces([a], out, Settings())
    assert (again["profiled"], again["skipped"]) == (["t/a"], [])
    assert profiled(out, "t/a").steps[0].outcome.status == "failed"


def test_the_manifest_is_merged_not_rewritten(tmp_path, can_profile):
    out = tmp_path / "out"
    out.mkdir()
    old = {"schema": "agentcgroup-manifest/1", "seed": 7, "strata": {"short": 1},
           "subsets": {"dev": ["x/y"], "profiled": ["x/y"]},
           "traces": [{"trace_id": "t/tiny", "file": "t/tiny.json", "model": "haiku", "category": "test",
                       "steps": 99},
                      {"trace_id": "x/y", "file": "x/y.json", "bursty": True}, {"note": "an entry without an id"}]}
    (out / "manifest.json").write_text(json.dumps(old))
    profile_traces([tiny(tmp_path, [bash(0, "true", cwd="/workspace")])], out, Settings())
    new = json.loads((out / "manifest.json").read_text())
    assert (new["seed"], new["strata"]) == (7, {"short": 1})
    assert new["subsets"] == {"dev": ["x/y"], "profiled": ["t/tiny", "x/y"]}    # in id order
    entries = {e.get("trace_id"): e for e in new["traces"]}
    assert entries["x/y"] == {"trace_id": "x/y", "file": "x/y.json", "bursty": True}
    assert entries[None] == {"note": "an entry without an id"}
    tiny_entry = entries["t/tiny"]
    assert (tiny_entry["model"], tiny_entry["category"]) == ("haiku", "test")        # kept
    assert (tiny_entry["steps"], tiny_entry["outcomes"]) == (1, {"ok": 1})            # the profile's own


def test_a_family_writes_the_profiled_copy_beside_the_original(tmp_path, can_profile, capsys):
    """--family: claude-code/haiku/x profiled as NAME/haiku/x, into the corpus that holds the
    original, which stays as it was (the derived corpus selectable beside the recorded one)."""
    src = tiny(tmp_path, [bash(0, "true", cwd="/workspace")], trace_id="cc/haiku/x")
    out = tmp_path / "out"
    (out / "cc" / "haiku").mkdir(parents=True)
    original = out / "cc" / "haiku" / "x.json"
    shutil.copy(src, original)
    assert cli.main(["traces", "profile", str(original), "-o", str(out), "--family", "cc-recorded",
                     "--subset", "recorded"]) == 0
    assert original.read_bytes() == src.read_bytes()
    copy = profiled(out, "cc-recorded/haiku/x")
    assert copy.steps[0].profile.peak_mb.provenance == "recorded"
    assert json.loads((out / "manifest.json").read_text())["subsets"]["recorded"] == ["cc-recorded/haiku/x"]
    with pytest.raises(SystemExit):
        cli.main(["traces", "profile", str(original), "-o", str(out), "--family", "a/b"])
    assert "not a trace family name" in capsys.readouterr().err


def test_outputs_never_overwrite_inputs_or_foreign_files(tmp_path, capsys):
    """Checked before anything runs (no cgroups needed): an output that is an input file, or an
    existing file that is not a profiled trace, is refused with one message and left as it was."""
    src = tmp_path / "in" / "t" / "tiny.json"
    src.parent.mkdir(parents=True)
    write_trace(Trace("t/tiny", {"format": "test"}, (bash(0, "true"),)), src)
    before = src.read_bytes()
    code, err = _cli(["traces", "profile", str(src), "-o", str(tmp_path / "in")], capsys)
    assert code == 1 and "is an input file" in err and "Traceback" not in err and src.read_bytes() == before
    code, err = _cli(["traces", "profile", str(tmp_path / "in"), "-o", str(tmp_path / "in")], capsys)
    assert code == 1 and "is an input file" in err and src.read_bytes() == before
    foreign = tmp_path / "out" / "t" / "tiny.json"
    foreign.parent.mkdir(parents=True)
    foreign.write_bytes(before)                              # a trace nobody profiled: someone's file
    code, err = _cli(["traces", "profile", str(src), "-o", str(tmp_path / "out")], capsys)
    assert code == 1 and f"{foreign}: the output of trace 't/tiny' exists and is not a profiled trace" in err
    assert foreign.read_bytes() == before


def test_a_bad_manifest_or_output_directory_stops_before_the_first_step(tmp_path, capsys):
    good = tiny(tmp_path, [bash(0, "touch /workspace/ran")])
    out = tmp_path / "out"
    out.mkdir()
    for text, says in (('{"schema": "agentcgroup-manifest/1", "traces": [', "invalid JSON"),
                       ('["not", "a", "manifest"]', "field 'schema'"),
                       ('{"schema": "agentcgroup-manifest/1", "traces": {}}', "field 'traces'")):
        (out / "manifest.json").write_text(text)
        code, err = _cli(["traces", "profile", str(good), "-o", str(out)], capsys)
        assert code == 1 and "manifest.json" in err and says in err and "not touched" in err, err
        assert "Traceback" not in err and (out / "manifest.json").read_text() == text
        assert not (out / "t").exists()                      # nothing profiled, nothing written
    (tmp_path / "afile").write_text("")
    code, err = _cli(["traces", "profile", str(good), "-o", str(tmp_path / "afile" / "o")], capsys)
    assert code == 1 and f"-o {tmp_path / 'afile' / 'o'}: cannot write there (Not a directory)" in err


def test_the_workspace_is_copied_per_trace(tmp_path, can_profile):
    ws = tmp_path / "ws"
    (ws / "pkg").mkdir(parents=True)
    (ws / "pkg" / "mod.py").write_text("VALUE = 41\n")
    os.mkfifo(ws / "pipe")                                # skipped, not opened (it would block)
    os.chmod(ws, 0o777)                                   # the copy does not inherit it
    path = tiny(tmp_path, [bash(0, "cd pkg && python3 -c 'import mod; assert mod.VALUE == 41'", cwd="/workspace"),
                           bash(1, "echo 'VALUE = 42' > mod.py"), bash(2, "test ! -e ../pipe"),
                           bash(3, 'test "$(stat -c %a /workspace)" = 700')])
    profile_traces([path], tmp_path / "out", Settings(workspace=ws))
    assert [s.outcome.status for s in profiled(tmp_path / "out", "t/tiny").steps] == ["ok", "ok", "ok", "ok"]
    assert (ws / "pkg" / "mod.py").read_text() == "VALUE = 41\n"   # the copy changed, not the original


def test_a_trace_whose_task_has_no_workspace_is_not_profiled_in_an_empty_one(tmp_path, can_profile):
    """Its commands would fail at once in an empty directory: one message naming the task and the
    ways to give it one; `--workspace empty` asks for that anyway."""
    from pytest_agentcgroup.traces.task import Task
    path = tmp_path / "in" / "task.json"
    path.parent.mkdir()
    write_trace(Trace("t/acme__widget-7", {"format": "test"}, (bash(0, "ls", cwd="/testbed"),),
                      task=Task(instance_id="acme__widget-7", path="/testbed")), path)
    with pytest.raises(ProfileError, match=r"trace t/acme__widget-7 ran on task acme__widget-7 .*its workspace is "
                                           r"missing here.*--workspace DIR .*workspaces.lock.json"):
        profile_traces([path], tmp_path / "out", Settings())
    profile_traces([path], tmp_path / "out", Settings(workspace="empty"))
    t = profiled(tmp_path / "out", "t/acme__widget-7")
    assert t.steps[0].outcome.status == "ok" and t.source["profiled"]["workspace"].startswith("empty (asked for")


def test_on_a_terminal_the_steps_are_a_bar_with_their_eta(capsys):
    from pytest_agentcgroup.cli.profile import StepsBar
    bar = StepsBar(tty=True)
    bar.line("t/x: complete in out, skipped (resume)")       # before the bar: a line of its own
    for done in range(4):
        bar.advance(done, 3)
        bar.line(f"[1/1] t/y: step {done}/3 ok")
    bar.close()
    err = capsys.readouterr().err
    assert err.startswith("t/x: complete in out, skipped (resume)\n")
    assert "3/3" in err and ("step/s" in err or "s/step" in err) and "<" in err, err   # tqdm's bar, rate, ETA


def _cli(argv, capsys):
    code = cli.main(argv)
    return code, capsys.readouterr().err


def test_errors_are_one_message(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "agentcgroup-trace/1", "trace_id": "x", "source": {}, "steps": [{"step_id": 0}]}')
    code, err = _cli(["traces", "profile", str(bad), "-o", str(tmp_path / "o")], capsys)
    assert code == 1 and err.strip().endswith("step 0, field 'tool': missing") and str(bad) in err
    assert "Traceback" not in err and not (tmp_path / "o").exists()
    good = tiny(tmp_path, [bash(0, "true")])
    code, err = _cli(["traces", "profile", str(good), "-o", str(tmp_path / "o"), "--workspace",
                      str(tmp_path / "absent")], capsys)
    assert code == 1 and f"--workspace {tmp_path / 'absent'}: not a directory" in err
    code, err = _cli(["traces", "profile", str(tmp_path / "nothing.json"), "-o", str(tmp_path / "o")], capsys)
    assert code == 1 and "nothing.json: no such file or directory" in err
    code, err = _cli(["traces", "profile", str(good), "-o", str(tmp_path / "o"), "--image", "x"], capsys)
    assert code == 1 and "--image needs --executor docker" in err
    odd = tiny(tmp_path, [bash(0, "true")], "t/../escape")
    code, err = _cli(["traces", "profile", str(odd), "-o", str(tmp_path / "o")], capsys)
    assert code == 1 and "'t/../escape': its id is not a clean relative path" in err


def test_limits_must_be_positive(tmp_path, capsys):
    good = tiny(tmp_path, [bash(0, "true")])
    for flag, value in (("--step-timeout", "0"), ("--step-timeout", "nan"), ("--memory-max-mb", "-5"),
                        ("--pids-max", "0"), ("--pids-max", "x")):
        with pytest.raises(SystemExit) as exit_:
            cli.main(["traces", "profile", str(good), "-o", str(tmp_path / "o"), flag, value])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"argument {flag}" in err and ("must be positive" in err or "not a number" in err)
    assert not (tmp_path / "o").exists()


def test_sigterm_stops_like_an_interrupt_and_cleans_up(tmp_path, can_profile):
    """SIGTERM mid-step: exit 130 with the resume message, the step's process killed, its output not
    written, nothing of the sandbox left mounted."""
    marker = f"{os.getpid() % 1000 + 7000}.25"                # a sleep of an unusual length, to find it
    path = tiny(tmp_path, [bash(0, f"sleep {marker}", cwd="/workspace")])
    proc = subprocess.Popen([sys.executable, "-m", "pytest_agentcgroup.cli", "traces", "profile", str(path),
                             "-o", str(tmp_path / "out")], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not _sleeping(marker):
        assert time.monotonic() < deadline and proc.poll() is None, "the step never started"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err, err
    assert not _sleeping(marker) and not (tmp_path / "out" / "t" / "tiny.json").exists()
    assert f"agentcgroup-sbx-{proc.pid}-" not in Path("/proc/self/mountinfo").read_text()   # its workspace


def _sleeping(arg: str) -> bool:
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and (d / "cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", arg.encode()]:
                return True
        except OSError:
            continue
    return False


def test_usage_sampler_forgets_the_last_windows_readings():
    """keep_samples: a new window starts with no readings of the last one, and stop() without an
    open window leaves none either (the sampler only reads usage_bytes: a constant stands in)."""
    from pytest_agentcgroup.cgroups.usage import UsageSampler

    class Constant:
        def usage_bytes(self):
            return 5 * MB
    sampler = UsageSampler(0.002, keep_samples=True)
    try:
        sampler.start(Constant())
        time.sleep(0.02)
        sampler.stop()
        assert len(sampler.curve) >= 2
        sampler.start(Constant())
        assert sampler.curve == []
        sampler.stop()
        assert sampler.stop() == {} and sampler.curve == []
    finally:
        sampler.close()


@pytest.mark.root
def test_without_privileges_one_message(tmp_path):
    """As an unprivileged user (nobody, via setpriv) the profiler cannot make cgroups: it says so."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the command as an unprivileged user")
    # a directory nobody can read (pytest's own tmp_path is root's only: that message is tested below)
    tmp_path = Path(tempfile.mkdtemp(prefix="agentcgroup-profile-test-"))
    os.chmod(tmp_path, 0o755)
    good = tiny(tmp_path, [bash(0, "true")])
    (tmp_path / "o").mkdir()
    os.chown(tmp_path / "o", 65534, 65534)               # an output directory it may write: cgroups are what it lacks
    # the system interpreter: this venv's may live under a home directory nobody cannot enter
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-m",
                           "pytest_agentcgroup.cli", "traces", "profile", str(good), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "cannot create cgroups" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    # and a trace file it may not read is named, not a traceback
    os.chmod(good.parent, 0o700)
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-m",
                           "pytest_agentcgroup.cli", "traces", "profile", str(good), "-o", str(tmp_path / "o")],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd="/")
    shutil.rmtree(tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().endswith(f"{good}: Permission denied"), done.stderr


def test_without_a_kernel_peak_the_curve_max_is_derived_and_named(tmp_path, can_profile, monkeypatch):
    """A kernel without memory.peak (v2 before 5.19): the peak is the curve's highest reading,
    labelled derived, and source.profiled names the steps whose peak it is."""
    from pytest_agentcgroup.cgroups.node import Cgroup
    real = Cgroup.counters

    def no_peak(self):
        c = real(self)
        c.peak_bytes = None                      # what node.counters reads on such a kernel
        return c
    monkeypatch.setattr(Cgroup, "counters", no_peak)
    path = tiny(tmp_path, [bash(0, "python3 -c 'x = bytearray(60 * 2**20); import time; time.sleep(0.2)'",
                                cwd="/workspace"), bash(1, "true")])
    profile_traces([path], tmp_path / "out", Settings())
    t = profiled(tmp_path / "out", "t/tiny")
    p = t.steps[0].profile
    assert p.peak_mb.provenance == "derived" and p.peak_mb.value == max(p.curve.mb) and p.peak_mb.value >= 60
    assert p.cpu_ms.provenance == "recorded" and p.provenance() == "derived"
    src = t.source["profiled"]
    assert src["peak_from_curve"] == [0, 1] and "kernel (recorded)" not in src["peak"]
    assert "memory.peak" in src["peak"]


def test_io_is_not_recorded_on_a_tmpfs_workspace(tmp_path, can_profile):
    profile_traces([tiny(tmp_path, [bash(0, "head -c 5000000 /dev/zero > f", cwd="/workspace")])],
                   tmp_path / "out", Settings())
    t = profiled(tmp_path / "out", "t/tiny")
    assert t.steps[0].profile.io_bytes is None
    assert t.source["profiled"]["io_bytes"].startswith("not recorded: the workspace is a tmpfs")


def test_the_curve_starts_at_the_spawn_and_ends_at_the_reaping():
    from pytest_agentcgroup.profile.run import step_time_base
    # window 100 ms, step 80 ms: the spawn was 20 ms into the window
    readings = [(0.0, 1), (10.0, 2), (19.0, 3), (30.0, 4), (99.0, 5), (100.0, 6)]
    assert step_time_base(readings, 100.0, 80.0) == [(0.0, 3), (10.0, 4), (79.0, 5), (80.0, 6)]
    assert step_time_base([(0.0, 1), (3.0, 2)], 3.0, 3.0) == [(0.0, 1), (3.0, 2)]


def test_curve_keeps_change_points_only():
    c = to_curve([(0.0, 0), (4.0, 0), (8.0, 0), (12.0, 5 * MB), (16.0, 5 * MB), (20.0, 5 * MB), (24.0, MB)])
    assert c.t_ms == (0.0, 8.0, 12.0, 20.0, 24.0) and c.mb == (0.0, 0.0, 5.0, 5.0, 1.0)
    assert to_curve([]) is None


def test_the_sdist_is_taken_only_with_its_pinned_hash(tmp_path):
    """recorded_here.download_sdist from a PEP 503 index (a local HTTP server): the pinned file is
    returned, a link with another hash or bytes with another hash are refused by name."""
    import functools
    import hashlib
    import http.server
    import threading
    good, bad = b"the sdist", b"another file"
    pin = hashlib.sha256(good).hexdigest()
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "p-1.tar.gz").write_bytes(good)
    (tmp_path / "files" / "q-1.tar.gz").write_bytes(bad)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "index.html").write_text(f'<a href="../files/p-1.tar.gz#sha256={pin}">p-1.tar.gz</a>'
                                               '<a href="../files/q-1.tar.gz">q-1.tar.gz</a>')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        _check_download(index, good, pin)
    finally:
        server.shutdown()
        server.server_close()


def _check_download(index, good, pin):
    assert recorded_here.download_sdist("p", "p-1.tar.gz", pin, index=index) == good
    with pytest.raises(SystemExit, match="listed with sha256=.*not the pinned"):
        recorded_here.download_sdist("p", "p-1.tar.gz", "0" * 64, index=index)
    with pytest.raises(SystemExit, match=r"q-1.tar.gz: sha256 .* not the pinned"):
        recorded_here.download_sdist("p", "q-1.tar.gz", pin, index=index)
    with pytest.raises(SystemExit, match="lists no r-1.tar.gz"):
        recorded_here.download_sdist("p", "r-1.tar.gz", pin, index=index)
    with pytest.raises(SystemExit, match="cannot download .* needs PyPI once") as info:
        recorded_here.download_sdist("absent", "p-1.tar.gz", pin, index=index)
    assert info.value.__cause__ is None                             # the index answered (404): not the network
    with pytest.raises(SystemExit, match="cannot download .* needs PyPI once") as info:
        recorded_here.download_sdist("p", "p-1.tar.gz", pin, index="http://127.0.0.1:9")     # nothing listens
    assert isinstance(info.value.__cause__, RegistryUnreachable)    # what the network test skips on


def test_the_shipped_recorded_here_corpus():
    """traces/recorded-here/: each of the generator's command traces has its profiled trace in the
    manifest (subset recorded-here) with every executing step recorded and an outcome; and traces/,
    read as a directory, holds every trace id once (the command traces are not shipped beside them)."""
    root = REPO / "traces"
    corpus = Corpus.open(root)
    commands = {t.trace_id: t for t in recorded_here.traces()}
    assert set(corpus.ids("recorded-here")) == set(commands) and 5 <= len(commands) <= 10
    loaded, errors = select.load([root])
    assert not errors and len(loaded) == len({t.trace_id for t in loaded}), errors
    statuses = set()
    for tid, src in commands.items():
        t = corpus.load(tid)
        assert 5 <= len(t.steps) <= 15 and [s.args for s in t.steps] == [s.args for s in src.steps]
        prof = t.source["profiled"]
        assert prof["complete"] and prof["executor"] == "sandbox" and prof["sample_hz"]["min"] >= 100
        assert {"kernel", "hostname", "cgroups"} <= set(prof["machine"]) and prof["date"] and prof["command"]
        for s in t.steps:
            assert s.outcome is not None and s.original is not None
            assert s.profile.provenance() == "recorded" and s.duration_ms.provenance == "recorded"
            assert s.profile.peak_mb and s.profile.cpu_ms and s.profile.curve
            statuses.add(s.outcome.status)
    assert {"ok", "failed", "timeout"} <= statuses


@pytest.mark.network
def test_the_cli_profiles_a_recorded_here_command_trace_with_every_number_recorded(tmp_path, can_profile):
    """Acceptance: `agentcgroup traces profile` on one recorded-here command trace (`agentcgroup tools
    recorded-here traces`), in the workspace `make recorded-here` builds (built here the same way when absent)."""
    ws = REPO / ".cache" / "recorded-here" / "workspace"
    try:
        recorded_here.build_workspace(ws)               # kept as it is when already complete
    except SystemExit as exc:       # skipped only when the network failed, else the test fails with why
        if not isinstance(exc.__cause__, RegistryUnreachable):
            pytest.fail(f"the recorded-here workspace is not built and cannot be: {exc}", pytrace=False)
        pytest.skip(f"{exc.__cause__.registry} unreachable: the recorded-here workspace cannot be built: {exc}")
    src = next(p for p in recorded_here.write_traces(tmp_path / "commands") if p.name == "search-and-read.json")
    done = subprocess.run([sys.executable, "-m", "pytest_agentcgroup.cli", "traces", "profile", str(src),
                           "-o", str(tmp_path / "out"), "--workspace", str(ws), "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert (said["profiled"], said["skipped"]) == (["recorded-here/search-and-read"], [])
    # not a terminal (a log, CI): a line per step, with the steps done of all and the time left
    lines = [ln for ln in done.stderr.splitlines() if ": step " in ln]
    assert len(lines) == len(next(iter(read_traces(src))).steps) and "steps, about " in lines[0], done.stderr
    assert lines[0].endswith(f"(1/{len(lines)} steps, about " + lines[0].rsplit("about ", 1)[1])
    (source,) = read_traces(src)
    t = Corpus.open(tmp_path / "out").load("recorded-here/search-and-read")
    assert [(s.tool, s.args) for s in t.steps] == [(s.tool, s.args) for s in source.steps]
    for s in t.steps:
        assert s.outcome.status == "ok", (s.step_id, s.command)
        assert s.duration_ms.provenance == "recorded" and s.profile.provenance() == "recorded"
        assert s.profile.peak_mb.value > 0 and s.profile.cpu_ms is not None and s.profile.curve
        assert s.profile.curve.t_ms[-1] <= s.duration_ms.value
    assert t.source["profiled"]["peak"] == "kernel (recorded)" and t.source["profiled"]["complete"]


def test_docker_executor_profiles_in_the_container_with_the_workspace(tmp_path, agentcgroup_docker, monkeypatch):
    """The docker executor (local image): the workspace is unpacked in the container's tmpfs
    workspace, each step measured in its own cgroup under the container's."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "data.txt").write_text("41\n")
    os.link(ws / "data.txt", ws / "same.txt")                  # a hard link arrives as one
    path = tiny(tmp_path, [bash(0, "test \"$(cat data.txt)\" = 41 && test \"$(cat same.txt)\" = 41 && "
                                   "test \"$(stat -c %h same.txt)\" = 2", cwd="/workspace"),
                           bash(1, "python3 -c 'x = bytearray(300 * 2**20)'"), bash(2, "exit 4")])
    profile_traces([path], tmp_path / "out", Settings(executor="docker", workspace=ws, memory_max_mb=200),
                   engine=agentcgroup_docker)
    t = profiled(tmp_path / "out", "t/tiny")
    assert [(s.outcome.status, s.outcome.exit_code) for s in t.steps] == [("ok", 0), ("oom", 137), ("failed", 4)]
    assert t.steps[1].profile.peak_mb.value > 150 and t.steps[1].profile.provenance() == "recorded"
    assert t.source["profiled"]["executor"] == "docker" and t.source["profiled"]["image"]
    assert t.source["profiled"]["workspace"] == f"directory {ws} at /workspace"
    # a workspace the container's (a 16 MiB tmpfs here) cannot take: one message, not a traceback
    from pytest_agentcgroup.replay.executors import docker as docker_executor
    monkeypatch.setitem(docker_executor.TMPFS_MB, "workspace", 16)
    with open(ws / "big", "wb") as f:
        f.truncate(32 * MB)
    with pytest.raises(ProfileError, match=rf"trace t/big: the docker executor cannot copy {ws} to /workspace in its "
                                           r"container \(a 16 MiB tmpfs; exit 2\): tar: big: Wrote only"):
        profile_traces([tiny(tmp_path, [bash(0, "true")], "t/big")], tmp_path / "out",
                       Settings(executor="docker", workspace=ws), engine=agentcgroup_docker)


@pytest.mark.slow
def test_exp1_replays_the_shipped_recorded_here_corpus(pytester: pytest.Pytester):
    """Acceptance: exp1 runs on the profiled corpus like on any other, and what the emulator replays
    is the recorded profile (every step record says `recorded`)."""
    cgroups_or_skip()
    (pytester.path / "study.toml").write_text(textwrap.dedent(f"""
        traces = "{REPO / 'traces'}"
        [defaults]
        executor = "emulate"
        time_scale = 0.01
        step_timeout_s = 60
        [arms.unlimited]
        [arms.static-toolcall]
        memory_max_mb = 1024
        [experiments.exp1]
        subset = "recorded-here"
    """))
    pytester.makepyfile(test_exp1=EXP_MODULE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--agentcgroup-config", "study.toml",
                                           "--agentcgroup-out", "out", timeout=600)
    traces = [Corpus.open(REPO / "traces").load(t) for t in Corpus.open(REPO / "traces").ids("recorded-here")]
    result.assert_outcomes(passed=len(traces) * 2)
    lines = [json.loads(x) for x in (pytester.path / "out" / "latest" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * sum(len(t.steps) for t in traces)
    assert {r["profile_source"] for r in lines} == {"recorded"}


def test_traces_in_a_corpus_subdirectory_use_the_corpus_lock_and_none_above_its_root(tmp_path):
    """`traces profile traces/mini-swe-agent` finds traces/workspaces.lock.json: the nearest lock from
    the directory given upward, up to the corpus root (manifest.json); none above it."""
    from pytest_agentcgroup.profile.run import lock_dir
    corpus, family = tmp_path / "corpus", tmp_path / "corpus" / "family"
    family.mkdir(parents=True)
    (corpus / "manifest.json").write_text("{}")
    assert lock_dir(family) == family                       # no lock anywhere: the directory given
    (tmp_path / "workspaces.lock.json").write_text("{}")
    assert lock_dir(family) == family                       # one above the corpus root is not this corpus's
    (corpus / "workspaces.lock.json").write_text("{}")
    assert lock_dir(family) == corpus
    (family / "workspaces.lock.json").write_text("{}")
    assert lock_dir(family) == family                       # the nearest wins
    loose = tmp_path / "scratch" / "a" / "family"             # no corpus root above: itself and its parent
    loose.mkdir(parents=True)
    (tmp_path / "scratch" / "workspaces.lock.json").write_text("{}")
    assert lock_dir(loose) == loose
    (loose.parent / "workspaces.lock.json").write_text("{}")
    assert lock_dir(loose) == loose.parent
