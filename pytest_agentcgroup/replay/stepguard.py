"""The steps' seccomp guard: run a program in a new, empty session keyring, under a seccomp filter
that everything the program starts inherits. The sandbox and docker executors wrap every step with
it (the sandbox's whole setpriv/bwrap command, docker's nsenter).

- Kernel keys: keyctl, add_key and request_key fail with EPERM, as under Docker's default seccomp
  profile. A step otherwise reaches the keys of whoever started pytest: a session keyring is
  inherited across setpriv, bwrap and nsenter and possessed whatever the step's uid, and a docker
  step, uid 0 of the host's user namespace, reads host root's user keyring. The guard first joins
  a new anonymous session keyring (KEYCTL_JOIN_SESSION_KEYRING), so the one it was started in is
  no longer the step's, then installs the filter.
- User namespaces (unless --allow-userns): unshare(CLONE_NEWUSER) and clone(CLONE_NEWUSER) fail
  with EPERM and clone3 with ENOSYS (its flags sit in memory a filter cannot read; libc then falls
  back to clone), as Docker's profile does for a process without CAP_SYS_ADMIN. A docker step,
  entered with nsenter, gets no Docker profile; a user namespace of its own would give it every
  capability over the namespaces it then makes (mounts, tmpfs without a size, the kernel's attack
  surface). The sandbox passes --allow-userns: bwrap makes the step's user namespace itself, and
  its --disable-userns keeps the step from making more.

    python3 -I -S stepguard.py [--allow-userns] PROGRAM [ARGS...]     (exec's PROGRAM)

EPERM rather than ENOSYS for the key calls: it is what Docker's profile returns, so a step sees
what it would under `docker run`, and programs that use keys optionally (keyutils, Kerberos'
KEYRING ccache) treat it as "not allowed here" rather than as a kernel without keys.

A script on its own (only the standard library, no package import), so that it starts fast.
The filter knows the system-call numbers of the architectures listed in ARCHES (each with its
32-bit compat ABI where the kernel has one); on another machine it refuses to run (exit 126)
rather than run the program unguarded, and so does a failed keyring join.
"""
from __future__ import annotations

import collections
import ctypes
import errno
import os
import struct
import sys

CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38
KEYCTL_JOIN_SESSION_KEYRING = 1


# system-call numbers of one ABI (clone's flags are its first argument on all of ARCHES)
Calls = collections.namedtuple("Calls", "unshare clone clone3 add_key request_key keyctl")


# audit arch -> numbers, from the kernel's arch/*/syscall*.tbl and include/uapi/asm-generic/unistd.h
ARCHES = {
    0xC000003E: Calls(272, 56, 435, 248, 249, 250),      # x86_64
    0x40000003: Calls(310, 120, 435, 286, 287, 288),     # i386 (and x86_64's 32-bit compat)
    0xC00000B7: Calls(97, 220, 435, 217, 218, 219),      # aarch64 (asm-generic)
    0x40000028: Calls(337, 120, 435, 309, 310, 311),     # arm (aarch64's 32-bit compat)
    0xC0000015: Calls(282, 120, 435, 269, 270, 271),     # ppc64le
    0xC00000F3: Calls(97, 220, 435, 217, 218, 219),      # riscv64 (asm-generic)
}
# os.uname().machine -> the audit arch of a 64-bit (or only) process on it, and of a 32-bit one
MACHINES = {
    "x86_64": (0xC000003E, 0x40000003), "i686": (0x40000003,) * 2, "i386": (0x40000003,) * 2,
    "aarch64": (0xC00000B7, 0x40000028), "armv7l": (0x40000028,) * 2, "armv8l": (0x40000028,) * 2,
    "ppc64le": (0xC0000015,) * 2, "riscv64": (0xC00000F3,) * 2,
}
X32_BIT = 0x40000000                # x86_64's x32 ABI: syscall numbers with this bit set

_LD_ABS, _JEQ, _JSET, _RET = 0x20, 0x15, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0_LOW = 0, 4, 16    # offsets in struct seccomp_data (little-endian machines)


def native_calls() -> Calls:
    """The system-call numbers of this process's own ABI."""
    wide, narrow = MACHINES[os.uname().machine]
    return ARCHES[wide if ctypes.sizeof(ctypes.c_void_p) == 8 else narrow]


def program(*, deny_userns: bool = True) -> bytes:
    """The classic-BPF filter (struct sock_filter[]), assembled with symbolic jump targets."""
    code: list[tuple] = []          # (op, jt label|None, jf label|None, k) or ("label", name)

    def label(name):
        code.append(("label", name))
    for i, (arch, nr) in enumerate(ARCHES.items()):
        label(f"arch{i}")
        code.append((_LD_ABS, None, None, _ARCH))
        code.append((_JEQ, None, f"arch{i + 1}", arch))
        code.append((_LD_ABS, None, None, _NR))
        if arch == 0xC000003E:
            code.append((_JSET, "enosys", None, X32_BIT))
        code.append((_JEQ, "eperm", None, nr.add_key))
        code.append((_JEQ, "eperm", None, nr.request_key))
        if deny_userns:
            code.append((_JEQ, "eperm", None, nr.keyctl))
            code.append((_JEQ, "enosys", None, nr.clone3))
            code.append((_JEQ, "flags", None, nr.unshare))
            code.append((_JEQ, "flags", "allow", nr.clone))
        else:
            code.append((_JEQ, "eperm", "allow", nr.keyctl))
    label(f"arch{len(ARCHES)}")
    label("allow")
    code.append((_RET, None, None, _ALLOW))
    if deny_userns:
        label("flags")
        code.append((_LD_ABS, None, None, _ARG0_LOW))
        code.append((_JSET, "eperm", "allow2", CLONE_NEWUSER))     # jumps only go forward
        label("allow2")
        code.append((_RET, None, None, _ALLOW))
    label("eperm")
    code.append((_RET, None, None, _ERRNO | EPERM))
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
            raise ValueError(f"stepguard: jump out of range at instruction {pc}")
        out.append(struct.pack("<HBBI", op, rel[0], rel[1], k))
        pc += 1
    return b"".join(out)


def join_new_session_keyring() -> int:
    """Make this process's session keyring a new, empty, anonymous one; its serial."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    serial = libc.syscall(ctypes.c_long(native_calls().keyctl), ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING),
                          ctypes.c_void_p(None))
    if serial <= 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:       # a kernel without keys (CONFIG_KEYS=n): no keyring to reach
            return 0
        raise OSError(err, f"stepguard: keyctl(KEYCTL_JOIN_SESSION_KEYRING): {os.strerror(err)}")
    return serial


def install(*, deny_userns: bool = True) -> None:
    """Join a new session keyring, then install the filter on this process (no_new_privs is set
    first when not root, as the kernel requires of an unprivileged process)."""
    if os.uname().machine not in MACHINES:
        raise OSError(f"stepguard: no system-call numbers for machine {os.uname().machine!r}")
    join_new_session_keyring()
    prog = program(deny_userns=deny_userns)
    buf = ctypes.create_string_buffer(prog, len(prog))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if os.geteuid() != 0 and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"stepguard: prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(err)}")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"stepguard: prctl(PR_SET_SECCOMP): {os.strerror(err)}")


def main(argv: list[str]) -> int:
    deny_userns = not (argv[:1] == ["--allow-userns"])
    argv = argv if deny_userns else argv[1:]
    if not argv:
        print("usage: stepguard.py [--allow-userns] PROGRAM [ARGS...]", file=sys.stderr)
        return 2
    try:
        install(deny_userns=deny_userns)
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"stepguard: {argv[0]}: {exc}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
