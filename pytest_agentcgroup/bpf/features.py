"""Probe which kernel BPF features this host offers. `probe()` -> {feature: (available, reason)}.

Each probe is cheap and side-effect free (anything loaded is unloaded before returning). Tests and
arms that need a feature skip with `reason` when it is absent, e.g.
`pytest.skip(require("ringbuf"))`-style via `missing(...)`.
"""
from __future__ import annotations

import ctypes
import errno
import os
import subprocess
from functools import lru_cache
from pathlib import Path

from ..programs import which
from .syscall import UnknownArchitecture, bpf

BTF = Path("/sys/kernel/btf/vmlinux")
TRACEFS = Path("/sys/kernel/tracing")
LSM_FILE = Path("/sys/kernel/security/lsm")
SCHED_EXT = Path("/sys/kernel/sched_ext")

_BPF_MAP_CREATE = 0
_BPF_MAP_TYPE_ARRAY = 2
_BPF_MAP_TYPE_RINGBUF = 27


class _MapAttr(ctypes.Structure):
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("_pad", ctypes.c_uint8 * 112)]


def _map_create(map_type: int, key: int, value: int, entries: int) -> tuple[bool, str]:
    attr = _MapAttr(map_type=map_type, key_size=key, value_size=value, max_entries=entries)
    try:
        fd = bpf(_BPF_MAP_CREATE, attr)
    except UnknownArchitecture as exc:
        return False, str(exc)
    except OSError as exc:
        err = exc.errno
        return False, f"bpf(BPF_MAP_CREATE) failed: {errno.errorcode.get(err, err)} ({os.strerror(err)})"
    os.close(fd)
    return True, "bpf(BPF_MAP_CREATE) works"


def _bpftool() -> str | None:
    return which("bpftool")


def _btf_has_type(name: str) -> tuple[bool, str]:
    if not BTF.exists():
        return False, f"{BTF} missing (kernel built without CONFIG_DEBUG_INFO_BTF)"
    tool = _bpftool()
    if tool:
        out = subprocess.run([tool, "btf", "dump", "file", str(BTF)], capture_output=True, text=True)
        if out.returncode == 0:
            found = any(f"'{name}'" in line for line in out.stdout.splitlines())
            return found, (f"type '{name}' in kernel BTF" if found else f"no type '{name}' in kernel BTF")
    # no bpftool: the BTF string section holds every type name
    found = name.encode() in BTF.read_bytes()
    return found, (f"'{name}' in kernel BTF strings" if found else f"'{name}' not in kernel BTF")


def _exists(path: Path, *, is_dir: bool = False) -> bool:
    """Whether `path` is there, as far as this user can see: tracefs and debugfs are root-only
    (0700) on most kernels, and Path.exists raises PermissionError there instead of saying no."""
    try:
        return path.is_dir() if is_dir else path.exists()
    except OSError:
        return False


def _tracepoint(name: str) -> tuple[bool, str]:
    if not _exists(TRACEFS / "events"):
        why = "not readable by this user (root only)" if os.geteuid() != 0 and _exists(TRACEFS) else \
            f"not mounted at {TRACEFS} (mount -t tracefs nodev {TRACEFS})"
        return False, f"tracefs {why}"
    ok = _exists(TRACEFS / "events" / name, is_dir=True)
    return ok, f"tracepoint {name} {'exists' if ok else 'missing'}"


MODULES = Path("/lib/modules")


def _kernel_headers(release: str | None = None, modules: Path = MODULES) -> tuple[bool, str]:
    """bcc compiles every program at load time against the running kernel's headers: without
    them a policy arm cannot run on this host — a missing part of the host, named with its fix,
    not a broken program. BCC_KERNEL_SOURCE, when set, is where bcc looks instead."""
    release = os.uname().release if release is None else release
    override = os.environ.get("BCC_KERNEL_SOURCE")
    build = Path(override) if override else modules / release / "build"
    if (build / "include" / "generated").is_dir() or (build / "include" / "linux").is_dir():
        return True, f"kernel headers at {build}"
    what = "missing" if not build.exists() else "has no include/generated (not a configured headers tree)"
    return False, (f"kernel headers {build} {what}: bcc compiles its programs against them; run `make setup` "
                   f"(installs linux-headers for this architecture and links /lib/modules/{release}/build and "
                   "source); a kernel without a Debian headers package needs its own headers there")


