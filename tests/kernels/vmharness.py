"""Run pytest on this checkout inside a real Debian kernel with only cgroup v2 mounted.

The host this project is developed on mounts cgroups hybrid (v1 controllers + a controller-less
v2 tree); most users have pure cgroup v2. This module boots a Debian kernel under qemu with
virtme-ng (`vng`), always in software emulation (`--disable-kvm`: this host's /dev/kvm is a
paravirtual KVM that cannot boot a stock kernel), shares the host's root read-only with the guest
(so the checkout and its .venv run as they are), and gives the guest one writable directory (the
"out" directory) for everything it produces: a probe of its cgroup layout, and per pytest run a
log, the exit code and a JUnit XML. Nothing is read back from the console (lines were lost there).

Kernels are fetched by pytest_agentcgroup/hostsetup.sh (groups `vm`, `vm-kernels`) — downloaded and
unpacked under $AGENTCGROUP_KERNELS_DIR, never installed on the host, their modules and headers
mounted by the guest from there (the host's /lib/modules is not used) — which records each in $AGENTCGROUP_KERNELS_DIR/index (default /var/lib/agentcgroup/kernels/index) as
`<series> <release> <vmlinuz>`; this module only reads that index.

Command line (a developer's shortcut; the tests in this directory are the CI's way in):
    .venv/bin/python tests/kernels/vmharness.py [--out DIR] 6.12 -- tests/test_ir.py [PYTEST ARGS]
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from pytest_agentcgroup import programs

REPO = Path(__file__).resolve().parents[2]
KERNELS_DIR = Path(os.environ.get("AGENTCGROUP_KERNELS_DIR", "/var/lib/agentcgroup/kernels"))
KERNELS_INDEX = KERNELS_DIR / "index"
#: every series hostsetup.sh can provide; `vm` installs 6.12, `vm-kernels` all three
SERIES = ("6.1", "6.12", "7.3")
#: where each pytest run keeps its scratch inside the guest (the guest's /tmp is a throw-away overlay)
GUEST_TMP = "/tmp/agentcgroup-vm"
#: how long the guest waits for the kernel headers' tarball the host writes while it boots
HEADERS_WAIT_S = 300
#: how long the guest's preload waits for the host to finish the image's data root it makes while
#: the guest boots (a cold debootstrap and save on a loaded host took ~3.5 min)
IMAGE_WAIT_S = 900
#: a boot's limit, boot to power-off: the slowest full boot measured (6.1 with the docker cases,
#: 1393 s under software emulation on a shared 2-core host) and ~1300 s to spare for a loaded host
BOOT_TIMEOUT_S = 2700
#: qemu 7.2's virtio-fs daemon (Debian 12's qemu-system-common), whose options are not those vng
#: gives: virtiofsd.sh translates them (root_share)
VIRTIOFSD_C = Path("/usr/lib/qemu/virtiofsd")
VIRTIOFS_SHIM = Path(__file__).with_name("virtiofsd.sh")
#: the processes run_killable() runs now (each leads its own process group), and whether
#: kill_running() has been called (nothing starts after it)
_RUNNING: set[subprocess.Popen] = set()
_STOPPED = threading.Event()
_LOCK = threading.Lock()


#: the environment when this module was imported (collection): boots run in threads beside tests
#: that change os.environ for a while (monkeypatch, pytester), which must not reach a VM
_ENVIRON = dict(os.environ)


class Stopped(Exception):
    """kill_running() was called (the session ended): nothing more is started."""


class KernelMissing(Exception):
    """A kernel series is not installed as hostsetup.sh would install it (the message says what)."""


@dataclass(frozen=True)
class Kernel:
    series: str             # "6.12"
    release: str            # `uname -r` inside the guest: "6.12.117+deb12-amd64"
    vmlinuz: Path

    @property
    def modules(self) -> Path | None:
        """The unpacked tree's lib/modules/<release> (its build and source links name the tree's
        headers): in the nearest ancestor of the vmlinuz that has a lib/modules, as vng looks for
        it; None when that one lacks the release. The search stops there and below /: the host's
        own /lib/modules is never taken for the kernel's. The guest mounts it at /lib/modules/<release>."""
        for tree in self.vmlinuz.parents:
            if tree == Path(tree.anchor):
                break
            for rel in ("lib/modules", "usr/lib/modules"):
                if (tree / rel).is_dir():
                    found = tree / rel / self.release
                    return found if found.is_dir() else None
        return None


