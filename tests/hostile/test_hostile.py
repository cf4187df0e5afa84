"""Hostile commands, replayed for real (a Trace built here, `replay()` in real cgroups), under the
sandbox and the docker executor. Replayed commands come from public datasets; each case here is
what such a command could try, written as a canary: if containment fails, what the step changes is
a uniquely named new file, one harmless sysctl (restored), a bounded allocation, a few sleeps —
never anything existing. Each case asserts both that the host is untouched and that the step's
record says what happened (exit code, signal, timed_out, error, oom_kills, pids_max_events).

Layout-agnostic: limits are set and read through the project's Arm/Cgroup API (v1 names on the
hybrid host, v2 names in a pure-v2 VM), and the step scripts try both layouts' file names.
"""
from __future__ import annotations

import ctypes
import os
import pickle
import secrets
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_agentcgroup.arms import Arm

from pytest_agentcgroup.cgroups.placement import ArmPlacement
from pytest_agentcgroup.replay import SandboxExecutor, replay, stepguard
from pytest_agentcgroup.traces.ir import Step, Trace

IS_ROOT = os.geteuid() == 0
ESCAPED = 42        # a probe exits with this when it got through: never expected
CONTAINED = 3       # ... and with this when every attempt was refused
ALLOC_1G = ("python3 -c 'b = bytearray(1 << 30); b[::4096] = b\"x\" * len(b[::4096])' && exit 42; "
            "exit $?")                                          # 137 when the OOM killer ends it
# sizes the tests give the executors' writable places (MiB): small, so a probe that fills them is cheap
SANDBOX_MB = {"workspace": 64, "tmp": 32}
DOCKER_MB = {"home": 64, "/tmp": 32, "/root": 16, "/run/agentcgroup": 1}


def bash(i: int, cmd: str, **args) -> Step:
    return Step(i, "bash", {"command": cmd, **args})


@dataclass
class Hostile:
    """Replays steps under one executor kind in this test's cgroups."""
    kind: str
    tree: object
    engine: object = None
    image: str | None = None        # docker: the executor's default unless set

    def executor(self, work):
        if self.kind == "sandbox":
            return SandboxExecutor(step_timeout_s=30, workspace_mb=SANDBOX_MB["workspace"], tmp_mb=SANDBOX_MB["tmp"]), None
        from pytest_agentcgroup.cgroups.container import cgroup_parent, steps_in_container
        from pytest_agentcgroup.replay import DockerExecutor
        ex = DockerExecutor(self.engine, cgroup_parent=cgroup_parent(self.tree, work), step_timeout_s=30,
                            tmpfs_mb=DOCKER_MB, image=self.image)
        return ex, steps_in_container(self.tree, work, ex)

    def run(self, name: str, steps, arm: Arm = Arm("unlimited"), on_step=None):
        work = self.tree.workload(f"{self.kind}-{name}")
        ex, nest_in = self.executor(work)
        placement = ArmPlacement(arm, work, self.tree.controllers, nest_in=nest_in)
        trace = Trace(f"hostile/{name}", {"format": "test"}, tuple(steps))
        results = replay(trace, ex, placement, on_step=(lambda r: on_step(ex, r)) if on_step else None)
        for r in results:
            assert r.error is None or not r.executed, r
        return results


@pytest.fixture(params=["sandbox", "docker"])
def hostile(request, tree):
    if request.param == "sandbox":
        if shutil.which("bwrap") is None:
            pytest.skip("bubblewrap (bwrap) not installed: `make setup` installs it")
        return Hostile("sandbox", tree)
    return Hostile("docker", tree, request.getfixturevalue("agentcgroup_docker"))


def needs_root(why: str):
    if not IS_ROOT:
        pytest.skip(f"needs root: {why}")


def canary_name() -> str:
    return f"agentcgroup-canary-{secrets.token_hex(8)}"


