"""The host set-up script is idempotent and quiet, and bcc works in the venv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "pytest_agentcgroup" / "hostsetup.sh"
VENV_PY = ROOT / ".venv" / "bin" / "python"
SYS_BCC = Path("/usr/lib/python3/dist-packages/bcc")


def _run_setup() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, capture_output=True, text=True, timeout=900
    )


@pytest.mark.root
def test_hostsetup_second_run_is_quiet_and_succeeds():
    first = _run_setup()  # normally already done by `make setup`
    assert first.returncode == 0, first.stderr
    second = _run_setup()
    assert second.returncode == 0, second.stderr
    if second.stdout and os.geteuid() != 0:
        pytest.skip(f"not root, hostsetup reports what it cannot install: {second.stdout.strip()}")
    assert second.stdout == "", "hostsetup.sh is not quiet on a second run"


def _require_bcc() -> None:
    if not SYS_BCC.is_dir():
        pytest.skip("python3-bpfcc is not installed (hostsetup.sh could not apt-get install it)")
    assert VENV_PY.exists(), "hostsetup.sh must create .venv"


def test_bcc_importable_in_venv():
    _require_bcc()
    out = subprocess.run(
        [str(VENV_PY), "-c", "import bcc; print(bcc.__file__)"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert str(ROOT / ".venv") in out.stdout, "bcc should come via the venv's link, not dist-packages"
    # only bcc is exposed, not all of Debian's dist-packages
    out = subprocess.run(
        [str(VENV_PY), "-c", "import sys; print('/usr/lib/python3/dist-packages' in sys.path)"],
        capture_output=True, text=True, timeout=60,
    )
    assert out.stdout.strip() == "False"


_ATTACH = r"""
import json, subprocess, sys
from bcc import BPF
b = BPF(text='''
TRACEPOINT_PROBE(sched, sched_process_exec) { return 0; }
''')
progs = json.loads(subprocess.run(["bpftool", "-j", "prog", "show"],
                                  capture_output=True, text=True, check=True).stdout)
print(json.dumps([p["id"] for p in progs
                  if p.get("name", "").startswith("tracepoint__sch")]))
