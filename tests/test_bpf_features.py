from pathlib import Path

import pytest

from pytest_agentcgroup.bpf import features

EXPECTED = {"root", "bcc", "kernel_headers", "bpf_syscall", "btf", "ringbuf", "tracefs", "cgroup_attach", "bpf_lsm",
            "sched_ext", "memcg_bpf_ops", "kprobes"}


def test_probe_reports_every_feature_with_a_reason():
    feats = features.probe()
    assert EXPECTED <= set(feats)
    for name, (ok, why) in feats.items():
        assert isinstance(ok, bool) and why, name
    assert features.missing("no-such-feature") == "no-such-feature: unknown feature"
    print(features.report())


def test_the_command_line_prints_a_line_per_feature(capsys):
    from pytest_agentcgroup.cli import main
    assert main(["bpf", "features"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {line.split()[1] for line in lines} >= EXPECTED
    assert all(line.split()[0] in ("yes", "no") for line in lines), lines


# -- the bpf() syscall number per architecture ------------------------------------------------

def _c_library_nr_bpf() -> int | None:
    """SYS_bpf as the host's C library headers give it for the native ABI (the C preprocessor
    expands it), or None without a compiler or headers."""
    import shutil
    import subprocess
    cc = shutil.which("cc") or shutil.which("cpp")
    if cc is None:
        return None
    out = subprocess.run([cc, "-E", "-P", "-"], input="#include <sys/syscall.h>\nSYS_bpf\n",
                         capture_output=True, text=True)
    last = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
    return int(last[0]) if last and last[0].strip().isdigit() else None


def test_the_bpf_syscall_number_is_the_one_the_hosts_c_library_gives():
    import platform
    from pytest_agentcgroup.bpf.syscall import nr_bpf
    expected = _c_library_nr_bpf()
    if expected is None:
        pytest.skip("cannot expand SYS_bpf: no C compiler (cc) or no <sys/syscall.h> (libc6-dev, linux-libc-dev)")
    assert nr_bpf() == expected, f"{platform.machine()}: NR_BPF says {nr_bpf()}, <sys/syscall.h> {expected}"


@pytest.mark.root
def test_the_bpf_syscall_is_really_bpf_on_this_kernel():
    """An unknown bpf command is EINVAL from bpf() itself; a wrong syscall number would be ENOSYS or
    some other call's answer."""
    import ctypes
    import errno
    from pytest_agentcgroup.bpf.syscall import bpf

    class Attr(ctypes.Structure):
        _fields_ = [("_pad", ctypes.c_uint8 * 128)]
    with pytest.raises(OSError) as err:
        bpf(0x7FFF, Attr())
    if err.value.errno == errno.EPERM:
        pytest.skip("bpf() refused with EPERM (needs root / CAP_BPF)")
    assert err.value.errno == errno.EINVAL, err.value


def test_an_architecture_without_a_number_is_a_clear_error():
    from pytest_agentcgroup.bpf.syscall import NR_BPF, UnknownArchitecture, nr_bpf
    assert nr_bpf("aarch64") == 280 and nr_bpf("x86_64") == 321
    assert len(set(NR_BPF.values())) > 1            # really per architecture
    with pytest.raises(UnknownArchitecture, match="'mips64'.*NR_BPF"):
        nr_bpf("mips64")


def test_the_number_is_keyed_on_the_interpreters_abi_not_the_kernels_machine():
    """A 32-bit userland on a 64-bit kernel: uname says x86_64 / aarch64, but this process's system
    calls are i386's / arm's (357 / 386, not 321 / 280)."""
    from pytest_agentcgroup.bpf.syscall import interpreter_arch, nr_bpf
    assert nr_bpf(interpreter_arch("x86_64", 4, "i386-linux-gnu")) == 357
    assert nr_bpf(interpreter_arch("x86_64", 4, "")) == 357                 # no triplet: the pointer size
    assert nr_bpf(interpreter_arch("aarch64", 4, "arm-linux-gnueabihf")) == 386
    assert nr_bpf(interpreter_arch("aarch64", 4, "")) == 386
    assert nr_bpf(interpreter_arch("x86_64", 4, "x86_64-linux-gnux32")) == 0x40000000 | 321
    assert nr_bpf(interpreter_arch("x86_64", 8, "x86_64-linux-gnu")) == 321
    assert nr_bpf(interpreter_arch("aarch64", 8, "")) == 280
    import struct
    if struct.calcsize("P") == 8:      # this interpreter is 64-bit: its number is its machine's
        import platform
        assert nr_bpf() == nr_bpf(platform.machine())


def test_missing_kernel_headers_are_a_feature_the_policy_arms_need_named_with_the_fix(tmp_path):
    """Without the running kernel's headers bcc cannot compile: the policy arms skip naming
    /lib/modules/<release>/build and `make setup`, instead of failing as if a program were broken."""
    from pytest_agentcgroup.bpf.controller import NEEDS
    assert "kernel_headers" in NEEDS
    ok, why = features._kernel_headers("0.0-no-such-release", modules=tmp_path)
    assert not ok and f"{tmp_path}/0.0-no-such-release/build missing" in why and "make setup" in why, why
    (tmp_path / "r" / "build").mkdir(parents=True)                 # a dangling-link-like empty dir
    ok, why = features._kernel_headers("r", modules=tmp_path)
    assert not ok and "has no include/generated" in why, why
    ok, why = features.probe()["kernel_headers"]                  # this host: what bcc will really use
    import os
    assert ok == (Path("/lib/modules") / os.uname().release / "build" / "include").is_dir() or \
        bool(os.environ.get("BCC_KERNEL_SOURCE")), why
