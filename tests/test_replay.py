"""Replay: the resource emulator reproduces a profile for real; the sandbox runs real commands
hostile-safe (no network, read-only system, own workspace) and keeps the shell's cwd across steps."""
from __future__ import annotations

import os
import shutil
import socket
import sys
import threading

import pytest

from pytest_agentcgroup.arms import Arm

from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.cgroups.node import MB
from pytest_agentcgroup.replay import EmulateExecutor, SandboxExecutor, replay
from pytest_agentcgroup.proc import SpawnError, run
from pytest_agentcgroup.traces.ir import Measure, Profile, Step, Trace


def trace_of(*steps: Step) -> Trace:
    return Trace("test/t", {"format": "test"}, tuple(steps))


def emu_step(i, peak_mb, duration_ms, cpu_ms=0.0):
    return Step(i, "bash", {"command": "x"}, duration_ms=Measure(duration_ms, "synthetic"),
                profile=Profile(peak_mb=Measure(peak_mb, "synthetic"), ramp_ms=Measure(duration_ms / 2, "synthetic"),
                                cpu_ms=Measure(cpu_ms, "synthetic")))


def test_emulator_reaches_the_recorded_peak_and_duration(tree):
    work = tree.workload("emu")
    results = replay(trace_of(emu_step(0, 200, 400, cpu_ms=150)), EmulateExecutor(time_scale=1.0),
                     ArmPlacement(Arm("unlimited"), work, tree.controllers))
    (r,) = results
    assert r.exit_code == 0 and r.executed
    assert 190 * MB <= r.counters["peak_bytes"] <= 215 * MB, r.counters
    assert 400 <= r.latency_ms < 1400
    assert r.counters["cpu_usec"] >= 150_000        # the busy time really ran (plus start-up)
    assert r.profile_source == "synthetic"


def test_time_scale_shortens_durations_not_memory(tree):
    work = tree.workload("scale")
    ex = EmulateExecutor(time_scale=0.1)
    (r,) = replay(trace_of(emu_step(0, 100, 3000)), ex, ArmPlacement(Arm("unlimited"), work, tree.controllers))
    assert r.latency_ms < 1500, "3 s recorded at 0.1x must take ~0.3 s"
    assert r.counters["peak_bytes"] >= 90 * MB


def test_emulation_is_deterministic():
    ex = EmulateExecutor(time_scale=0.5)
    ex.workdir = "/tmp"
    s = emu_step(0, 64, 1000, cpu_ms=10)
    assert ex.launch(s).argv == ex.launch(s).argv


def test_timeout_kills_the_step_and_says_so(tree):
    work = tree.workload("timeout")
    step = Step(0, "bash", {"command": "x"}, duration_ms=Measure(60_000, "synthetic"))
    (r,) = replay(trace_of(step), EmulateExecutor(time_scale=1.0, step_timeout_s=0.5),
                  ArmPlacement(Arm("unlimited"), work, tree.controllers))
    assert r.timed_out and r.signal == 9
    assert r.latency_ms < 15_000


def test_missing_program_is_a_spawn_error_not_a_traceback():
    with pytest.raises(SpawnError, match="no-such-program"):
        run(["/nonexistent/no-such-program"], timeout_s=5)


# -- sandbox -----------------------------------------------------------------------------------

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None,
                                 reason="bubblewrap (bwrap) not installed: `make setup` installs it")


def bash(i, cmd, **args):
    return Step(i, "bash", {"command": cmd, **args})


@needs_bwrap
def test_sandbox_cwd_carries_across_steps(tree):
    steps = [bash(0, "mkdir -p pkg/sub && cd pkg", cwd="/testbed"), bash(1, "cd sub"),
             bash(2, 'test "$(pwd)" = /testbed/pkg/sub'), bash(3, "cd /nonexistent-dir"), bash(4, 'test "$(pwd)" = /testbed/pkg/sub')]
    results = replay(trace_of(*steps), SandboxExecutor(step_timeout_s=20),
                     ArmPlacement(Arm("unlimited"), tree.workload("cwd"), tree.controllers))
    assert [r.exit_code for r in results] == [0, 0, 0, 2, 0]