b.cleanup()
"""


def _prog_ids() -> set[int]:
    out = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True, check=True)
    return {p["id"] for p in json.loads(out.stdout or "[]")}


@pytest.mark.root
def test_bcc_tracepoint_attaches_and_detaches():
    _require_bcc()
    if os.geteuid() != 0:
        pytest.skip("loading eBPF programs needs root")
    if shutil.which("bpftool") is None:
        pytest.skip("bpftool is not installed")
    if not Path("/sys/kernel/tracing/events/sched/sched_process_exec").exists():
        pytest.skip("tracefs is not mounted at /sys/kernel/tracing")
    before = _prog_ids()
    out = subprocess.run([str(VENV_PY), "-c", _ATTACH], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    ours = set(json.loads(out.stdout.strip().splitlines()[-1])) - before
    assert ours, "no new tracepoint program was loaded while attached"
    assert not (ours & _prog_ids()), "eBPF program still loaded after cleanup"


# -- kernel-header links, on a stand-in /usr/src and /lib/modules ------------------------------

def _arch() -> str:
    if shutil.which("dpkg") is None:
        pytest.skip("not a Debian host (no dpkg)")
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def _headers(src: Path, name: str, common: str | None) -> Path:
    d = src / name
    d.mkdir(parents=True)
    if common:
        (src / common).mkdir(exist_ok=True)
        (d / "Makefile").write_text(f"include {src / common}/Makefile\n")
    return d


def _run_header_links(tmp: Path, src: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """hostsetup.sh with /usr/src and /lib/modules/$(uname -r) moved under tmp (everything else as
    on the host: packages and venv are already there, so only the header step acts)."""
    if os.geteuid() != 0:
        pytest.skip("hostsetup.sh makes the header links only as root")
    moddir = tmp / "modules"
    text = SCRIPT.read_text()
    assert "moddir=/lib/modules/$(uname -r)\n" in text and "/usr/src/linux-headers-" in text
    text = text.replace("moddir=/lib/modules/$(uname -r)\n", f"moddir={moddir}\n")
    text = text.replace("/usr/src/linux-headers-", f"{src}/linux-headers-")
    script = tmp / "hostsetup.sh"
    script.write_text(text)
    out = subprocess.run(["bash", str(script)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "AGENTCGROUP_ROOT": str(ROOT)})
    return out, moddir


@pytest.mark.root
def test_header_links_take_the_newest_plain_flavour_of_this_architecture(tmp_path):
    arch = _arch()
    src = tmp_path / "src"
    _headers(src, f"linux-headers-6.1.0-9-{arch}", "linux-headers-6.1.0-9-common")
    newest = _headers(src, f"linux-headers-6.1.0-12-{arch}", "linux-headers-6.1.0-12-common")
    _headers(src, f"linux-headers-6.1.0-13-cloud-{arch}", "linux-headers-6.1.0-13-common")   # not plain
    _headers(src, "linux-headers-6.1.0-14-otherarch", "linux-headers-6.1.0-14-common")       # not ours
    out, moddir = _run_header_links(tmp_path, src)
    assert out.returncode == 0 and out.stdout == "", (out.stdout, out.stderr)
    assert os.readlink(moddir / "build") == str(newest)
    assert os.readlink(moddir / "source") == str(src / "linux-headers-6.1.0-12-common")


@pytest.mark.root
def test_header_links_prefer_the_running_kernels_own_headers(tmp_path):
    arch = _arch()
    src = tmp_path / "src"
    _headers(src, f"linux-headers-9.9.9-1-{arch}", "linux-headers-9.9.9-1-common")
    own = _headers(src, f"linux-headers-{os.uname().release}", "linux-headers-own-common")
    out, moddir = _run_header_links(tmp_path, src)
    assert out.returncode == 0 and out.stdout == "", (out.stdout, out.stderr)
    assert os.readlink(moddir / "build") == str(own)
    assert os.readlink(moddir / "source") == str(src / "linux-headers-own-common")


@pytest.mark.root
def test_only_the_links_into_the_kernels_directory_leave_lib_modules(tmp_path):
    """Earlier versions linked /lib/modules/<release> to the unpacked VM kernels: set-up removes
    exactly those (a stand-in /lib/modules here), keeps everything else, and says so once."""
    if os.geteuid() != 0:
        pytest.skip("hostsetup.sh removes the links only as root")
    mods, kernels = tmp_path / "modules", tmp_path / "kernels"
    (kernels / "7.3.4+deb13-amd64" / "usr/lib/modules/7.3.4+deb13-amd64").mkdir(parents=True)
    (mods / "6.1.0-56-amd64").mkdir(parents=True)                  # an installed package's directory
    (mods / "7.3.4+deb13-amd64").symlink_to(kernels / "7.3.4+deb13-amd64/usr/lib/modules/7.3.4+deb13-amd64")
    (mods / "other").symlink_to(tmp_path / "elsewhere")             # not ours
    # build/source in an installed release's own directory: apt's (into /usr/src) stay, ours go
    hdr = kernels / "6.1.0-56-amd64/usr/src/linux-headers-6.1.0-56-amd64"
    hdr.mkdir(parents=True)
    (mods / "6.1.0-56-amd64" / "build").symlink_to(hdr)
    (mods / "6.1.0-56-amd64" / "source").symlink_to("/usr/src/linux-headers-6.1.0-56-common")
    # the tree's own build link, seen through the /lib/modules link into it, is not the host's
    tree = kernels / "7.3.4+deb13-amd64/usr/lib/modules/7.3.4+deb13-amd64"
    (tree / "build").symlink_to(kernels / "7.3.4+deb13-amd64/usr/src/linux-headers-7.3.4+deb13-amd64")
    text = SCRIPT.read_text()
    assert "HOST_MODULES=/lib/modules\n" in text
    script = tmp_path / "hostsetup.sh"
    script.write_text(text.replace("HOST_MODULES=/lib/modules\n", f"HOST_MODULES={mods}\n"))
    env = {**os.environ, "AGENTCGROUP_ROOT": str(ROOT), "AGENTCGROUP_KERNELS_DIR": str(kernels)}
    outs = [subprocess.run(["bash", str(script)], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
            for _ in range(2)]
    assert [o.returncode for o in outs] == [0, 0], [o.stderr for o in outs]
    assert f"removed {mods}/7.3.4+deb13-amd64 " in outs[0].stdout and outs[1].stdout == ""
    assert f"removed {mods}/6.1.0-56-amd64/build " in outs[0].stdout
    assert sorted(p.name for p in mods.iterdir()) == ["6.1.0-56-amd64", "other"]
    assert sorted(p.name for p in (mods / "6.1.0-56-amd64").iterdir()) == ["source"]
    assert (tree / "build").is_symlink(), "the unpacked tree's own link was removed"


def test_the_kernel_headers_package_is_this_architectures():
    arch = _arch()
    from pytest_agentcgroup import programs
    assert "linux-headers-{arch}" in programs.TABLE.read_text() and "linux-headers-amd64" not in programs.TABLE.read_text()
    assert f"linux-headers-{arch}" in {p.package for p in programs.read_table(arch=arch)}
    assert subprocess.run(["apt-cache", "show", f"linux-headers-{arch}"], capture_output=True).returncode == 0, \
        f"apt knows no linux-headers-{arch}"


def _host_kernels() -> tuple[str, list[str]]:
    """What the host boots: its installed linux-image packages and /boot."""
    pkgs = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Version} ${Status}\\n", "linux-image-*"],
                          capture_output=True, text=True).stdout
    return pkgs, sorted(p.name for p in Path("/boot").iterdir())


def _flavour_and_qemu() -> tuple[str, str]:
    from tests.kernels.vmharness import QEMU_BY_ARCH
    arch = _arch()
    if arch not in QEMU_BY_ARCH:
        pytest.skip(f"the VM tests support {', '.join(QEMU_BY_ARCH)}; this host is {arch}")
    flavour = {"ppc64el": "powerpc64le"}.get(arch, arch)
    return flavour, QEMU_BY_ARCH[arch]


def _check_vm_group(kernels_dir: Path, env: dict) -> None:
    flavour, qemu = _flavour_and_qemu()
    before = _host_kernels()
    for _ in range(2):
        out = subprocess.run(["bash", str(SCRIPT), "vm"], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                             env=env)
        assert out.returncode == 0, out.stderr
    assert out.stdout == "", "hostsetup.sh vm is not quiet on a second run"
    assert _host_kernels() == before, "hostsetup.sh vm changed the host's kernels (packages or /boot)"
    rows = {line.split()[0]: line.split()[1:] for line in (kernels_dir / "index").read_text().splitlines()
            if line.strip()}
    release, vmlinuz = rows["6.12"]
    assert release.startswith("6.12.") and release.endswith(f"+deb12-{flavour}"), release
    assert Path(vmlinuz).is_file() and Path(vmlinuz).is_relative_to(kernels_dir / release), \
        f"{vmlinuz}: not the kernel unpacked under {kernels_dir}"
    # the headers bcc needs in the guest, in the unpacked tree itself; the host's /lib/modules has
    # no link into the kernels directory (dpkg would follow one if the host installed that release)
    from tests.kernels.vmharness import Kernel
    mods = Kernel("6.12", release, Path(vmlinuz)).modules
    assert mods is not None and mods.is_relative_to(kernels_dir / release), mods
    assert (mods / "build" / "include" / "generated").is_dir() and Path(os.readlink(mods / "build")).is_relative_to(kernels_dir)
    assert (mods / "source" / "include" / "linux").is_dir() and Path(os.readlink(mods / "source")).is_relative_to(kernels_dir)
    assert (mods / "modules.dep").stat().st_size > 0
    into = [p for p in Path("/lib/modules").iterdir() if p.is_symlink() and Path(os.readlink(p)).is_relative_to(kernels_dir)]
    assert into == [], f"links into {kernels_dir} in /lib/modules"
    for tool in (qemu, "busybox"):
        assert shutil.which(tool), f"{tool} is not installed"


@pytest.mark.root
@pytest.mark.network
@pytest.mark.slow
def test_vm_group_records_a_bootable_612_kernel_with_headers_and_is_quiet():
    """Group `vm` (make test): qemu, busybox-static and the newest 6.12 kernel with its headers,
    unpacked under the kernels directory (never installed: the host's kernels and /boot stay as
    they were) and recorded in the index tests/kernels/ reads; a second run says nothing."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("hostsetup.sh fetches kernels only as root with apt-get")
    kernels_dir = Path(os.environ.get("AGENTCGROUP_KERNELS_DIR", "/var/lib/agentcgroup/kernels"))
    _check_vm_group(kernels_dir, dict(os.environ))


@pytest.mark.root
@pytest.mark.network
@pytest.mark.slow
def test_vm_group_fetches_into_an_empty_kernels_directory_without_installing(tmp_path):
    """The fetch itself (what a fresh machine does): apt-get download + dpkg-deb -x into a new
    kernels directory, the host's packages and /boot untouched (about 60 MB from the Debian mirror)."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("hostsetup.sh fetches kernels only as root with apt-get")
    _check_vm_group(tmp_path, {**os.environ, "AGENTCGROUP_KERNELS_DIR": str(tmp_path)})
