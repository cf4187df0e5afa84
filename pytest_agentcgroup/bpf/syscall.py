"""The bpf(2) system call, made through libc's syscall() with this interpreter's ABI's number.

glibc has no bpf() wrapper and Python exposes no syscall numbers, and the number differs per
architecture (the kernel's arch/*/include/uapi/asm/unistd*.h; the newer architectures share
include/uapi/asm-generic/unistd.h). The number is the one of the ABI this process runs in, not
the kernel's machine: a 32-bit Python on a 64-bit kernel (i386 userland on x86_64, armhf on
aarch64) makes 32-bit system calls, and `platform.machine()` (uname) names the kernel's. So the
key is the interpreter's own architecture (`interpreter_arch`: its multiarch triplet, else the
kernel's machine narrowed by the interpreter's pointer size). An architecture missing from the
table is a clear error naming it, never a wrong call.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct
import sysconfig

# platform.machine() -> __NR_bpf
NR_BPF = {
    "x86_64": 321,                                    # arch/x86/entry/syscalls/syscall_64.tbl
    "i386": 357, "i686": 357,                         # syscall_32.tbl
    "aarch64": 280, "arm64": 280,                     # asm-generic/unistd.h
    "riscv64": 280, "loongarch64": 280,               # asm-generic/unistd.h
    "armv7l": 386, "armv6l": 386, "armv8l": 386,      # arch/arm/tools/syscall.tbl (EABI)
    "ppc64le": 361, "ppc64": 361,                     # arch/powerpc/kernel/syscalls/syscall.tbl
    "s390x": 351, "s390": 351,                        # arch/s390/kernel/syscalls/syscall.tbl
    "x32": 0x40000000 | 321,                          # x86_64's x32 ABI: __X32_SYSCALL_BIT | the 64-bit number
}
# a 64-bit kernel machine -> its 32-bit userland's architecture (same names as NR_BPF's keys)
_COMPAT_32 = {"x86_64": "i686", "aarch64": "armv8l", "arm64": "armv8l", "ppc64le": "ppc", "ppc64": "ppc",
              "s390x": "s390"}
NR_BPF["ppc"] = 361
# the first field of a Debian/GNU multiarch triplet -> NR_BPF's key
_TRIPLET = {"x86_64": "x86_64", "i386": "i686", "i686": "i686", "aarch64": "aarch64", "arm": "armv7l",
            "powerpc64le": "ppc64le", "powerpc64": "ppc64", "powerpc": "ppc", "s390x": "s390x", "s390": "s390",
            "riscv64": "riscv64", "loongarch64": "loongarch64"}


def interpreter_arch(machine: str | None = None, pointer_bytes: int | None = None,
                     multiarch: str | None = None) -> str:
    """The architecture this Python process's system calls are made in (NR_BPF's key): from its
    multiarch triplet (`x86_64-linux-gnux32` is x32), else the kernel's machine narrowed by the
    interpreter's pointer size (4 bytes on a 64-bit kernel: that machine's 32-bit userland)."""
    machine = platform.machine() if machine is None else machine
    pointer_bytes = struct.calcsize("P") if pointer_bytes is None else pointer_bytes
    multiarch = (sysconfig.get_config_var("MULTIARCH") or "") if multiarch is None else multiarch
    if multiarch:
        cpu, _, rest = multiarch.partition("-")
        if cpu == "x86_64" and rest.endswith("gnux32"):
            return "x32"
        if cpu in _TRIPLET:
            return _TRIPLET[cpu]
    if pointer_bytes == 4 and machine in _COMPAT_32:
        return _COMPAT_32[machine]
    return machine

_libc = ctypes.CDLL(None, use_errno=True)


class UnknownArchitecture(RuntimeError):
    """The bpf() syscall number of this machine's architecture is not in NR_BPF."""


def nr_bpf(machine: str | None = None) -> int:
    """__NR_bpf of `machine` (NR_BPF's key), by default of this interpreter's ABI."""
    machine = interpreter_arch() if machine is None else machine
    try:
        return NR_BPF[machine]
    except KeyError:
        raise UnknownArchitecture(f"no bpf() syscall number for architecture '{machine}' "
                                  f"(known: {', '.join(sorted(NR_BPF))}; add it to "
                                  "pytest_agentcgroup/bpf/syscall.py NR_BPF)") from None


def bpf(cmd: int, attr: ctypes.Structure) -> int:
    """bpf(cmd, &attr, sizeof attr): the returned fd (or 0), or OSError with the kernel's errno."""
    ret = _libc.syscall(nr_bpf(), cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret
