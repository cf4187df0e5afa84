"""The `sandbox` executor: a step's real command under bubblewrap, as an unprivileged user."""
from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ...errors import ExecutorUnavailable
from ...proc import start_ticks
from ...programs import require
from ...traces.ir import Step, Trace
from .base import (DEFAULT_TIMEOUT_S, EXECUTING_TOOLS, Launch, Seed, SeedFailed, check_command, check_seed_places,
                   copy_tree, edit_argv, guarded, inside, read_cwd, require_stepguard, step_cwd, step_script, step_timeout, trace_home)


SANDBOX_TMPFS = "agentcgroup-ws"           # the source name of the sandbox's per-trace tmpfs
# its mount point: a temp directory named for the process that mounted it (pid + start ticks)
_SANDBOX_BASE = re.compile(r"^agentcgroup-sbx-(\d+)-(\d+)-")


def _unescape_mountinfo(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def sweep_stale_workspaces(mountinfo: str | Path = "/proc/self/mountinfo") -> list[str]:
    """Unmount (and remove) the sandbox tmpfs mounts whose owner is gone: a pytest SIGKILLed
    mid-trace never reaches SandboxExecutor.stop(), and its tmpfs (and whatever the steps left in
    it, in memory) would stay mounted. Ours: tmpfs of source SANDBOX_TMPFS at a directory named
    agentcgroup-sbx-<pid>-<start ticks>-*; gone: no process with that pid and start time. Mounts of
    live sessions are left alone. Returns the mount points removed."""
    removed = []
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return removed
    for line in lines:
        fields = line.split()
        try:
            sep = fields.index("-")
            point, fstype, source = _unescape_mountinfo(fields[4]), fields[sep + 1], fields[sep + 2]
        except (ValueError, IndexError):
            continue
        owner = _SANDBOX_BASE.match(os.path.basename(point))
        if fstype != "tmpfs" or source != SANDBOX_TMPFS or owner is None:
            continue
        if start_ticks(int(owner[1])) == int(owner[2]):
            continue                                   # its session still runs
        if subprocess.run(["umount", "--lazy", point], capture_output=True).returncode == 0:
            try:
                os.rmdir(point)
            except OSError:
                pass
            removed.append(point)
    return removed


class SandboxExecutor:
    """The step's real command under bubblewrap, as an unprivileged user.

    Commands come from public datasets, so they are hostile by default:
    - started as root, bwrap runs as `nobody` (setpriv: real and effective uid/gid 65534, no
      supplementary groups, empty capability sets and bounding set, no_new_privs) — the step has no
      capability anywhere, so it cannot remount the read-only /usr and /etc, mount a cgroupfs or
      proc, or write /proc/sys; it sees no /sys at all, and cannot make user namespaces of its own.
      The join into the step's cgroups happens before that, as root (proc.py), so the step starts
      inside them and cannot leave them (no cgroupfs it could write). Without root, bwrap runs as
      the calling user (no capabilities either), but the workspace is then an unbounded directory;
    - the per-trace workspace (mounted at the trace's working directory) and the state directory
      live in one tmpfs of `workspace_mb` (default 1 GiB) that we mount per trace, so a step that
      fills it gets ENOSPC and nothing reaches the host's disk; its pages are charged to the memory
      cgroup of the step that wrote them. /tmp is a fresh tmpfs of `tmp_mb` (default 256 MiB);
    - no network (own network namespace with loopback only), own PID namespace (`kill -9 -1`
      reaches only the step's own processes), the session's own process group, killed with its
      parent, and a per-step timeout;
    - no kernel keys: the steps' seccomp guard (stepguard.py, wrapping setpriv and bwrap) starts the
      step in a new, empty session keyring (the one pytest was started in, a login's or ssh's, is
      inherited across setpriv and bwrap and possessed whatever the uid) and makes keyctl, add_key
      and request_key fail with EPERM. It leaves user namespaces to bwrap (which needs one, and
      denies the step more with --disable-userns). It costs each step a Python start.
    The working directory carries across steps as in an agent's persistent shell: each step starts
    where the previous one ended (`cd` included). A `seed` (base.Seed, set before start) is copied
    into the workspace, mounted at the task's path, and its Python environment beside it, at the
    path the agent's interpreter had, first on PATH; a recorded edit is applied by the step's user
    with editor.py, through the same sandbox.
    """
    name = "sandbox"
    time_scale = 1.0            # real commands at real speed: time_scale is the emulator's only
    STATE = "/.agentcgroup-state"
    # `nobody` needs no set-up on any Debian host or VM (base-passwd), owns no files on a normal
    # host, and the step sees none of the host's files anyway (only read-only /usr and /etc);
    # its own PID namespace keeps it from signalling other processes of that user.
    STEP_USER = "nobody"

    def __init__(self, *, step_timeout_s: float = DEFAULT_TIMEOUT_S, bwrap: str | None = None,
                 workspace_mb: int = 1024, tmp_mb: int = 256):
        require_stepguard("sandbox")
        self.bwrap = bwrap or require("bwrap", needed_by="the sandbox executor")
        self.step_timeout_s = step_timeout_s
        self.workspace_mb, self.tmp_mb = workspace_mb, tmp_mb
        # as root: drop to STEP_USER (and bound the workspace); as anyone else: bwrap as that user
        self.as_root = os.geteuid() == 0
        self.setpriv = require("setpriv", needed_by="the sandbox executor, run as root,") if self.as_root else None
        try:
            entry = pwd.getpwnam(self.STEP_USER)
            self.step_uid, self.step_gid = entry.pw_uid, entry.pw_gid
        except KeyError:
            self.step_uid = self.step_gid = 65534      # the kernel's overflow id, what nobody is on Debian
        self.base = self.workspace = self.state = None
        self.bounded = False            # True: workspace + state dir are our size-limited tmpfs
        self.home = "/workspace"
        self.cwd = self.home
        self.seed: Seed | None = None
        self.mounts: list[tuple[str, str]] = []     # (directory under base, where the steps see it)
        self.system = "/"                           # the root whose /usr and /etc the steps see

    def start(self, trace: Trace) -> None:
        check_seed_places(self.seed, "sandbox", (self.STATE,))
        self.home = trace_home(trace)
        self.cwd = self.home
        if self.as_root:
            sweep_stale_workspaces()         # left by an earlier run that was killed mid-trace
        self.base = tempfile.mkdtemp(prefix=f"agentcgroup-sbx-{os.getpid()}-{start_ticks(os.getpid())}-")
        if self.as_root:
            # bwrap, as STEP_USER, must traverse base to bind ws and state: 0711, nothing listable
            os.chmod(self.base, 0o711)
            opts = f"size={int(self.workspace_mb)}m,mode=0711,nosuid,nodev"
            done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, SANDBOX_TMPFS, self.base],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                os.rmdir(self.base)
                self.base = None
                raise ExecutorUnavailable(f"the sandbox executor cannot mount its size-limited workspace "
                                          f"(tmpfs, {opts}): {done.stderr.strip() or done.returncode}")
            self.bounded = True
        self.workspace, self.state = os.path.join(self.base, "ws"), os.path.join(self.base, "state")
        seed = self.seed
        where = seed.path if seed is not None else self.home
        self.mounts = [(self.workspace, where)]
        if not inside(self.home, where):
            self.mounts.append((os.path.join(self.base, "home"), self.home))
        if seed is not None and seed.env_path:
            self.mounts.append((os.path.join(self.base, "env"), seed.env_path))
        self.mounts.sort(key=lambda m: m[1].count("/"))     # a mount inside another is made after it
        for d in (self.state, *(m for m, _ in self.mounts)):
            os.mkdir(d, 0o700)
            if self.as_root:
                os.chown(d, self.step_uid, self.step_gid)
        self.system = "/"
        if seed is not None and seed.system is not None:
            self.system = self._show_system(seed.system)
        owner = {"uid": self.step_uid, "gid": self.step_gid} if self.as_root else {}
        try:
            if seed is not None and seed.source is not None:
                copy_tree(seed.source, Path(self.workspace), **owner)
            if seed is not None and seed.env_source is not None:
                copy_tree(seed.env_source, Path(self.base) / "env", **owner)
        except OSError as exc:      # e.g. ENOSPC: the workspace tmpfs has a size
            self.stop()
            raise SeedFailed(f"the sandbox executor cannot copy the workspace {seed.source} (and its "
                             f"environment) into its {self.workspace_mb} MiB tmpfs: {exc}") from None

    def _show_system(self, root: Path) -> str:
        """Where bwrap finds the seed's system root. As root, bwrap runs as STEP_USER, who may not
        traverse the cache that holds it (this user's, 0700): it is bound into base (0711) first,
        and goes with base's tmpfs (umount --lazy detaches both)."""
        if not self.as_root:
            return str(root)
        where = os.path.join(self.base, "system")
        os.mkdir(where, 0o755)
        done = subprocess.run(["mount", "--bind", str(root), where], capture_output=True, text=True)
        if done.returncode != 0:
            self.stop()
            raise SeedFailed(f"the sandbox executor cannot show the workspace's system root {root} to its steps "
                             f"(mount --bind): {done.stderr.strip() or done.returncode}")
        return where

    def stop(self) -> None:
        self._sync_cwd()
        base, self.base, self.workspace, self.state = self.base, None, None, None
        if base is None:
            return
        if self.bounded:
            # The step's processes are gone (killed with their cgroup); detach anyway, so that
            # nothing a step left behind can keep the mount (and its memory) from going.
            subprocess.run(["umount", "--lazy", base], capture_output=True)
            self.bounded = False
            try:
                os.rmdir(base)
            except OSError:
                pass
        else:
            shutil.rmtree(base, ignore_errors=True)

    def _sync_cwd(self) -> None:
        # The wrapper writes the shell's final directory here; a killed step leaves the old one.
        if self.state:
            self.cwd = read_cwd("state/cwd", root=self.base) or self.cwd

    def launch(self, step: Step) -> Launch | None:
        self._sync_cwd()
        if step.tool == "edit":
            program = edit_argv(step, "/usr/bin/python3", f"{self.STATE}/undo")
            if program is None:
                return None
        elif step.tool not in EXECUTING_TOOLS:
            return None
        else:
            check_command(step)
            if step.args.get("cwd"):
                self.cwd = step_cwd(step)
            program = ["/bin/sh", "-c", step_script(step.tool, f"{self.STATE}/cwd"), "sh", self.cwd, step.command]
        drop = ([self.setpriv, f"--reuid={self.step_uid}", f"--regid={self.step_gid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"] if self.as_root else [])
        env_bin = [f"{self.seed.env_path}/bin"] if self.seed is not None and self.seed.env_path else []
        argv = guarded([*drop, self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
                        "--die-with-parent", "--new-session",
                        *system_binds(self.system),
                        "--proc", "/proc", "--dev", "/dev",
                        "--size", str(int(self.tmp_mb) * 1024 * 1024), "--tmpfs", "/tmp",
                        *(a for src, dst in self.mounts for a in ("--bind", src, dst)),
                        "--bind", self.state, self.STATE,
                        "--chdir", self.home, "--setenv", "HOME", self.home,
                        "--setenv", "PATH", ":".join([*env_bin, "/usr/local/bin:/usr/bin:/bin"]),
                        "--", *program], allow_userns=True)
        timeout = step_timeout(step, self.step_timeout_s)
        return Launch(argv=argv, cwd="/", timeout_s=timeout, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def system_binds(root: str | Path = "/") -> list[str]:
    """bwrap arguments showing `root`'s system read-only: /usr, /etc, and /bin, /lib, /lib64, /sbin
    as the root has them (links kept links). The sandbox's steps see the host's (root "/") or a
    workspace's system root so."""
    root = Path(root)
    out = ["--ro-bind", str(root / "usr"), "/usr", "--ro-bind", str(root / "etc"), "/etc"]
    for name in ("bin", "lib", "lib64", "sbin"):
        path = root / name
        if path.is_symlink():
            out += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.exists():
            out += ["--ro-bind", str(path), f"/{name}"]
    return out
