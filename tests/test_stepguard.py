"""The steps' seccomp guard (replay/stepguard.py) on its own: a new, empty session keyring, the key
calls denied with EPERM, user namespaces denied unless --allow-userns. End to end, under both
executors: tests/hostile (the key probes)."""
from __future__ import annotations

import ctypes
import os
import platform
import subprocess
import sys

import pytest

from pytest_agentcgroup.replay import stepguard
from pytest_agentcgroup.replay.executors.base import STEPGUARD

pytestmark = pytest.mark.skipif(platform.machine() not in stepguard.MACHINES, reason="no syscall numbers here")

KEYCTL_GET_KEYRING_ID, KEYCTL_JOIN_SESSION_KEYRING, KEYCTL_DESCRIBE, KEYCTL_READ = 0, 1, 6, 11
PROBE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
keyctl, add_key, request_key = (L(int(a)) for a in sys.argv[1:4])
out = []
for nr, *args in [(keyctl, L(0), L(-3), L(0)), (add_key, b"user", b"agentcgroup-probe", b"x", L(1), L(-3)),
                  (request_key, b"user", b"agentcgroup-probe", None, L(0))]:
    out.append("ok" if libc.syscall(nr, *args) >= 0 else os.strerror(ctypes.get_errno()))
out.append("ok" if libc.unshare(0x10000000) == 0 else os.strerror(ctypes.get_errno()))
print(",".join(out))
"""


def guarded_probe(*flags: str) -> list[str]:
    nr = stepguard.native_calls()
    done = subprocess.run([sys.executable, "-I", "-S", STEPGUARD, *flags, sys.executable, "-c", PROBE,
                           str(nr.keyctl), str(nr.add_key), str(nr.request_key)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(",")


def test_key_calls_fail_with_eperm_and_user_namespaces_too():
    assert guarded_probe() == ["Operation not permitted"] * 4


def test_allow_userns_leaves_user_namespaces_alone_not_keys():
    if subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode != 0:
        pytest.skip("user namespaces are not available here at all")
    assert guarded_probe("--allow-userns") == ["Operation not permitted"] * 3 + ["ok"]


def test_the_program_assembles_for_every_arch_in_both_modes():
    for deny in (True, False):
        prog = stepguard.program(deny_userns=deny)
        assert len(prog) % 8 == 0 and 0 < len(prog) // 8 < 4096
    assert set(a for pair in stepguard.MACHINES.values() for a in pair) == set(stepguard.ARCHES)


def test_the_session_keyring_is_new_and_empty():
    """In a child with a named session keyring (as a login has): after the join, -3 is another,
    anonymous keyring with no key in it. A child, so that pytest's own keyring is left alone."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(r)
            libc = ctypes.CDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            L, nr = ctypes.c_long, stepguard.native_calls()
            old = libc.syscall(L(nr.keyctl), L(KEYCTL_JOIN_SESSION_KEYRING), b"agentcgroup-test-session")
            key = libc.syscall(L(nr.add_key), b"user", b"agentcgroup-test-key", b"x", L(1), L(-3))
            new = stepguard.join_new_session_keyring()
            now = libc.syscall(L(nr.keyctl), L(KEYCTL_GET_KEYRING_ID), L(-3), L(0))
            desc = ctypes.create_string_buffer(256)
            libc.syscall(L(nr.keyctl), L(KEYCTL_DESCRIBE), L(new), desc, L(256))
            size = libc.syscall(L(nr.keyctl), L(KEYCTL_READ), L(new), None, L(0))
            libc.syscall(L(nr.keyctl), L(21), L(key))                    # KEYCTL_INVALIDATE the test key
            os.write(w, repr((old > 0, key > 0, now == new, new != old, desc.value.split(b";")[-1], size)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        said = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert said == repr((True, True, True, True, b"_ses", 0)), said