@needs_bwrap
def test_sandbox_runs_at_real_speed_whatever_the_time_scale(tree):
    """time_scale is the emulator's: a real `sleep 0.3` takes 0.3 s and is recorded so, and the
    record's replayed duration is the trace's own (scale 1), beside its recorded duration."""
    from pytest_agentcgroup.metrics.records import step_record
    from pytest_agentcgroup.replay import make_executor
    step = Step(0, "bash", {"command": "sleep 0.3", "cwd": "/testbed"}, duration_ms=Measure(300.0, "recorded"))
    with pytest.warns(UserWarning, match="applies to the emulate executor only"):
        import pytest_agentcgroup.replay.executors as executors
        executors._warned_time_scale = False
        ex = make_executor("sandbox", time_scale=0.05, step_timeout_s=20)
    assert ex.time_scale == 1.0
    (r,) = replay(trace_of(step), ex, ArmPlacement(Arm("unlimited"), tree.workload("real"), tree.controllers))
    assert r.exit_code == 0 and r.latency_ms >= 300, r
    rec = step_record(r, step, config="unlimited", time_scale=ex.time_scale, executor="sandbox")
    assert rec["latency_ms"] >= 300
    assert (rec["replayed_duration_ms"], rec["recorded_duration_ms"], rec["duration_source"]) == (300.0, 300.0, "recorded")