def find_kernel(series: str, index: Path = KERNELS_INDEX) -> Kernel:
    """The kernel of a series as hostsetup.sh recorded it, checked to be bootable with bcc headers."""
    try:
        lines = index.read_text().splitlines()
    except OSError as exc:
        raise KernelMissing(f"no kernel index {index} ({exc.strerror}): "
                            "run `bash pytest_agentcgroup/hostsetup.sh vm-kernels`") from None
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == series:
            kernel = Kernel(series, parts[1], Path(parts[2]))
            break
    else:
        raise KernelMissing(f"kernel {series} is not in {index}: run `bash pytest_agentcgroup/hostsetup.sh "
                            f"{'vm' if series == '6.12' else 'vm-kernels'}`")
    if not kernel.vmlinuz.is_file():
        raise KernelMissing(f"kernel {series}: {index} names {kernel.vmlinuz}, which does not exist")
    modules = kernel.modules
    if modules is None:
        raise KernelMissing(f"kernel {series}: no lib/modules/{kernel.release} beside {kernel.vmlinuz} "
                            "(hostsetup.sh unpacks the kernel's package there)")
    for link in ("build", "source"):   # bcc in the guest compiles against that kernel's headers
        if not (modules / link).is_dir():
            raise KernelMissing(f"kernel {series}: {modules / link} is missing (its headers; hostsetup.sh links them)")
    return kernel


#: Debian architecture -> the qemu that emulates it (programs.tsv's qemu-system-* rows, whose
#: packages hostsetup.sh's vm groups install); hostsetup.sh fetches kernels of the same flavours.
#: vng boots the host's own architecture.
QEMU_BY_ARCH = {p.arch: p.name for p in programs.read_table(arch="*") if p.name.startswith("qemu-system-")}


def debian_arch() -> str:
    try:
        return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def qemu_for_host(arch: str | None = None) -> str:
    """The qemu binary that boots this architecture's kernels; KernelMissing says why not."""
    arch = debian_arch() if arch is None else arch
    if arch not in QEMU_BY_ARCH:
        raise KernelMissing(f"the VM tests boot Debian kernels on {', '.join(QEMU_BY_ARCH)} only; this host is "
                            f"{arch or 'not Debian (no dpkg --print-architecture)'}")
    binary = QEMU_BY_ARCH[arch]
    programs.require(binary, error=KernelMissing)
    return binary


def vng_path() -> Path | None:
    """`vng` of this interpreter's environment (pip extra `vm`), else one on PATH."""
    found = programs.which("vng")
    return Path(found) if found else None


def root_share(kernel: Kernel) -> tuple[Path | None, list[str]]:
    """How the guest gets the host's root: (a directory for the front of vng's PATH, to be removed
    after the boot; vng options). Under emulation 9p without a cache costs a host round trip per
    lookup and read. virtio-fs needs the kernel to have it built in (the root is mounted before
    any module loads) and a daemon: vng speaks the options of the Rust virtiofsd,
    and where qemu ships its C one (7.2, Debian 12), virtiofsd.sh translates them: a link to it
    named `virtiofsd` in a new root-only directory, which vng finds on PATH first (never in the
    guest's writable directory: host root runs what it finds there). Without the C one vng finds a
    Rust daemon itself or falls back to 9p."""
    config = kernel.vmlinuz.parent / f"config-{kernel.release}"
    if "CONFIG_VIRTIO_FS=y" not in (_read(config) or "").splitlines():
        return None, ["--force-9p"]
    if not (os.access(VIRTIOFSD_C, os.X_OK) and "source=" in _help_of(VIRTIOFSD_C)):
        return None, []
    shim = Path(tempfile.mkdtemp(prefix="agentcgroup-vng-"))
    (shim / "virtiofsd").symlink_to(VIRTIOFS_SHIM)
    return shim, []


