"""The bpf(2) system call, made through libc's syscall() with the running architecture's number.

glibc has no bpf() wrapper and Python exposes no syscall numbers, and the number differs per
architecture (the kernel's arch/*/include/uapi/asm/unistd*.h; the newer architectures share
include/uapi/asm-generic/unistd.h). An architecture missing from the table is a clear error naming
it, never a wrong call.
"""
from __future__ import annotations

import ctypes
import os
import platform

# platform.machine() -> __NR_bpf
NR_BPF = {
    "x86_64": 321,                                    # arch/x86/entry/syscalls/syscall_64.tbl
    "i386": 357, "i686": 357,                         # syscall_32.tbl
    "aarch64": 280, "arm64": 280,                     # asm-generic/unistd.h
    "riscv64": 280, "loongarch64": 280,               # asm-generic/unistd.h
    "armv7l": 386, "armv6l": 386, "armv8l": 386,      # arch/arm/tools/syscall.tbl (EABI)
    "ppc64le": 361, "ppc64": 361,                     # arch/powerpc/kernel/syscalls/syscall.tbl
    "s390x": 351,                                     # arch/s390/kernel/syscalls/syscall.tbl
}

_libc = ctypes.CDLL(None, use_errno=True)


class UnknownArchitecture(RuntimeError):
    """The bpf() syscall number of this machine's architecture is not in NR_BPF."""


def nr_bpf(machine: str | None = None) -> int:
    machine = platform.machine() if machine is None else machine
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