def host_processes_with(marker: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                pass
    return found


# -- the system directories, /proc/sys, cgroups ----------------------------------------------

def test_remount_and_write_etc_and_usr(hostile):
    name = canary_name()
    canaries = [Path("/etc", name), Path("/usr", name)]
    probe = ("for d in /etc /usr; do mount -o remount,bind,rw $d 2>/dev/null; "
             f"touch $d/{name} 2>/dev/null; test -e $d/{name} && exit {ESCAPED}; done; exit {CONTAINED}")
    try:
        (r,) = hostile.run("remount", [bash(0, probe)])
        assert not any(c.exists() for c in canaries), "a step wrote the host's /etc or /usr"
        assert r.executed and r.exit_code == CONTAINED, r
    finally:
        for c in canaries:
            c.unlink(missing_ok=True)


SYSCTL = Path("/proc/sys/fs/lease-break-time")   # global (not per-namespace), harmless: file lease timeout


def test_write_proc_sys(hostile):
    if not SYSCTL.exists():
        pytest.skip(f"{SYSCTL} not present on this kernel")
    before = SYSCTL.read_text()
    f = str(SYSCTL)
    probe = (f"v=$(cat {f}); echo $((v + 1)) > {f} 2>/dev/null; "
             f'[ "$(cat {f})" != "$v" ] && exit {ESCAPED}; exit {CONTAINED}')
    try:
        (r,) = hostile.run("procsys", [bash(0, probe)])
        assert SYSCTL.read_text() == before, "a step changed a host sysctl"
        assert r.executed and r.exit_code == CONTAINED, r
    finally:
        if SYSCTL.read_text() != before:
            SYSCTL.write_text(before)


def test_no_user_namespace_and_no_mounts(hostile):
    # a user namespace is the usual door to capabilities (and kernel bugs) without privilege
    probe = ("unshare -Ur true 2>/dev/null && exit 42; mkdir -p /tmp/p; "
             "mount -t proc proc /tmp/p 2>/dev/null && exit 42; mount -t tmpfs none /tmp/p 2>/dev/null && exit 42; "
             f"mount -t sysfs none /tmp/p 2>/dev/null && exit 42; exit {CONTAINED}")
    (r,) = hostile.run("nsmount", [bash(0, probe)])
    assert r.executed and r.exit_code == CONTAINED, r


def test_no_user_namespace_even_without_mapping_ids(hostile):
    # `unshare -U` alone needs no uid map: a process in a user namespace of its own holds every
    # capability over namespaces it then makes (mount, tmpfs without a size, kernel attack surface)
    probe = ("unshare -U true 2>/dev/null && exit 42; unshare -U -m true 2>/dev/null && exit 42; "
             "python3 -c 'import ctypes, sys; sys.exit(ctypes.CDLL(None).unshare(0x10000000))' 2>/dev/null && exit 42; "
             f"exit {CONTAINED}")
    (r,) = hostile.run("userns", [bash(0, probe)])
    assert r.executed and r.exit_code == CONTAINED, r


# A canary, not a weapon: the step only attaches without stopping (PTRACE_SEIZE, let go when the
# step exits) and only opens pid 1's memory for writing (nothing is written).
PTRACE_INIT = (
    "python3 -c '\n"
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "if libc.ptrace(0x4206, 1, 0, 0) == 0: sys.exit(42)\n"
    "try:\n"
    "    os.close(os.open(\"/proc/1/mem\", os.O_RDWR)); sys.exit(42)\n"
    "except PermissionError: pass\n"
    f"sys.exit({CONTAINED})'")


def test_cannot_ptrace_or_write_the_memory_of_pid_1(hostile):
    # pid 1 of a docker step's PID namespace is the container's init: it lives in the container's
    # cgroup, outside every step's limits, outlives the step and reaps the steps after it, so a step
    # controlling it would run code unlimited and unkilled. Under the sandbox pid 1 is that step's
    # own bwrap, in the step's cgroup, gone with the step, with nothing the step lacks: no target.
    if hostile.kind == "sandbox":
        pytest.skip("the sandbox's pid 1 is the step's own bwrap (same cgroup, uid, capabilities, lifetime)")
    (r,) = hostile.run("ptrace", [bash(0, PTRACE_INIT)])
    assert r.executed and r.exit_code == CONTAINED, r


def test_a_state_directory_swapped_for_a_symlink_reaches_no_host_file(hostile, tmp_path):
    # After each step the executor reads (and removes) the file where the step's shell left its
    # working directory, through /proc/<init>/root/run/agentcgroup/cwd. In an image whose root is
    # writable (SWE-rebench's), a step can move /run away and put a symlink to a host path there:
    # followed from the host, it would read and delete the host's <path>/agentcgroup/cwd. On
    # overlayfs (dockerd's usual storage driver) the kernel refuses to rename the image's /run
    # (EXDEV; mv's copy cannot remove the mount inside), so there the swap fails and only the
    # canary's survival is checked; where it succeeds (vfs, btrfs drivers) the walk is what holds.
    # tests/test_replay.py proves the walk itself on a tree where the swap is in place.
    if hostile.kind == "sandbox":
        pytest.skip("the sandbox's state directory is a bind of a directory in a root-owned 0711 tmpfs: "
                    "the step cannot replace it (tests/test_replay.py covers read_cwd's walk)")
    from pytest_agentcgroup.engines.docker import LOCAL_IMAGE
    writable = "agentcgroup-hostile-writable-root:latest"     # not LOCAL_IMAGE's name: a writable root
    hostile.engine.client.images.get(hostile.engine.ensure_image(LOCAL_IMAGE)).tag(writable)
    hostile.image = writable
    host = tmp_path / "host"
    (host / "agentcgroup").mkdir(parents=True)
    canary = host / "agentcgroup" / "cwd"
    canary.write_text("/canary-dir\n")
    try:
        results = hostile.run("statelink", [
            bash(0, f"mv /run /run.moved 2>/dev/null && ln -s {host} /run && exit 0; exit 9"),
            bash(1, f'[ "$(pwd)" = /canary-dir ] && exit {ESCAPED}; exit 0')])
    finally:
        hostile.engine.client.images.remove(writable, noprune=True)
    assert results[0].executed and results[0].exit_code in (0, 9), results[0]   # swapped / refused
    assert canary.read_text() == "/canary-dir\n", "the executor read through the step's symlink and removed a host file"
    assert results[1].executed and results[1].exit_code == 0, results[1]


# Try to reach the step's own cgroup files: a freshly mounted cgroupfs of each kind (its root is
# the step's own cgroup where the cgroup namespace is unshared) and whatever /sys/fs/cgroup shows.
CGROUP_FILES = ("mkdir -p /tmp/cgm /tmp/cgp /tmp/cg2; mount -t cgroup -o memory none /tmp/cgm 2>/dev/null; "
                "mount -t cgroup -o pids none /tmp/cgp 2>/dev/null; mount -t cgroup2 none /tmp/cg2 2>/dev/null; "
                "files() { find /tmp/cgm /tmp/cgp /tmp/cg2 /sys/fs/cgroup -maxdepth 4 -name \"$1\" 2>/dev/null; }; ")


def test_mount_cgroupfs_raise_own_limits_then_allocate_past_the_arm(hostile):
    # also from a user + cgroup namespace of its own, where mounting cgroup2 needs no host capability
    in_userns = ("unshare -Urmc sh -c 'mkdir -p /tmp/cgu && mount -t cgroup2 none /tmp/cgu && "
                 "for f in memory.max memory.high pids.max; do echo max > /tmp/cgu/$f; done' 2>/dev/null; ")
    raise_limits = in_userns + ("for f in $(files memory.limit_in_bytes; files memory.memsw.limit_in_bytes); do echo -1 > $f; done 2>/dev/null; "
                    "for f in $(files memory.max; files memory.high; files pids.max); do echo max > $f; done 2>/dev/null; ")
    (r,) = hostile.run("cgroupfs", [bash(0, CGROUP_FILES + raise_limits + ALLOC_1G)],
                       Arm("mem256", memory_max_mb=256, pids_max=64))
    assert r.executed and r.exit_code == 128 + 9, r            # the allocation was killed ...
    assert r.counters["oom_kills"] >= 1, r.counters            # ... by the arm's limit, which held


def test_move_out_of_its_cgroup_then_allocate_past_the_arm(hostile):
    move = 'for f in $(files cgroup.procs); do echo $$ > $f; done 2>/dev/null; '
    (r,) = hostile.run("moveout", [bash(0, CGROUP_FILES + move + ALLOC_1G)], Arm("mem256", memory_max_mb=256))
    assert r.executed and r.exit_code == 128 + 9, r
    assert r.counters["oom_kills"] >= 1, r.counters


# -- secrets and the network -------------------------------------------------------------------

def test_read_a_host_secret(hostile):
    needs_root("the canary secret is a root-owned 0600 file in /etc")
    secret, token = Path("/etc", canary_name()), secrets.token_hex(16)
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, token.encode())
        os.close(fd)
        probe = (f"for f in {secret} /proc/1/root{secret} /proc/1/cwd{secret}; do "
                 f"grep -qs {token} $f && exit {ESCAPED}; done; exit {CONTAINED}")
        (r,) = hostile.run("secret", [bash(0, probe)])
        assert r.executed and r.exit_code == CONTAINED, r
    finally:
        secret.unlink()


def test_connect_to_a_host_loopback_listener(hostile):
    srv = socket.create_server(("127.0.0.1", 0))
    port, accepted = srv.getsockname()[1], []

    def accept():
        try:
            accepted.append(srv.accept())
        except OSError:             # closed at the end of the test: nothing connected
            pass
    threading.Thread(target=accept, daemon=True).start()
    probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\" "
             f"2>/dev/null && exit {ESCAPED}; exit {CONTAINED}")
    try:
        (r,) = hostile.run("loopback", [bash(0, probe)])
        time.sleep(0.2)
        assert not accepted, "a step reached a listener on the host's loopback"
        assert r.executed and r.exit_code == CONTAINED, r
    finally:
        srv.close()


# -- kernel keys -----------------------------------------------------------------------------

KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_INVALIDATE = 1, 21
KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING = -3, -4
NOT_FOUND = 4       # a key probe reached the key API but found nothing: keys not denied
SEEN = 43           # ... found the canary key (searched or listed in /proc/keys) without reading it


def _keycall(nr: int, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def add_canary_key(ring: int) -> tuple[int, str, str]:
    """A "user" key of a unique name and random payload in `ring` (KEY_SPEC_*): (serial, name, payload)."""
    name, payload = canary_name(), secrets.token_hex(16)
    serial = _keycall(stepguard.native_calls().add_key, b"user", name.encode(), payload.encode(), len(payload), ring)
    return serial, name, payload


def invalidate_key(serial: int) -> None:
    try:
        _keycall(stepguard.native_calls().keyctl, KEYCTL_INVALIDATE, serial)
    except OSError:
        pass


def key_probe(name: str, payload: str) -> str:
    """A step that looks for the canary key in its user and session keyrings (KEYCTL_SEARCH, then
    KEYCTL_READ) and in /proc/keys: ESCAPED if it read the payload, SEEN if it found the key
    otherwise, CONTAINED if every key call got EPERM, NOT_FOUND if they went through and found nothing."""
    nr = stepguard.native_calls()
    return ("python3 -c '\n"
            "import ctypes, os, sys\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.syscall.restype = ctypes.c_long\n"
            "errs = set()\n"
            "for ring in (-4, -3):\n"
            f"    key = libc.syscall(ctypes.c_long({nr.keyctl}), ctypes.c_long(10), ctypes.c_long(ring), "
            f"b\"user\", b\"{name}\", ctypes.c_long(0))\n"
            "    if key < 0:\n"
            "        errs.add(ctypes.get_errno()); continue\n"
            "    buf = ctypes.create_string_buffer(256)\n"
            f"    n = libc.syscall(ctypes.c_long({nr.keyctl}), ctypes.c_long(11), ctypes.c_long(key), buf, ctypes.c_long(256))\n"
            f"    sys.exit({ESCAPED} if buf.raw[:max(n, 0)] == b\"{payload}\" else {SEEN})\n"
            "try:\n"
            f"    if b\"{name}\" in open(\"/proc/keys\", \"rb\").read(): sys.exit({SEEN})\n"
            "except OSError: pass\n"
            f"sys.exit({CONTAINED} if errs == {{1}} else {NOT_FOUND})'")


KEY_API = ("python3 -c '\n"
           "import ctypes, sys\n"
           "libc = ctypes.CDLL(None, use_errno=True)\n"
           "libc.syscall.restype = ctypes.c_long\n"
           "L = ctypes.c_long\n"
           "calls = [({keyctl}, L(0), L(-3), L(0)),\n"                                  # KEYCTL_GET_KEYRING_ID
           "         ({add_key}, b\"user\", b\"agentcgroup-probe\", b\"x\", L(1), L(-3)),\n"
           "         ({request_key}, b\"user\", b\"agentcgroup-probe\", None, L(0))]\n"
           "errs = []\n"
           "for nr, *args in calls:\n"
           "    if libc.syscall(L(nr), *args) >= 0: sys.exit(42)\n"
           "    errs.append(ctypes.get_errno())\n"
           "print(errs)\n"
           "sys.exit(3 if errs == [1, 1, 1] else 5)'")


def test_the_key_api_is_denied_with_eperm(hostile):
    # as under Docker's default seccomp profile: keyctl, add_key, request_key fail with EPERM
    nr = stepguard.native_calls()
    (r,) = hostile.run("keyapi", [bash(0, KEY_API.format(keyctl=nr.keyctl, add_key=nr.add_key,
                                                         request_key=nr.request_key))])
    assert r.executed and r.exit_code == CONTAINED, r


def test_cannot_read_a_key_in_the_user_keyring_of_pytests_uid(hostile):
    # under docker the step is uid 0 of the host's user namespace: root's user keyring is its own
    serial, name, payload = add_canary_key(KEY_SPEC_USER_KEYRING)
    try:
        (r,) = hostile.run("userkey", [bash(0, key_probe(name, payload))])
    finally:
        invalidate_key(serial)
    assert r.executed and r.exit_code == CONTAINED, r


def replay_in_a_session_keyring(run):
    """run() in a forked child of pytest whose session keyring is an explicit named one (as a login
    or ssh session has) holding a canary key; returns what run(name, payload) returned. The child
    joins the keyring, so pytest's own session keyring is untouched."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:                                            # the child: never returns into pytest
        try:
            os.close(rfd)
            _keycall(stepguard.native_calls().keyctl, KEYCTL_JOIN_SESSION_KEYRING, canary_name().encode())
            serial, name, payload = add_canary_key(KEY_SPEC_SESSION_KEYRING)
            try:
                out = ("ok", run(name, payload))
            finally:
                invalidate_key(serial)
        except BaseException as exc:
            out = ("error", f"{type(exc).__name__}: {exc}")
        try:
            with os.fdopen(wfd, "wb") as f:
                f.write(pickle.dumps(out))
        finally:
            os._exit(0)
    os.close(wfd)
    # a bounded wait: the fork is from a pytest that may run threads (tests/background.py), and a
    # child that inherited a lock held by one of them would wait forever
    with os.fdopen(rfd, "rb") as f:
        ready, _, _ = select.select([f], [], [], 300)
        data = f.read() if ready else b""
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert ready, "the forked replay did not finish within 300 s (killed)"
    kind, value = pickle.loads(data)
    assert kind == "ok", value
    return value


def test_cannot_read_a_key_in_the_session_keyring_pytest_was_started_in(hostile):
    if hostile.engine is not None:
        # the docker client's pooled connections are the parent's too: the child opens its own
        hostile.engine.client.api.close()

    def run(name, payload):
        (r,) = hostile.run("sessionkey", [bash(0, key_probe(name, payload))])
        return r.executed, r.exit_code, repr(r)
    executed, exit_code, record = replay_in_a_session_keyring(run)
    assert executed and exit_code == CONTAINED, record


# -- processes: fork bomb, daemons, endless loops, killing its parent --------------------------

def test_fork_bomb_is_bounded_by_the_arms_pids_max(hostile):
    marker = f"30.{secrets.randbelow(10**6):06d}"      # a sleep this test's steps alone run
    bomb = f"i=0; while [ $i -lt 300 ]; do sleep {marker} & i=$((i + 1)); done; exit 0"
    results = hostile.run("forkbomb", [bash(0, bomb), bash(1, "exit 0")], Arm("pids32", pids_max=32))
    assert not host_processes_with(marker), "processes of the fork bomb outlived its step"
    r = results[0]
    assert r.executed and not r.timed_out and r.exit_code != 0, r   # the shell's fork failed
    assert r.counters["pids_max_events"] >= 1, r.counters
    assert results[1].exit_code == 0, results[1]


def zombies_of(pid: int) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = dict(ln.split(":\t", 1) for ln in (d / "status").read_text().splitlines() if ":\t" in ln)
            except (OSError, ValueError):
                continue
            if status.get("PPid") == str(pid) and status.get("State", "").startswith("Z"):
                found.append(int(d.name))
    return found


def test_daemons_do_not_outlive_their_step(hostile):
    marker = f"300.{secrets.randbelow(10**6):06d}"
    daemons = (f"setsid sleep {marker} </dev/null >/dev/null 2>&1 & "
               f"(nohup sleep {marker} </dev/null >/dev/null 2>&1 &) ; "
               f"sh -c 'sleep {marker} & exit 0'; exit 0")
    zombies = []

    def look(ex, r):            # docker: orphans are re-parented to the container's init, which must reap them
        if getattr(ex, "init_pid", None):
            deadline = time.monotonic() + 3
            while zombies_of(ex.init_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            zombies.append(zombies_of(ex.init_pid))
    results = hostile.run("daemons", [bash(0, daemons), bash(1, "exit 0")], on_step=look)
    assert not host_processes_with(marker), "a daemon outlived its step"
    assert results[0].executed and results[0].exit_code == 0 and not results[0].timed_out, results[0]
    assert results[0].latency_ms < 10_000, "the step waited for its daemons"
    assert results[1].exit_code == 0
    assert not any(zombies), f"zombies left under the container's init: {zombies}"


def test_endless_loop_is_ended_at_its_timeout(hostile):
    results = hostile.run("loop", [bash(0, "while :; do :; done", timeout_ms=1000), bash(1, "exit 0")])
    r = results[0]
    assert r.executed and r.timed_out and r.signal == 9, r
    assert r.latency_ms < 10_000, r
    assert results[1].exit_code == 0


def test_killing_its_parent_and_everything_reaches_only_the_step(hostile):
    # a host process of the same uid the sandboxed step runs as (nobody), which kill -9 -1 must not reach
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if IS_ROOT else []
    canary = subprocess.Popen([*drop, "sleep", "120"])
    try:
        # A canary, not a weapon: kill -9 -1 is sent only from a PID namespace other than the host's.
        # Were the namespace lost (a regression), the step exits 42 instead of killing every process
        # its uid may signal (as docker's root: the whole host), and the assertions below fail.
        host_pidns = os.readlink("/proc/self/ns/pid")
        guard = f'[ "$(readlink /proc/self/ns/pid)" = "{host_pidns}" ] && exit 42; '
        results = hostile.run("killparent", [bash(0, "kill -9 $PPID; sleep 2; exit 5"),
                                             bash(1, guard + "kill -9 -1; sleep 2; exit 5"), bash(2, "exit 0")])
        assert canary.poll() is None, "kill -9 -1 from a step reached a host process"
    finally:
        canary.kill()
        canary.wait()
    for r in results[:2]:
        assert r.executed and not r.timed_out and r.latency_ms < 10_000, r
    if hostile.kind == "sandbox":
        # the step's parent is pid 1 of its PID namespace (bwrap's), which ignores signals from
        # inside; kill -1 does not signal the caller: the shell goes on to its own exit
        assert [(r.exit_code, r.signal) for r in results[:2]] == [(5, None), (5, None)], results
    else:
        # nsenter, the step's parent, is outside the container: $PPID is 0 there, and `kill -9 0`
        # kills the step's own process group (nsenter re-raises its signal); kill -1 spares the caller
        assert [(r.exit_code, r.signal) for r in results[:2]] == [(None, 9), (5, None)], results
    assert results[2].exit_code == 0, "the executor did not survive a step's kill -9 -1"


# -- output and the disk -----------------------------------------------------------------------

def test_gigabytes_to_stdout_go_nowhere(hostile):
    (r,) = hostile.run("stdout", [bash(0, "head -c 3G /dev/zero")])
    assert r.executed and r.exit_code == 0 and not r.timed_out, r


def tmpfs_size_mb(mountinfo: Path, mount_point: str) -> int | None:
    """The size (MiB) of the tmpfs mounted at mount_point per mountinfo, None if it is no tmpfs."""
    for line in mountinfo.read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[4] == mount_point and fields[sep + 1] == "tmpfs":
            opts = dict(o.split("=", 1) if "=" in o else (o, "") for o in fields[sep + 3].split(","))
            size = opts.get("size", "")
            return int(size[:-1]) // 1024 if size.endswith("k") else None
    return None


def test_filling_the_disk_ends_in_enospc_in_every_writable_place(hostile):
    if hostile.kind == "sandbox":
        needs_root("the sandbox bounds its workspace with a tmpfs it mounts per trace")
        places = {"$PWD": SANDBOX_MB["workspace"], "/tmp": SANDBOX_MB["tmp"],
                  SandboxExecutor.STATE: SANDBOX_MB["workspace"]}
    else:
        places = {"$PWD": DOCKER_MB["home"], "/tmp": DOCKER_MB["/tmp"], "/root": DOCKER_MB["/root"],
                  "/run/agentcgroup": DOCKER_MB["/run/agentcgroup"]}
    # each write must fail (ENOSPC) with the file no larger than its place's bound; a canary: where
    # nothing bounds a place, it writes 4x the bound (at most 256 MiB), not the disk full
    fill = "".join(f'if head -c {mb * 4}M /dev/zero > "{d}/fill" 2>/dev/null; then rm -f "{d}/fill"; exit {ESCAPED}; fi; '
                   f's=$(stat -c %s "{d}/fill"); rm -f "{d}/fill"; [ "$s" -gt {mb << 20} ] && exit {ESCAPED}; '
                   for d, mb in places.items())
    mounts = {}

    def look(ex, r):           # the host side of the workspace: a tmpfs of the given size, not the disk
        if hostile.kind == "sandbox":
            mounts["workspace"] = tmpfs_size_mb(Path("/proc/self/mountinfo"), getattr(ex, "base", None))
        else:
            mounts["workspace"] = tmpfs_size_mb(Path(f"/proc/{ex.init_pid}/mountinfo"), ex.home)
    results = hostile.run("disk", [bash(0, fill + "exit 28", cwd="/testbed"), bash(1, "echo ok > note && cat note")],
                          on_step=look)
    assert results[0].executed and results[0].exit_code == 28, results[0]     # 28: ENOSPC, everywhere
    assert results[1].exit_code == 0, "the workspace is not usable again after the fill was removed"
    assert mounts["workspace"] == (SANDBOX_MB["workspace"] if hostile.kind == "sandbox" else DOCKER_MB["home"]), mounts


# -- input that cannot be run as recorded --------------------------------------------------------

@pytest.mark.parametrize("size", [200 << 10, 50 << 20], ids=["200KiB", "50MiB"])
def test_a_command_too_long_to_run_is_refused_with_the_reason(hostile, size):
    # 200 KiB: under the total argv limit (ARG_MAX) but over one string's (MAX_ARG_STRLEN), where
    # the exec inside the executor's wrapper failed (exit 126); 50 MiB: over both (E2BIG at spawn)
    results = hostile.run("longcmd", [bash(0, "true # " + "x" * size), bash(1, "exit 0")])
    r = results[0]
    assert not r.executed and r.exit_code is None, r
    assert "MAX_ARG_STRLEN" in r.error and "not executed" in r.error, r.error
    assert results[1].exit_code == 0


def test_an_unclean_cwd_is_refused_with_the_reason(hostile):
    results = hostile.run("cwd", [bash(0, "exit 0", cwd="/../../.."), bash(1, "pwd > where; exit 0"),
                                  bash(2, "exit 0", cwd="/testbed/../../etc"), bash(3, "exit 0", cwd="/srv/x")])
    assert not results[0].executed and "args.cwd '/../../..' is not a clean absolute path" in results[0].error
    assert not results[2].executed and "is not a clean absolute path" in results[2].error
    assert results[1].exit_code == 0 and results[3].exit_code == 0, results
