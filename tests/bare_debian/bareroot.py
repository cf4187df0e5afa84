"""A bare Debian machine for the set-up test: a minbase root with `make` (all the README promises a
user needs), given this machine's network settings and a copy of the checkout, entered with
bubblewrap as root (a new mount, PID, IPC and UTS namespace; the host's network).

What the root gets from this machine is what a fresh machine of this kind has besides packages: the
apt configuration (the Debian mirror, apt.conf.d snippets no package owns), the CA certificates the
network's TLS needs (those in /usr/local/share/ca-certificates and the bundle built from them), pip's
configuration and the PIP_*/CA variables, DNS, and `policy-rc.d` (installing docker.io must not start
a dockerd in the root). Nothing that set-up installs is cached: only the debootstrap tarball is, per
suite and mirror, in CACHE_DIR.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kernels.vmharness import run_killable
from pytest_agentcgroup.engines.apt_sources import debian_mirror, read_sources
from pytest_agentcgroup.engines.rootfs import debootstrap

REPO = Path(__file__).resolve().parents[2]
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentcgroup" / "bare-debian"
CHECKOUT = "/work/checkout"           # where the checkout sits in the root
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# the environment a login on this machine has that concerns the network (pip's index, CA bundles)
PASS_ENV_PREFIXES = ("PIP_",)
PASS_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
            "GIT_SSL_CAINFO", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
POLICY_RC_D = "#!/bin/sh\n# no service starts while packages are installed in this root\nexit 101\n"


def security_mirror() -> str | None:
    """The URI of the Debian security archive apt is configured with, if any."""
    sources, _ = read_sources()
    for s in sources:
        if s.type == "deb" and s.suite.endswith("-security") and "main" in s.components:
            return s.uri.rstrip("/")
    return None


def bare_tarball(suite: str) -> Path:
    """A minbase `suite` root with make, as a tarball: made once per suite and mirror, then reused."""
    mirror = debian_mirror(suite)
    key = hashlib.sha256(f"{suite} {mirror} make".encode()).hexdigest()[:12]
    tar = CACHE_DIR / f"{suite}-minbase-make-{key}.tar"
    if tar.exists():
        return tar
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    root = CACHE_DIR / f"{suite}.{os.getpid()}.root"
    shutil.rmtree(root, ignore_errors=True)
    try:
        debootstrap(root, suite=suite, include=["make"], mirror=mirror, log=root.with_suffix(".debootstrap.log"))
        part = tar.with_suffix(f".{os.getpid()}.part")     # another session may be making it too
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(part), "."], check=True)
        part.rename(tar)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return tar


def _unowned(paths) -> list[Path]:
    """The files no Debian package owns (a machine's own configuration, not a package's)."""
    paths = [p for p in paths if p.is_file()]
    if not paths:
        return []
    owned = subprocess.run(["dpkg-query", "-S", *map(str, paths)], capture_output=True, text=True).stdout
    return [p for p in paths if f": {p}\n" not in owned + "\n"]


def _copy_in(root: Path, path: Path) -> None:
    dest = root / path.relative_to("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, dest)


@dataclass
class BareRoot:
    """A bare `suite` machine in `root`, with the checkout at CHECKOUT."""
    suite: str
    root: Path

    @classmethod
    def make(cls, suite: str, root: Path, repo: Path = REPO) -> "BareRoot":
        root.mkdir(parents=True)
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-xf", str(bare_tarball(suite))], check=True)
        mirror, security = debian_mirror(suite), security_mirror()
        lines = [f"deb {mirror} {suite} main", f"deb {mirror} {suite}-updates main"]
        if security:
            lines.append(f"deb {security} {suite}-security main")
        (root / "etc/apt/sources.list").write_text("\n".join(lines) + "\n")
        for path in _unowned(sorted(Path("/etc/apt/apt.conf.d").glob("*"))):
            _copy_in(root, path)
        for path in [*Path("/usr/local/share/ca-certificates").glob("*.crt"), Path("/etc/ssl/certs/ca-certificates.crt"),
                     Path("/etc/pip.conf"), *Path("/etc/xdg/pip").glob("*"), Path("/etc/resolv.conf")]:
            if path.is_file():
                _copy_in(root, path)
        policy = root / "usr/sbin/policy-rc.d"
        policy.write_text(POLICY_RC_D)
        policy.chmod(0o755)
        files = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                               capture_output=True, check=True).stdout.decode().split("\0")
        dest = root / CHECKOUT.lstrip("/")
        for name in filter(None, files):
            src = repo / name
            if src.is_file() or src.is_symlink():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name, follow_symlinks=False)
        return cls(suite, root)

    def env(self) -> dict[str, str]:
        passed = {k: v for k, v in os.environ.items() if k.startswith(PASS_ENV_PREFIXES) or k in PASS_ENV}
        return {"PATH": PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb", **passed}

    def run(self, script: str, log: Path, timeout_s: float, what: str = "") -> "Ran":
        """`sh -c script` as root in the root, from the checkout; output into `log`."""
        argv = ["bwrap", "--bind", str(self.root), "/", "--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
                "--dev", "/dev", "--ro-bind", "/sys", "/sys", "--tmpfs", "/tmp", "--tmpfs", "/run",
                "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", f"bare-{self.suite}",
                "--die-with-parent", "--new-session", "--clearenv",
                *(a for k, v in self.env().items() for a in ("--setenv", k, v)),
                "--chdir", CHECKOUT, "--", "/bin/sh", "-c", script]
        start = time.monotonic()
        with open(log, "wb") as fh:
            # below the session's other work: its downloads and unpacking have time to spare, the
            # pure cgroup v2 guest (a priority above) has none
            rc = run_killable(argv, timeout_s=timeout_s, nice=5, stdout=fh, stderr=subprocess.STDOUT)
        return Ran(what or script, script, rc, time.monotonic() - start, log)


@dataclass
class Ran:
    what: str
    script: str
    rc: int | None          # None: killed at its timeout
    seconds: float
    log: Path

    def summary(self) -> str:
        return f"{self.what} {'ok' if self.rc == 0 else 'FAILED'} in {self.seconds:.0f} s"

    def problem(self, tail_lines: int = 30) -> str | None:
        if self.rc == 0:
            return None
        tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-tail_lines:])
        how = "timed out" if self.rc is None else f"exited {self.rc}"
        return f"{self.what}: `{self.script}` {how} after {self.seconds:.0f} s; end of {self.log}:\n{tail}"