def _kprobes() -> tuple[bool, str]:
    if not _exists(TRACEFS / "kprobe_events"):
        return False, f"{TRACEFS}/kprobe_events missing (kernel without CONFIG_KPROBE_EVENTS)"
    return True, "kprobe_events present"


def _lsm() -> tuple[bool, str]:
    src = LSM_FILE
    if not src.exists():
        cmdline = Path("/proc/cmdline").read_text()
        lsm_arg = next((a.split("=", 1)[1] for a in cmdline.split() if a.startswith("lsm=")), None)
        if lsm_arg is None:
            return False, f"{LSM_FILE} unreadable (securityfs not mounted) and no lsm= on the command line"
        active = lsm_arg.split(",")
    else:
        active = src.read_text().strip().split(",")
    ok = "bpf" in active
    return ok, f"active LSMs: {','.join(active)}" + ("" if ok else " (no 'bpf')")


def _cgroup_attach() -> tuple[bool, str]:
    """Really load a 2-instruction cgroup_skb program and link it to our own v2 cgroup."""
    try:
        from .loader import BPFUnavailable  # noqa: F401
        import bcc
    except ImportError as exc:
        return False, f"bcc not importable: {exc}"
    try:
        from ..cgroups.host import detect
        unified = detect().unified
    except Exception as exc:
        return False, f"no cgroup v2 directory: {exc}"
    from .loader import link_create
    b = None
    try:
        b = bcc.BPF(text=b"int agcg_probe(struct __sk_buff *skb) { return 1; }")
        fn = b.load_func(b"agcg_probe", bcc.BPF.CGROUP_SKB)
        cg_fd = os.open(unified, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.close(link_create(fn.fd, cg_fd, "cgroup_inet_egress"))
        finally:
            os.close(cg_fd)
        return True, f"cgroup_skb link on {unified} works"
    except Exception as exc:
        return False, f"cgroup_skb attach failed: {exc}"
    finally:
        if b is not None:
            b.cleanup()


@lru_cache(maxsize=1)
def probe() -> dict[str, tuple[bool, str]]:
    out: dict[str, tuple[bool, str]] = {}
    out["root"] = (os.geteuid() == 0, "running as root" if os.geteuid() == 0 else "needs root (CAP_BPF/CAP_PERFMON)")
    try:
        import bcc  # noqa: F401
        out["bcc"] = (True, "bcc importable")
    except ImportError as exc:
        out["bcc"] = (False, f"bcc not importable ({exc}); run `make setup`")
    out["bpf_syscall"] = _map_create(_BPF_MAP_TYPE_ARRAY, 4, 8, 1)
    out["kernel_headers"] = _kernel_headers()
    out["btf"] = (_exists(BTF), f"{BTF} {'present' if _exists(BTF) else 'missing'}")
    ok, why = _map_create(_BPF_MAP_TYPE_RINGBUF, 0, 0, 4096)
    out["ringbuf"] = (ok, why.replace("works", "works for BPF_MAP_TYPE_RINGBUF"))
    out["tracefs"] = (_exists(TRACEFS / "events"), f"{TRACEFS}/events " + ("present" if _exists(TRACEFS / "events")
                                                                             else "missing or not readable"))
    for tp in ("vmscan/mm_vmscan_memcg_reclaim_begin", "vmscan/mm_vmscan_memcg_reclaim_end", "oom/mark_victim",
               "exceptions/page_fault_user", "sched/sched_switch"):
        out[f"tp:{tp}"] = _tracepoint(tp)
    out["cgroup_attach"] = _cgroup_attach() if out["bcc"][0] and out["root"][0] else (False, "needs bcc and root")
    out["bpf_lsm"] = _lsm()
    out["sched_ext"] = (_exists(SCHED_EXT), f"{SCHED_EXT} {'present' if _exists(SCHED_EXT) else 'missing (kernel without CONFIG_SCHED_CLASS_EXT)'}")
    out["memcg_bpf_ops"] = _btf_has_type("memcg_bpf_ops")
    out["kprobes"] = _kprobes()
    return out


def missing(*names: str) -> str | None:
    """None when all named features are available, else '<feature>: <reason>; ...'."""
    feats = probe()
    unknown = (False, "unknown feature")
    bad = [f"{n}: {feats.get(n, unknown)[1]}" for n in names if not feats.get(n, unknown)[0]]
    return "; ".join(bad) or None


def report() -> str:
    return "\n".join(f"{'yes' if ok else 'no ':3} {name:40} {why}" for name, (ok, why) in probe().items())