def _help_of(program: Path) -> str:
    try:
        return subprocess.run([program, "--help"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


# ---------------------------------------------------------------------------------------------
# What runs in the guest

@dataclass(frozen=True)
class PytestRun:
    """One pytest invocation in the guest. Its files in the out directory are <name>.log, .rc,
    .xml (JUnit) and <name>-results/ (--agentcgroup-out)."""
    name: str
    args: tuple[str, ...]   # test paths (relative to the checkout) and options
    # None: as root. A user name: as that user (no capability), in a cgroup delegated to it the way
    # systemd delegates a user session (Delegate=yes: the directory and its cgroup.procs,
    # cgroup.threads and cgroup.subtree_control chowned to the user), under /sys/fs/cgroup/<name>
    user: str | None = None


def guest_script(out: Path, runs: list[PytestRun], repo: Path = REPO, modules: Path | None = None,
                 docker_image: Path | None = None, headers: Path | None = None) -> str:
    """The shell script the guest runs: mount what the tests need, write the cgroup probe, run each
    pytest, then mark the end. Nothing is written into the (read-only) checkout: bytecode off, no
    cache provider, pytest's cwd (Hypothesis keeps its database there) and --basetemp in the
    guest's /tmp, results in `out`. `modules`: the kernel's unpacked lib/modules/<release>, put at
    the guest's /lib/modules/<release> (a tmpfs over the guest's /lib/modules) unless vng already
    did; the probe then says whether bcc finds the headers there. `headers`: a tarball of those
    headers (write_headers) unpacked into the guest's RAM and used instead of the shared root's.
    `docker_image`: a tarball of a Docker data root holding the project's image, unpacked for the
    guest's Docker engine before the runs (see _docker_preload)."""
    q = shlex.quote
    lines = [
        "#!/bin/sh",
        f"OUT={q(str(out))}",
        f"export PATH={q(str(repo / '.venv' / 'bin'))}:/usr/sbin:/usr/bin:/sbin:/bin",
        f"export HOME={GUEST_TMP}/home PYTHONDONTWRITEBYTECODE=1",
        f"mkdir -p {GUEST_TMP}/home",
        "exec >\"$OUT/guest.log\" 2>&1",
        # the probe: what this guest's cgroup layout is, before anything (a mount, dockerd, a test) touches it
        "uname -r >\"$OUT/probe.uname\"",
        "cat /proc/self/cgroup >\"$OUT/probe.cgroup\"",
        "cat /proc/mounts >\"$OUT/probe.mounts\"",
        "cat /sys/fs/cgroup/cgroup.controllers >\"$OUT/probe.controllers\" 2>&1",
        "cat /sys/fs/cgroup/cgroup.subtree_control >\"$OUT/probe.subtree_control\" 2>&1",
        # tracefs is not always mounted by vng's init; bcc attaches tracepoints through it
        "grep -q ' /sys/kernel/tracing tracefs ' /proc/mounts || mount -t tracefs nodev /sys/kernel/tracing",
        "grep -q ' /sys/kernel/debug debugfs ' /proc/mounts || mount -t debugfs nodev /sys/kernel/debug",
        "grep -q ' /sys/fs/bpf bpf ' /proc/mounts || mount -t bpf bpf /sys/fs/bpf",
        *_modules_at(modules, headers),
        *(_docker_preload(docker_image) if docker_image is not None else []),
    ]
    for run in runs:
        tmp = f"{GUEST_TMP}/{run.name}"
        # a user can neither read nor write the host's out directory (a pytest tmp_path: 0700
        # root): root copies it in (arguments naming files in it follow), the user writes in its
        # tmp, and root copies that back
        written = f"{tmp}/out" if run.user else str(out)
        args = [a.replace(str(out), f"{tmp}/in", 1) if run.user and a.startswith(str(out)) else a
                for a in run.args]
        argv = [str(repo / ".venv" / "bin" / "python"), "-m", "pytest", "-c", str(repo / "pyproject.toml"),
                "--rootdir", str(repo), "-p", "no:cacheprovider", "--basetemp", f"{tmp}/basetemp",
                "--junitxml", f"{written}/{run.name}.xml", "--agentcgroup-out", f"{written}/{run.name}-results",
                "-q", "-rfE", "--durations=10",
                *[str(repo / a) if (repo / a).exists() else a for a in args]]
        command = " ".join(q(a) for a in argv)
        lines += [f"mkdir -p {tmp} && cd {tmp}"]
        if run.user:
            lines += _open_path_to(repo / ".venv" / "bin" / "python", f"{GUEST_TMP}/hidden-{run.name}")
            cg = f"/sys/fs/cgroup/{run.name}"
            command = (f"sh -c 'echo $$ >{cg}/cgroup.procs && exec setpriv --reuid {q(run.user)} "
                       f"--regid \"$(id -g {q(run.user)})\" --clear-groups --inh-caps=-all --bounding-set=-all "
                       f"env HOME={tmp}/home \"$@\"' sh {command}")
            lines += [
                f"mkdir -p {written} {tmp}/home && cp -r \"$OUT\" {tmp}/in && chown -R {q(run.user)} {tmp}",
                "echo '+memory +pids +cpu' >/sys/fs/cgroup/cgroup.subtree_control",
                f"mkdir -p {cg}",
                f"chown {q(run.user)} {cg} {cg}/cgroup.procs {cg}/cgroup.threads {cg}/cgroup.subtree_control",
            ]
        lines += [
            f"date +%s >\"$OUT/{run.name}.start\"",
            f"{command} >\"$OUT/{run.name}.log\" 2>&1",
            f"echo $? >\"$OUT/{run.name}.rc\"",
            f"date +%s >\"$OUT/{run.name}.end\"",
        ]
        if run.user:
            lines += [f"cp -r {written}/. \"$OUT\"/ 2>>\"$OUT/{run.name}.log\""]
    lines += ["echo done >\"$OUT/guest.done\"", "exit 0"]
    return "\n".join(lines) + "\n"


def _modules_at(modules: Path | None, headers: Path | None = None) -> list[str]:
    """Guest commands putting the unpacked modules tree at /lib/modules/$(uname -r), then writing
    probe.headers: "ok", or the headers bcc would miss there. With `headers`, that release's
    directory is built in a tmpfs instead: links to the tree's entries, but build/ and source/
    unpacked from the tarball (bcc reads hundreds of headers per compile: 12.5 s a program over
    9p, 6.5 s from RAM, measured in the 6.12 guest). The host writes it while the guest boots: up
    to HEADERS_WAIT_S for it (or its .failed), else the tree's own build/ and source/ links."""
    lines = []
    if modules is not None and headers is not None:
        m, h = shlex.quote(str(modules)), shlex.quote(str(headers))
        failed = shlex.quote(str(headers) + ".failed")
        lines += ['rel=$(uname -r)',
                  'mount -t tmpfs -o mode=0755 agentcgroup-modules /lib/modules && mkdir /lib/modules/$rel',
                  f'i=0; until [ -e {h} ] || [ -e {failed} ] || [ $i -ge {HEADERS_WAIT_S} ]; do sleep 1; i=$((i + 1)); done',
                  f'if [ -e {h} ]; then skip="build source"; else skip=; fi',
                  f'for e in {m}/*; do case " $skip " in *" ${{e##*/}} "*) ;; *) ln -s "$e" /lib/modules/$rel/;; esac; done',
                  f'[ -z "$skip" ] || tar -xzf {h} -C /lib/modules/$rel']
    elif modules is not None:
        m = shlex.quote(str(modules))
        lines += ['rel=$(uname -r)',
                  f'if [ "$(readlink -f /lib/modules/$rel)" != "$(readlink -f {m})" ]; then',
                  f'  mount -t tmpfs -o mode=0755 agentcgroup-modules /lib/modules && ln -s {m} /lib/modules/$rel',
                  'fi']
    lines += ['h=/lib/modules/$(uname -r)',
              'if [ -d $h/build/include/generated ] && [ -d $h/source/include/linux ]; then echo ok; '
              'else echo "no $h/build/include/generated or $h/source/include/linux"; fi >"$OUT/probe.headers"']
    return lines


def write_headers(modules: Path, tar: Path) -> Path:
    """The headers bcc compiles against (`modules`/build and /source: their include/ trees and
    their architecture's, .config, Makefile), links followed, as one tarball the guest unpacks
    (_modules_at): one 9p read instead of hundreds per compile. Gzipped (65 MB -> ~15 MB): reading
    over 9p, not unpacking, is what costs the guest."""
    arches = sorted(p.name for p in (modules / "build" / "arch").iterdir() if p.is_dir())
    with tarfile.open(tar, "w:gz", compresslevel=1, dereference=True) as out:
        for link in ("build", "source"):
            for part in ("include", *(f"arch/{a}/include" for a in arches), ".config", "Makefile"):
                top = modules / link / part
                if top.is_file():
                    out.add(top, arcname=f"{link}/{part}")
                for d, dirs, files in os.walk(top, followlinks=True):     # nothing when top is no dir
                    rel = f"{link}/{Path(d).relative_to(modules / link)}"
                    out.add(d, arcname=rel, recursive=False)
                    for f in files:
                        if os.path.exists(os.path.join(d, f)):           # a dangling link is left out
                            out.add(os.path.join(d, f), arcname=f"{rel}/{f}")
    return tar


def _write_headers_for_guest(modules: Path, headers: Path) -> None:
    """write_headers to a temporary name, then renamed: the guest takes `headers` once it exists.
    A failure is written to `headers`.failed (the guest then compiles against the 9p tree)."""
    part = headers.with_name(headers.name + ".part")
    try:
        write_headers(modules, part)
        part.rename(headers)
    except Exception as exc:                 # a full disk, an unreadable header: slower, not wrong
        part.unlink(missing_ok=True)
        headers.with_name(headers.name + ".failed").write_text(f"{exc}\n")


def _docker_preload(image: Path) -> list[str]:
    """Guest commands giving the guest's Docker engine the project's image, which it cannot build
    (no network for debootstrap): `image` is a tarball of a Docker data root holding it, made on the
    host while the guest boots (tests/kernels/dataroot.py: a dockerd of the host's own loaded it,
    in seconds; the guest's own `docker load` took minutes of emulation on a loaded host), unpacked
    into a tmpfs at the guest's /var/lib/docker (its /var is an overlay over the host's, where
    overlay2 cannot stack and the host's own images must not show), where the dockerd the plugin
    starts finds the image. The unpacking waits for the host's word that the tarball is whole
    (mark_image). docker-load.rc and .log say how it went (GuestResult.problems).

    The host's /etc/docker is hidden in the guest (a daemon.json there, e.g. a data-root, would
    apply to the guest's dockerd). The tmpfs is capped at 1G: the image (~260 MB unpacked) plus the
    hostile cases' few small containers; tmpfs pages cost guest RAM (2G) only as written."""
    img = shlex.quote(str(image))
    ready, failed = (shlex.quote(str(m)) for m in image_markers(image))
    return [
        "[ ! -d /etc/docker ] || mount -t tmpfs -o mode=0755,size=1M agentcgroup-etc-docker /etc/docker",
        "mkdir -p /var/lib/docker && mount -t tmpfs -o mode=0711,size=1G agentcgroup-docker /var/lib/docker",
        ": >\"$OUT/docker-load.log\"",
        # the host makes the data root while the guest boots: unpacked once it says it is whole
        f"i=0; until [ -e {ready} ] || [ -e {failed} ] || [ $i -ge {IMAGE_WAIT_S} ]; do sleep 1; i=$((i + 1)); done",
        f"if [ -e {ready} ]; then tar -C /var/lib/docker --xattrs --xattrs-include='*' -xf {img} "
        '>>"$OUT/docker-load.log" 2>&1; echo $? >"$OUT/docker-load.rc"; '
        f'else echo "no image from the host after $i s: $(cat {failed} 2>/dev/null)" >>"$OUT/docker-load.log"; '
        'echo 125 >"$OUT/docker-load.rc"; fi',
        # the engine's binaries read once into the page cache: the dockerd the plugin starts then
        # starts its containerd warm (a dockerd gives up on a containerd slow to come up)
        'for p in containerd dockerd; do f=$(command -v $p) && cat "$f" >/dev/null; done',
    ]


def image_markers(image: Path) -> tuple[Path, Path]:
    """The files beside `image` by which the host tells the guest the tarball is whole (`.ready`)
    or will not come (`.failed`, holding why): the host may still be saving it while the guest boots."""
    return image.with_name(image.name + ".ready"), image.with_name(image.name + ".failed")


def mark_image(image: Path, failure: str | None = None) -> None:
    """Tell the guest that `image` is whole (failure None) or will not come, and why."""
    ready, failed = image_markers(image)
    if failure is None:
        ready.touch()
    else:
        failed.write_text(failure + "\n")


def _open_path_to(path: Path, spare: str) -> list[str]:
    """Guest commands that let any user reach `path` (the venv's interpreter) where a directory on
    its way is closed to others on the host (e.g. a pyenv under /root, mode 0700): that directory is
    covered, in the guest only, by a tmpfs others may traverse, holding just the entry on the way
    (bind-mounted from the original, seen at `spare`). The host's files are shared read-only and
    untouched; a path open to all needs nothing."""
    real = Path(os.path.realpath(path))
    for closed in real.parents:
        if closed == Path("/") or os.stat(closed).st_mode & 0o001:
            continue
        entry = real.relative_to(closed).parts[0]
        q = shlex.quote
        return [f"mkdir -p {spare} && mount --bind {q(str(closed))} {spare}",
                f"mount -t tmpfs -o mode=0711 agentcgroup-path {q(str(closed))}",
                f"mkdir {q(str(closed / entry))} && mount --bind {spare}/{q(entry)} {q(str(closed / entry))}"]
    return []


# ---------------------------------------------------------------------------------------------
# Reading back what the guest wrote

@dataclass
class JunitSummary:
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)    # (test id, tail of its report)
    skip_reasons: list[str] = field(default_factory=list)
    passed_ids: list[str] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return self.tests - self.failures - self.errors - self.skipped


def read_junit(path: Path, tail_lines: int = 12) -> JunitSummary:
    """Counts, and each failing/erroring test with the last lines of its report."""
    root = ET.parse(path).getroot()
    summary = JunitSummary()
    for case in root.iter("testcase"):
        summary.tests += 1
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        for child in case:
            if child.tag in ("failure", "error"):
                if child.tag == "failure":
                    summary.failures += 1
                else:
                    summary.errors += 1
                text = (child.text or child.get("message") or "").rstrip().splitlines()
                summary.failed.append((f"{test_id} ({child.tag})", "\n".join(text[-tail_lines:])))
                break
            if child.tag == "skipped":
                summary.skipped += 1
                summary.skip_reasons.append(f"{test_id}: {child.get('message', '')}")
                break
        else:
            summary.passed_ids.append(test_id)
    return summary


@dataclass
class RunOutcome:
    """One PytestRun as the guest left it."""
    name: str
    rc: int | None               # pytest's exit code; None: the run never finished
    seconds: float | None
    junit: JunitSummary | None   # None: no JUnit XML (pytest did not get that far)
    log_tail: str
    started: bool = False        # the guest script reached it (<name>.start written)

    def problems(self) -> list[str]:
        """Why this run does not count as passed (empty: it passed and ran tests)."""
        if self.rc is None:
            how = "did not finish" if self.started else "never started"
            return [f"{self.name}: pytest {how} in the guest; end of its log:\n{self.log_tail}"]
        if self.junit is None:
            return [f"{self.name}: pytest exited {self.rc} without a JUnit XML; end of its log:\n{self.log_tail}"]
        out = []
        j = self.junit
        if j.tests == 0 or self.rc == 5:
            out.append(f"{self.name}: no tests ran (pytest exit {self.rc}); end of its log:\n{self.log_tail}")
        elif j.passed == 0 and not j.failed:
            reasons = "\n".join("  " + r for r in j.skip_reasons[:8])
            out.append(f"{self.name}: all {j.tests} tests skipped, none ran:\n{reasons}")
        if j.failed:
            # every failing test by name; a report's end once, then "same as" for the tests that
            # ended the same way (one broken fixture fails many tests identically)
            listed, first_with = [], {}
            for test, tail in j.failed:
                lines = tail.splitlines()   # "the same way": same `E ` lines and final location
                how = tuple(ln for ln in lines if ln.startswith("E ")) + tuple(lines[-1:])
                if how in first_with:
                    listed.append(f"  {test}: same as {first_with[how]}")
                elif len(first_with) >= 6:
                    listed.append(f"  {test}")
                else:
                    first_with[how] = test
                    listed.append(f"  {test}\n" + "\n".join("      " + ln for ln in tail.splitlines()))
            out.append(f"{self.name}: {j.failures} failed, {j.errors} errors of {j.tests}:\n" + "\n".join(listed))
        if self.rc not in (0, 5) and not j.failed:
            out.append(f"{self.name}: pytest exited {self.rc} with no failing test in its JUnit; end of its log:\n"
                       f"{self.log_tail}")
        return out

    def counts(self) -> str:
        if self.junit is None:
            if self.rc is not None:
                return f"exit {self.rc}, no JUnit"
            return "started, did not finish" if self.started else "not run"
        j = self.junit
        took = f" in {self.seconds:.0f} s" if self.seconds is not None else ""
        return f"{j.passed} passed, {j.failures} failed, {j.errors} errors, {j.skipped} skipped{took}"


@dataclass
class Probe:
    """The guest's cgroup layout as its script saw it before any test ran."""
    uname: str | None
    proc_self_cgroup: list[str]
    cgroup_mounts: list[tuple[str, str]]     # (mount point, fs type) of every cgroup/cgroup2 mount
    controllers: str | None
    headers: str | None = None               # "ok", or what bcc would miss at /lib/modules/<release>
    root_fs: str | None = None               # how the host's root reached the guest: "virtiofs", "9p"

    def problems(self, kernel: Kernel) -> list[str]:
        """Why this is not the requested kernel with pure cgroup v2 (empty: it is)."""
        if self.uname is None:
            return ["the guest wrote no probe (its script did not start)"]
        out = []
        if self.uname != kernel.release:
            out.append(f"the guest ran kernel {self.uname!r}, not the requested {kernel.release!r}")
        if not self.proc_self_cgroup or any(not ln.startswith("0::/") for ln in self.proc_self_cgroup):
            out.append(f"/proc/self/cgroup is not v2-only (`0::/…`): {self.proc_self_cgroup}")
        v1 = [m for m in self.cgroup_mounts if m[1] == "cgroup"]
        if v1:
            out.append(f"cgroup v1 hierarchies are mounted: {v1}")
        if ("/sys/fs/cgroup", "cgroup2") not in self.cgroup_mounts:
            out.append(f"cgroup2 is not mounted at /sys/fs/cgroup: {self.cgroup_mounts}")
        if self.headers != "ok":
            out.append(f"the guest's kernel headers for bcc: {self.headers or 'not checked (no probe.headers)'}")
        return out

    @property
    def mode(self) -> str:
        v1 = any(t == "cgroup" for _, t in self.cgroup_mounts)
        v2 = any(t == "cgroup2" for _, t in self.cgroup_mounts)
        return "hybrid" if v1 and v2 else "v1" if v1 else "v2" if v2 else "none"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_probe(out: Path) -> Probe:
    mounts, root_fs = [], None
    for line in (_read(out / "probe.mounts") or "").splitlines():
        f = line.split()
        if len(f) >= 3 and f[2] in ("cgroup", "cgroup2"):
            mounts.append((f[1], f[2]))
        elif len(f) >= 3 and f[1] == "/":
            root_fs = f[2]
    uname = _read(out / "probe.uname")
    controllers, headers = _read(out / "probe.controllers"), _read(out / "probe.headers")
    return Probe(uname=uname.strip() if uname is not None else None,
                 proc_self_cgroup=(_read(out / "probe.cgroup") or "").split(),
                 cgroup_mounts=mounts, controllers=controllers.strip() if controllers is not None else None,
                 headers=headers.strip() if headers is not None else None, root_fs=root_fs)


def read_run(out: Path, name: str, tail_lines: int = 25) -> RunOutcome:
    rc_text, start, end = _read(out / f"{name}.rc"), _read(out / f"{name}.start"), _read(out / f"{name}.end")
    log = (_read(out / f"{name}.log") or "(no log)").rstrip().splitlines()
    xml = out / f"{name}.xml"
    junit = None
    if xml.exists():
        try:
            junit = read_junit(xml)
        except ET.ParseError as exc:
            log.append(f"(its JUnit XML {xml} is not well-formed: {exc})")
    return RunOutcome(name=name, rc=int(rc_text) if rc_text and rc_text.strip().isdigit() else None,
                      seconds=float(end) - float(start) if start and end else None,
                      junit=junit, log_tail="\n".join(log[-tail_lines:]), started=start is not None)


@dataclass
class GuestResult:
    kernel: Kernel
    out: Path
    vng_rc: int | None           # None: killed at the timeout
    seconds: float               # boot to power-off, wall clock on the host
    probe: Probe
    runs: dict[str, RunOutcome]
    docker_image: Path | None = None     # the data root's tarball the guest was to unpack (None: none given)

    def problems(self) -> list[str]:
        """Everything that keeps this boot from counting as a pass, most basic first."""
        out = []
        if self.vng_rc is None or self.vng_rc != 0 or not (self.out / "guest.done").exists():
            how = "was killed at its timeout" if self.vng_rc is None else f"exited {self.vng_rc}"
            guest_log = (_read(self.out / "guest.log") or "").rstrip().splitlines()[-15:]
            vng_log = (_read(self.out / "vng.log") or "").rstrip().splitlines()[-15:]
            out.append(f"the VM {how} before its script finished; end of guest.log:\n" + "\n".join(guest_log)
                       + "\nend of vng.log (console):\n" + "\n".join(vng_log))
        out += self.probe.problems(self.kernel)
        if self.docker_image is not None and (_read(self.out / "docker-load.rc") or "").strip() != "0":
            tail = (_read(self.out / "docker-load.log") or "(no log)").rstrip().splitlines()[-10:]
            out.append(f"the guest did not unpack its Docker data root {self.docker_image.name} (docker-load.rc "
                       f"{(_read(self.out / 'docker-load.rc') or 'missing').strip()}); end of docker-load.log:\n"
                       + "\n".join(tail))
        for run in self.runs.values():
            out += run.problems()
        return out

    def verdict(self) -> str:
        """One line: kernel, cgroup mode as the guest saw it, counts per run, time."""
        runs = "; ".join(f"{r.name}: {r.counts()}" for r in self.runs.values())
        ok = "PASSED" if not self.problems() else "FAILED"
        return (f"kernel {self.kernel.release} ({self.kernel.series}): cgroup {self.probe.mode} "
                f"[{' '.join(self.probe.proc_self_cgroup) or 'no probe'}]; {runs}; "
                f"{self.seconds:.0f} s in the VM, root over {self.probe.root_fs or '?'} -> {ok}")


def vng_argv(vng: Path, kernel: Kernel, out: Path, script: Path, *, memory: str, cpus: int,
             docker: bool) -> list[str]:
    argv = [str(vng), "--disable-kvm", "-r", str(kernel.vmlinuz), "-m", memory, "-p", str(cpus),
            "--rwdir", str(out), "--exec", f"sh {shlex.quote(str(script))}",
            # The kernel's console into vng.log: without --verbose vng sends it to /dev/null, and a
            # guest that panics leaves nothing but vng's exit 255 (seen on 6.12 and 7.3). loglevel=4,
            # given after vng's own loglevel=7, keeps it to errors: an OOM kill is one line, not a
            # dump, so the serial console stays quiet; a panic or oops prints whatever the level
            # (a WARN, at level 4, does not).
            "--verbose", "--append", "loglevel=4",
            # One host thread runs both vCPUs in turn (no multi-threaded TCG). With MTTCG, a guest
            # oopsed now and then on an int3 in scheduler code, right after the kernel had patched
            # its own text (a static key flipped by a cgroup mkdir): another vCPU was still running
            # a stale translation of the patched bytes. Measured cost on 6.12, in the guest: the
            # subset 759 s (731-759 s with MTTCG), the delegated-user run 235 s (236 s).
            "--qemu-opts=-accel tcg,thread=single"]
    if docker:
        # Debian kernels enable AppArmor, and dockerd then wants its docker-default profile
        # loaded, which the shared host root cannot give the guest; nothing tested here uses it.
        # Only for a boot with the engine: the others run with the kernel's defaults.
        argv += ["--append", "apparmor=0"]
    return argv


def boot(kernel: Kernel, out: Path, runs: list[PytestRun], *, memory: str = "2G", cpus: int = 2,
         timeout_s: float = BOOT_TIMEOUT_S, docker_image: Path | None = None, nice: int = 0,
         local_headers: bool = False) -> GuestResult:
    """Boot `kernel`, run `runs` in it, and read back what the guest wrote into `out`.
    `docker_image`: a Docker data root's tarball inside `out` for the guest's Docker engine,
    unpacked once mark_image() says it is whole (the caller may still be writing it while the guest boots).
    `nice`: the VM's priority on the host (run_killable). `local_headers`: the kernel's headers
    copied into the guest's RAM first (write_headers), for runs that compile many BPF programs."""
    qemu_for_host()
    vng = vng_path()
    if vng is None:
        raise KernelMissing("vng (virtme-ng) is not installed: pip extra `vm` (make setup installs it)")
    out.mkdir(parents=True, exist_ok=True)
    script = out / "guest.sh"
    headers = out / "kernel-headers.tar.gz" if local_headers and kernel.modules else None
    script.write_text(guest_script(out, runs, modules=kernel.modules, docker_image=docker_image, headers=headers))
    # vng runs `virtme-run` by name, so its own bin directory goes first on PATH (after the
    # virtio-fs shim's, if any)
    shim, share = root_share(kernel)
    env = {**_ENVIRON, "PATH": ":".join(str(p) for p in (shim, vng.parent, _ENVIRON.get("PATH", "/usr/bin:/bin")) if p)}
    argv = vng_argv(vng, kernel, out, script, memory=memory, cpus=cpus, docker=docker_image is not None) + share
    start, writer = time.monotonic(), None
    try:
        if headers:                          # written while the guest boots (5-20 s here)
            writer = threading.Thread(target=_write_headers_for_guest, args=(kernel.modules, headers), daemon=True)
            writer.start()
        with open(out / "vng.log", "wb") as console:
            rc = run_killable(argv, timeout_s=timeout_s, nice=nice, cwd=out, env=env, stdout=console,
                              stderr=subprocess.STDOUT)
    finally:
        if shim:
            shutil.rmtree(shim, ignore_errors=True)
        if writer:                           # unpacked by now (or never wanted: a guest that died early)
            writer.join()
        if headers:
            for left in (headers, headers.with_name(headers.name + ".failed")):
                left.unlink(missing_ok=True)
    seconds = time.monotonic() - start
    return GuestResult(kernel=kernel, out=out, vng_rc=rc, seconds=seconds, probe=read_probe(out),
                       runs={r.name: read_run(out, r.name) for r in runs}, docker_image=docker_image)


def run_killable(argv: list[str], *, timeout_s: float, nice: int = 0, **popen) -> int | None:
    """Run argv in a session of its own (stdin /dev/null) to its end: its exit status, or None when
    it was killed at `timeout_s`. kill_running() kills it; after that call nothing starts (Stopped).
    Ctrl-C or any error while waiting kills it too: nothing outlives us (vng, virtme-run, qemu).
    `nice`: its scheduling priority (nice(1)'s adjustment; below 0 needs root), inherited by all it
    starts: the work on a session's critical path runs before the work that has time to spare."""
    what = argv[0]
    if nice:
        argv = [programs.require("nice"), "-n", str(nice), *argv]
    with _LOCK:
        if _STOPPED.is_set():
            raise Stopped(f"not started, the session has ended: {what}")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True, **popen)
        _RUNNING.add(proc)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        return None
    except BaseException:
        _kill(proc)
        raise
    finally:
        _RUNNING.discard(proc)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def kill_running() -> None:
    """The session ends: kill what run_killable() runs, and start nothing more."""
    with _LOCK:
        _STOPPED.set()
        running = list(_RUNNING)
    for proc in running:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="Run pytest on this checkout in a pure cgroup v2 VM.")
    parser.add_argument("series", choices=SERIES)
    parser.add_argument("args", nargs="+", help="test paths (relative to the checkout) and pytest options")
    parser.add_argument("--out", type=Path, help="the guest's writable directory (default: a new temp dir)")
    opts = parser.parse_args(argv)
    try:
        kernel = find_kernel(opts.series)
        out = opts.out or Path(tempfile.mkdtemp(prefix=f"agentcgroup-vm-{opts.series}-"))
        result = boot(kernel, out, [PytestRun("tests", tuple(opts.args))])
    except KernelMissing as exc:
        print(f"vmharness: {exc}", file=sys.stderr)
        return 2
    for problem in result.problems():
        print(problem, file=sys.stderr)
    print(result.verdict())
    print(f"guest files: {result.out}")
    return 0 if not result.problems() else 1


if __name__ == "__main__":
    sys.exit(main())
