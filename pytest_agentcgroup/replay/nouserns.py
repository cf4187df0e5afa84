"""Run a program with no way to make a user namespace: a seccomp filter, installed here and
inherited by everything the program starts, makes unshare(CLONE_NEWUSER) and clone(CLONE_NEWUSER)
fail with EPERM and clone3 with ENOSYS (its flags sit in memory a filter cannot read; libc then
falls back to clone), as Docker's default seccomp profile does for a process without
CAP_SYS_ADMIN. The docker executor's steps enter their container with nsenter, which Docker's
profile never reaches; a user namespace of its own would give a step every capability over the
namespaces it then makes (mounts, tmpfs without a size, the kernel's attack surface).

    python3 -I -S nouserns.py PROGRAM [ARGS...]     (exec's PROGRAM under the filter)

A script on its own (only the standard library, no package import), so that it starts fast.
The filter knows the system-call numbers of the architectures listed in ARCHES (each with its
32-bit compat ABI where the kernel has one); on another machine it refuses to run (exit 126)
rather than run the program unfiltered.
"""
from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38
# audit arch -> (unshare, clone, clone3); clone's flags are its first argument on all of these
ARCHES = {
    0xC000003E: (272, 56, 435),     # x86_64
    0x40000003: (310, 120, 435),    # i386 (and x86_64's 32-bit compat)
    0xC00000B7: (97, 220, 435),     # aarch64
    0x40000028: (337, 120, 435),    # arm (aarch64's 32-bit compat)
    0xC0000015: (282, 120, 435),    # ppc64le
    0xC00000F3: (97, 220, 435),     # riscv64
}
MACHINES = {"x86_64", "i686", "i386", "aarch64", "armv7l", "armv8l", "ppc64le", "riscv64"}
X32_BIT = 0x40000000                # x86_64's x32 ABI: syscall numbers with this bit set

_LD_ABS, _JEQ, _JSET, _RET = 0x20, 0x15, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16    # offsets in struct seccomp_data (little-endian machines)


def program() -> bytes:
    """The classic-BPF filter (struct sock_filter[]), assembled with symbolic jump targets."""
    code: list[tuple] = []          # (op, jt label|None, jf label|None, k) or ("label", name)

    def label(name):
        code.append(("label", name))
    for i, (arch, (unshare, clone, clone3)) in enumerate(ARCHES.items()):
        label(f"arch{i}")
        code.append((_LD_ABS, None, None, _ARCH))
        code.append((_JEQ, None, f"arch{i + 1}", arch))
        code.append((_LD_ABS, None, None, _NR))
        if arch == 0xC000003E:
            code.append((_JSET, "enosys", None, X32_BIT))
        code.append((_JEQ, "enosys", None, clone3))
        code.append((_JEQ, "flags", None, unshare))
        code.append((_JEQ, "flags", "allow", clone))
    label(f"arch{len(ARCHES)}")
    label("allow")
    code.append((_RET, None, None, _ALLOW))
    label("flags")
    code.append((_LD_ABS, None, None, _ARG0_LOW))
    code.append((_JSET, "eperm", "allow2", CLONE_NEWUSER))     # jumps only go forward
    label("eperm")
    code.append((_RET, None, None, _ERRNO | EPERM))
    label("allow2")
    code.append((_RET, None, None, _ALLOW))
    label("enosys")
    code.append((_RET, None, None, _ERRNO | ENOSYS))

    where, n = {}, 0
    for ins in code:
        if ins[0] == "label":
            where[ins[1]] = n
        else:
            n += 1
    out, pc = [], 0
    for ins in code:
        if ins[0] == "label":
            continue
        op, jt, jf, k = ins
        rel = [0 if t is None else where[t] - pc - 1 for t in (jt, jf)]
        if not all(0 <= r < 256 for r in rel):
            raise ValueError(f"nouserns: jump out of range at instruction {pc}")
        out.append(struct.pack("<HBBI", op, rel[0], rel[1], k))
        pc += 1
    return b"".join(out)


def install() -> None:
    """Install the filter on this process (root, or after PR_SET_NO_NEW_PRIVS)."""
    if platform.machine() not in MACHINES:
        raise OSError(f"nouserns: no system-call numbers for machine {platform.machine()!r}")
    prog = program()
    buf = ctypes.create_string_buffer(prog, len(prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"nouserns: prctl(PR_SET_SECCOMP): {os.strerror(err)}")


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: nouserns.py PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    try:
        install()
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"nouserns: {argv[0]}: {exc}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