@needs_bwrap
def test_sandbox_has_no_network(tree):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    threading.Thread(target=lambda: srv.accept(), daemon=True).start()
    probe = f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\""
    try:
        (r,) = replay(trace_of(bash(0, probe)), SandboxExecutor(step_timeout_s=20),
                      ArmPlacement(Arm("unlimited"), tree.workload("net"), tree.controllers))
        assert r.exit_code != 0, "a sandboxed step reached a listener outside its network namespace"
        # control: the same probe outside the sandbox connects
        ok = run([sys.executable, "-c", f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)"], timeout_s=10)
        assert ok.exit_code == 0
    finally:
        srv.close()


@needs_bwrap
def test_sandbox_system_is_read_only_and_workspace_is_writable(tree):
    steps = [bash(0, "touch /usr/agentcgroup-probe"), bash(1, "echo hi > note && cat note"),
             bash(2, "test ! -e /root/.bashrc")]
    results = replay(trace_of(*steps), SandboxExecutor(step_timeout_s=20),
                     ArmPlacement(Arm("unlimited"), tree.workload("ro"), tree.controllers))
    assert results[0].exit_code != 0
    assert results[1].exit_code == 0
    assert results[2].exit_code == 0, "the host's home directories must not be visible"


@needs_bwrap
def test_sandbox_does_not_execute_file_operations(tree):
    steps = [Step(0, "read", {"path": "/etc/passwd"}), Step(1, "noop", {}), bash(2, "true")]
    results = replay(trace_of(*steps), SandboxExecutor(step_timeout_s=20),
                     ArmPlacement(Arm("unlimited"), tree.workload("noexec"), tree.controllers))
    assert [r.executed for r in results] == [False, False, True]
    assert results[0].latency_ms is None


@needs_bwrap
def test_sandbox_step_timeout_from_the_trace(tree):
    (r,) = replay(trace_of(bash(0, "sleep 30", timeout_ms=500)), SandboxExecutor(step_timeout_s=20),
                  ArmPlacement(Arm("unlimited"), tree.workload("sbx-timeout"), tree.controllers))
    assert r.timed_out and r.signal == 9
    assert r.latency_ms < 10_000


def test_read_cwd_refuses_what_a_hostile_step_can_leave_in_its_place(tmp_path):
    from pytest_agentcgroup.replay.executors.base import read_cwd
    f = tmp_path / "cwd"
    f.write_text("/work/repo\n")
    assert read_cwd(f) == "/work/repo" and not f.exists()           # the normal case, consumed
    os.mkfifo(f)                                                      # would block a plain read forever
    assert read_cwd(f) is None and not f.exists()
    (tmp_path / "host-file").write_text("/etc/shadow-ish\n")
    f.symlink_to(tmp_path / "host-file")                              # resolves outside the step's view
    assert read_cwd(f) is None and not f.is_symlink()
    f.symlink_to("/dev/zero")
    assert read_cwd(f) is None and not f.is_symlink()
    f.write_text("/" + "a" * 10_000)                                  # no directory a shell printed
    assert read_cwd(f) is None and not f.exists()
    # a directory on the way replaced by a symlink to a host directory holding a file of that name
    root, host = tmp_path / "root", tmp_path / "host"
    (root / "run").mkdir(parents=True)
    (host / "agentcgroup").mkdir(parents=True)
    (host / "agentcgroup" / "cwd").write_text("/host/secret\n")
    (root / "run" / "agentcgroup").symlink_to(host / "agentcgroup")
    assert read_cwd("/run/agentcgroup/cwd", root=root) is None
    assert (host / "agentcgroup" / "cwd").read_text() == "/host/secret\n", "read_cwd removed a host file"
    (root / "run" / "agentcgroup").unlink()
    (root / "run" / "agentcgroup").mkdir()
    (root / "run" / "agentcgroup" / "cwd").write_text("/testbed\n")
    assert read_cwd("/run/agentcgroup/cwd", root=root) == "/testbed"
    assert not (root / "run" / "agentcgroup" / "cwd").exists()


def test_unclean_working_directories_are_refused_not_interpreted():
    from pytest_agentcgroup.replay.executors.base import StepRefused, clean_path, step_cwd, trace_home
    assert clean_path("/testbed/pkg") == "/testbed/pkg" and clean_path("/") == "/"
    for bad in ("/../../..", "/a/./b", "/a//b", "//a", "/a/", "rel/dir", "/a\nb", "/a\0b", "/" + "a" * 5000, 7, None):
        assert clean_path(bad) is None, bad
    # the home (a mount point, Docker's working_dir) is the first clean cwd, never an unclean one
    assert trace_home(trace_of(bash(0, "x", cwd="/../../.."), bash(1, "x", cwd="/srv/app"))) == "/srv/app"
    assert trace_home(trace_of(bash(0, "x", cwd="/"))) == "/workspace"
    with pytest.raises(StepRefused, match=r"step 0: args.cwd '/\.\./\.\./\.\.' is not a clean absolute path"):
        step_cwd(bash(0, "x", cwd="/../../.."))


def test_a_command_no_program_can_be_given_is_refused_with_the_reason():
    from pytest_agentcgroup.replay.executors.base import MAX_ARG_STRLEN, StepRefused, check_command
    check_command(bash(0, "x" * (MAX_ARG_STRLEN - 1)))                  # the longest that still runs
    with pytest.raises(StepRefused, match="MAX_ARG_STRLEN"):
        check_command(bash(0, "x" * MAX_ARG_STRLEN))
    with pytest.raises(StepRefused, match="NUL byte"):
        check_command(bash(0, "echo a\0b"))


def test_an_edit_is_cut_into_arguments_between_characters_and_joins_back_whole():
    from pytest_agentcgroup.replay.executors.base import argv_pieces
    text = "a" + "é€😀" * 40 + "z"                    # 1- to 4-byte characters
    stray = "x\udc80\udcff" * 9 + "😀"                # and bytes that are no character (surrogateescape)
    for limit in range(4, 12):
        pieces = argv_pieces(text, limit)
        assert all(0 < len(p) <= limit for p in pieces)
        assert "".join(p.decode("utf-8") for p in pieces) == text, "each piece is whole characters"
        pieces = argv_pieces(stray, limit)
        assert all(0 < len(p) <= limit for p in pieces)
        assert "".join(p.decode("utf-8", "surrogateescape") for p in pieces) == stray
    assert argv_pieces("") == [b""]


_MOUNT_AND_WAIT = """
import sys, time
from pytest_agentcgroup.replay import SandboxExecutor
from pytest_agentcgroup.traces.ir import Step, Trace
ex = SandboxExecutor(workspace_mb=8)
ex.start(Trace("t/killed", {"format": "test"}, (Step(0, "bash", {"command": "true"}),)))
open(ex.base + "/ws/left-behind", "wb").write(b"x" * (1 << 20))
print(ex.base, flush=True)
time.sleep(120)
"""


def _mounted(point: str) -> bool:
    return any(line.split()[4] == point for line in open("/proc/self/mountinfo"))


@pytest.mark.root
def test_a_sandbox_tmpfs_left_by_a_killed_run_is_swept_at_the_next_start(tmp_path):
    """A real pytest-like process mounts its per-trace tmpfs and is SIGKILLed (its stop() never
    runs): the next sandbox start unmounts it; a live owner's mount is left alone."""
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("the sandbox mounts its per-trace tmpfs only as root")
    killed = subprocess.Popen([sys.executable, "-c", _MOUNT_AND_WAIT], stdout=subprocess.PIPE, text=True)
    live = subprocess.Popen([sys.executable, "-c", _MOUNT_AND_WAIT], stdout=subprocess.PIPE, text=True)
    try:
        stale, alive = killed.stdout.readline().strip(), live.stdout.readline().strip()
        killed.kill()
        killed.wait(10)
        assert _mounted(stale) and _mounted(alive), "the helper processes did not mount their tmpfs"
        ex = SandboxExecutor(workspace_mb=8)
        ex.start(trace_of(bash(0, "true")))
        try:
            assert not _mounted(stale) and not os.path.exists(stale), "a dead run's tmpfs is still mounted"
            assert _mounted(alive), "a live run's tmpfs was unmounted"
        finally:
            ex.stop()
    finally:
        for proc in (killed, live):
            proc.kill()
            proc.wait(10)
        from pytest_agentcgroup.replay.executors.sandbox import sweep_stale_workspaces
        sweep_stale_workspaces()                      # the live helper is dead now: its mount goes too
    assert not _mounted(alive)
