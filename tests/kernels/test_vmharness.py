"""The harness's own judgement, without booting: what it reads back from a guest's files must fail
a run that did not happen, did not run tests, or ran on anything but pure cgroup v2."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from . import vmharness

KERNEL = vmharness.Kernel("6.12", "6.12.117+deb12-amd64", Path("/boot/vmlinuz-6.12.117+deb12-amd64"))

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_cgroups" name="test_ok" time="0.1"/>
<testcase classname="tests.test_cgroups" name="test_limit" time="0.2"><failure message="boom">{long}
FileNotFoundError: [Errno 2] No such file or directory: '/sys/fs/cgroup/agentcgroup-1-2/cgroup.subtree_control'</failure></testcase>
<testcase classname="tests.test_bpf_features" name="test_probe" time="0.0"><skipped message="no BTF"/></testcase>
</testsuite></testsuites>"""


def write_run(out: Path, name: str, rc: int | None, junit: str | None, log: str = "") -> None:
    (out / f"{name}.start").write_text("1795500886\n")     # the guest stamps it before pytest starts
    (out / f"{name}.log").write_text(log)
    if rc is not None:
        (out / f"{name}.rc").write_text(f"{rc}\n")
    if junit is not None:
        (out / f"{name}.xml").write_text(junit)


def write_v2_probe(out: Path, release: str = KERNEL.release) -> None:
    (out / "probe.uname").write_text(release + "\n")
    (out / "probe.cgroup").write_text("0::/\n")
    (out / "probe.mounts").write_text("cgroup2 /sys/fs/cgroup cgroup2 rw,relatime 0 0\n")
    (out / "probe.headers").write_text("ok\n")


def test_failing_tests_are_named_with_the_end_of_their_report(tmp_path):
    write_run(tmp_path, "subset", 1, JUNIT.format(long="\n".join(f"line {i}" for i in range(40))))
    problems = vmharness.read_run(tmp_path, "subset").problems()
    assert len(problems) == 1
    assert "tests.test_cgroups::test_limit (failure)" in problems[0]
    assert "cgroup.subtree_control" in problems[0] and "line 39" in problems[0]
    assert "line 5\n" not in problems[0], "only the end of a long report is kept"
    assert "tests.test_cgroups::test_ok" not in problems[0]


@pytest.mark.parametrize("rc, junit, log, expect", [
    (5, '<testsuites><testsuite tests="0"/></testsuites>', "no tests ran", "no tests ran"),
    (None, None, "collecting", "did not finish"),
    (2, None, "ERROR: usage", "without a JUnit XML"),
    (0, '<testsuites><testsuite><testcase classname="a" name="b"><skipped message="no bcc"/></testcase>'
        '</testsuite></testsuites>', "", "all 1 tests skipped"),
])
def test_a_run_that_ran_nothing_fails(tmp_path, rc, junit, log, expect):
    write_run(tmp_path, "subset", rc, junit, log)
    problems = vmharness.read_run(tmp_path, "subset").problems()
    assert problems and expect in problems[0]


def test_this_hybrid_host_is_not_taken_for_pure_cgroup_v2(tmp_path):
    # the real /proc files of the host the tests run on (hybrid v1+v2 here)
    (tmp_path / "probe.uname").write_text(os.uname().release + "\n")
    (tmp_path / "probe.cgroup").write_text(Path("/proc/self/cgroup").read_text())
    (tmp_path / "probe.mounts").write_text(Path("/proc/mounts").read_text())
    probe = vmharness.read_probe(tmp_path)
    if probe.mode == "v2":
        pytest.skip("this host mounts pure cgroup v2 itself")
    problems = probe.problems(KERNEL)
    assert any("not the requested" in p for p in problems)
    assert any("v1" in p for p in problems)


def test_pure_v2_probe_of_the_requested_kernel_passes_and_another_kernel_fails(tmp_path):
    write_v2_probe(tmp_path)
    assert vmharness.read_probe(tmp_path).problems(KERNEL) == []
    write_v2_probe(tmp_path, "6.1.0-56-amd64")
    assert "not the requested" in vmharness.read_probe(tmp_path).problems(KERNEL)[0]
    assert "no probe" in vmharness.read_probe(tmp_path / "missing").problems(KERNEL)[0]


def test_guest_that_did_not_reach_its_end_fails(tmp_path):
    write_v2_probe(tmp_path)
    write_run(tmp_path, "subset", 0, '<testsuites><testsuite><testcase classname="a" name="b"/>'
                                     '</testsuite></testsuites>')
    result = vmharness.GuestResult(KERNEL, tmp_path, vng_rc=0, seconds=1.0, probe=vmharness.read_probe(tmp_path),
                                   runs={"subset": vmharness.read_run(tmp_path, "subset")})
    assert "before its script finished" in result.problems()[0]
    (tmp_path / "guest.done").write_text("done\n")
    assert result.problems() == []
    assert "cgroup v2" in result.verdict() and "1 passed, 0 failed" in result.verdict()


def test_a_run_cut_short_says_it_started_and_one_never_reached_says_not_run(tmp_path):
    # a guest that panicked mid-run (vng exit 255) left <name>.start and a log, no rc, no JUnit
    (tmp_path / "subset.start").write_text("1795500886\n")
    (tmp_path / "subset.log").write_text("....s....\n")
    assert vmharness.read_run(tmp_path, "subset").counts() == "started, did not finish"
    assert vmharness.read_run(tmp_path, "other").counts() == "not run"
    assert "pytest did not finish in the guest" in vmharness.read_run(tmp_path, "subset").problems()[0]
    assert "pytest never started in the guest" in vmharness.read_run(tmp_path, "other").problems()[0]


def test_missing_kernel_names_what_to_run(tmp_path):
    with pytest.raises(vmharness.KernelMissing, match="hostsetup.sh vm-kernels"):
        vmharness.find_kernel("7.3", tmp_path / "index")
    (tmp_path / "index").write_text("6.1 6.1.0-56-amd64 /nonexistent/vmlinuz\n")
    with pytest.raises(vmharness.KernelMissing, match="does not exist"):
        vmharness.find_kernel("6.1", tmp_path / "index")
    with pytest.raises(vmharness.KernelMissing, match="hostsetup.sh vm`"):
        vmharness.find_kernel("6.12", tmp_path / "index")


def test_tests_failing_the_same_way_are_named_once_each_with_one_report(tmp_path):
    case = ('<testcase classname="t" name="{n}"><error message="x">path = {n}\n'
            'E   FileNotFoundError: [Errno 2]\nnode.py:41: FileNotFoundError</error></testcase>')
    write_run(tmp_path, "subset", 1, "<testsuites><testsuite>" + case.format(n="a") + case.format(n="b")
              + "</testsuite></testsuites>")
    problem, = vmharness.read_run(tmp_path, "subset").problems()
    assert "t::b (error): same as t::a (error)" in problem
    assert problem.count("FileNotFoundError: [Errno 2]") == 1


def test_an_architecture_without_a_vm_kernel_is_named():
    with pytest.raises(vmharness.KernelMissing, match="amd64, arm64.*this host is s390x"):
        vmharness.qemu_for_host("s390x")
    arch = vmharness.debian_arch()
    if arch in vmharness.QEMU_BY_ARCH:         # this host's own: its qemu is the one hostsetup.sh installs
        try:
            assert vmharness.qemu_for_host(arch) == vmharness.QEMU_BY_ARCH[arch]
        except vmharness.KernelMissing as exc:  # `make setup` without its vm group: named, with its package
            assert vmharness.QEMU_BY_ARCH[arch] in str(exc) and "Debian package" in str(exc)


def test_a_user_run_gets_a_delegated_cgroup_and_no_root(tmp_path):
    """The guest script of a run as a user: its cgroup delegated as systemd's Delegate=yes does (the
    directory and its three files chowned), the shell moved there as root, then pytest as the user
    with no capability; what the user reads is copied in, what it writes copied back."""
    out = tmp_path / "out"
    run = vmharness.PytestRun("deleg", ("tests/test_cgroups.py", "--agentcgroup-config", str(out / "c.toml")),
                              user="nobody")
    script = vmharness.guest_script(out, [run])
    cg = "/sys/fs/cgroup/deleg"
    assert f"chown nobody {cg} {cg}/cgroup.procs {cg}/cgroup.threads {cg}/cgroup.subtree_control" in script
    launch = next(ln for ln in script.splitlines() if "setpriv" in ln)
    assert launch.startswith(f"sh -c 'echo $$ >{cg}/cgroup.procs && exec setpriv --reuid nobody")
    assert "--inh-caps=-all --bounding-set=-all" in launch
    assert f"{vmharness.GUEST_TMP}/deleg/in/c.toml" in launch and str(out) not in launch.split("' sh ", 1)[1]
    assert f'cp -r {vmharness.GUEST_TMP}/deleg/out/. "$OUT"/' in script


def test_a_guest_without_kernel_headers_fails_and_the_modules_come_from_the_unpacked_tree(tmp_path):
    write_v2_probe(tmp_path)
    (tmp_path / "probe.headers").write_text("no /lib/modules/x/build/include/generated or ...\n")
    assert "kernel headers for bcc: no /lib/modules/x/build" in vmharness.read_probe(tmp_path).problems(KERNEL)[0]
    (tmp_path / "probe.headers").unlink()
    assert "not checked" in vmharness.read_probe(tmp_path).problems(KERNEL)[0]
    # a tree as hostsetup.sh unpacks a trixie kernel: vmlinuz beside the modules, under usr/
    mods = tmp_path / "k" / "usr" / "lib" / "modules" / KERNEL.release
    mods.mkdir(parents=True)
    kernel = vmharness.Kernel("6.12", KERNEL.release, mods / "vmlinuz")
    assert kernel.modules == mods
    script = vmharness.guest_script(tmp_path, [], modules=kernel.modules)
    assert f"ln -s {mods} /lib/modules/$rel" in script
    assert "/lib/modules/" + KERNEL.release not in script.replace(str(mods), ""), "the host's /lib/modules is not used"


def test_a_docker_data_root_the_guest_did_not_unpack_fails_the_boot(tmp_path):
    image = tmp_path / "docker-root.tar"
    script = vmharness.guest_script(tmp_path, [], docker_image=image)
    assert "mount -t tmpfs -o mode=0711,size=1G agentcgroup-docker /var/lib/docker" in script
    assert f"tar -C /var/lib/docker --xattrs --xattrs-include='*' -xf {image}" in script
    assert script.index("-xf") < script.index("guest.done")
    assert "dockerd --" not in script and "docker load" not in script and "containerd --" not in script, \
        "the data root is unpacked: the one dockerd is the plugin's"
    write_v2_probe(tmp_path)
    (tmp_path / "guest.done").write_text("done\n")
    (tmp_path / "docker-load.log").write_text("tar: /x: Cannot open: No such file or directory\n")
    (tmp_path / "docker-load.rc").write_text("2\n")
    result = vmharness.GuestResult(KERNEL, tmp_path, vng_rc=0, seconds=1.0, probe=vmharness.read_probe(tmp_path),
                                   runs={}, docker_image=image)
    assert "did not unpack its Docker data root docker-root.tar" in result.problems()[0]
    assert "Cannot open" in result.problems()[0]
    (tmp_path / "docker-load.rc").write_text("0\n")
    assert result.problems() == []


def test_the_guest_loads_the_image_only_once_the_host_says_it_is_whole_or_why_not(tmp_path):
    """The preload's wait and unpack lines, run by a real sh: nothing happens before the host's
    word; a failure's reason ends in docker-load.log with rc 125 (nothing unpacked)."""
    image = tmp_path / "docker-root.tar"
    lines = vmharness.guest_script(tmp_path, [], docker_image=image).splitlines()
    wait = next(ln for ln in lines if ln.startswith("i=0; until [ -e"))
    load = next(ln for ln in lines if ln.startswith("if [ -e"))
    assert f"-xf {image}" in load and lines.index(wait) < lines.index(load)
    guest = subprocess.Popen(["sh", "-c", f"OUT={tmp_path}\n{wait}\n{load}"])
    try:
        time.sleep(2)
        assert guest.poll() is None and not (tmp_path / "docker-load.rc").exists(), "unpacked before the host's word"
        vmharness.mark_image(image, "debootstrap failed: no Debian mirror")
        assert guest.wait(timeout=30) == 0
    finally:
        guest.kill()
    assert (tmp_path / "docker-load.rc").read_text().strip() == "125"
    assert "no image from the host after" in (tmp_path / "docker-load.log").read_text()
    assert "debootstrap failed: no Debian mirror" in (tmp_path / "docker-load.log").read_text()


def test_the_probe_is_written_before_anything_touches_the_guest(tmp_path):
    mods = tmp_path / "k" / "lib" / "modules" / KERNEL.release
    script = vmharness.guest_script(tmp_path, [vmharness.PytestRun("subset", ("tests",))], modules=mods,
                                    docker_image=tmp_path / "docker-root.tar")
    first_touch = min(script.index(s) for s in ("mount -t", "tar -C", "-m pytest"))
    for probe in ("probe.uname", "probe.cgroup", "probe.mounts", "probe.controllers", "probe.subtree_control"):
        assert script.index(probe) < first_touch, probe


def test_apparmor_is_turned_off_only_for_a_boot_with_the_docker_engine(tmp_path):
    args = dict(memory="2G", cpus=2)
    plain = vmharness.vng_argv(Path("vng"), KERNEL, tmp_path, tmp_path / "guest.sh", docker=False, **args)
    with_docker = vmharness.vng_argv(Path("vng"), KERNEL, tmp_path, tmp_path / "guest.sh", docker=True, **args)
    assert "apparmor=0" not in plain and with_docker[-2:] == ["--append", "apparmor=0"]
    # both keep the kernel's console (vng.log), at errors only: loglevel=4 comes after --verbose's 7
    for argv in (plain, with_docker):
        assert "--verbose" in argv and argv[argv.index("--verbose") + 1:][:2] == ["--append", "loglevel=4"]
        assert "--qemu-opts=-accel tcg,thread=single" in argv      # coherent kernel text patching


def test_the_modules_are_looked_for_in_the_nearest_lib_modules_only(tmp_path):
    # the nearest tree has a lib/modules without this release: not a farther one's (nor the host's)
    (tmp_path / "lib" / "modules" / KERNEL.release).mkdir(parents=True)
    (tmp_path / "k" / "lib" / "modules" / "other-release").mkdir(parents=True)
    assert vmharness.Kernel("6.12", KERNEL.release, tmp_path / "k" / "boot" / "vmlinuz").modules is None
    # never the root's /lib/modules, even for a vmlinuz with no tree of its own
    assert vmharness.Kernel("6.12", os.uname().release, Path("/boot/vmlinuz")).modules is None


def test_the_docker_cases_count_only_when_one_passed_and_none_skipped(tmp_path):
    from .checks import docker_problems, docker_verdict
    case = '<testcase classname="tests.hostile.test_x" name="test_a[{ex}]"{body}'
    def run(*cases):
        write_run(tmp_path, "subset", 0, "<testsuites><testsuite>" + "".join(cases) + "</testsuite></testsuites>")
        return vmharness.read_run(tmp_path, "subset")
    passed = case.format(ex="docker", body="/>")
    skipped = case.format(ex="docker", body='><skipped message="no image"/></testcase>')
    sandbox = case.format(ex="sandbox", body="/>")
    assert docker_problems(run(sandbox, passed)) == []
    assert "no docker case passed" in docker_problems(run(sandbox))[0]
    assert any("did not run in the guest" in p and "no image" in p for p in docker_problems(run(passed, skipped)))
    # the verdict reads the guest's docker-load.rc, never assumes the load worked
    image = tmp_path / "docker-image.tar"
    assert docker_verdict(tmp_path, None, "no docker on the host: x") == "no docker on the host: x"
    assert "NOT loaded (docker-load.rc missing)" in docker_verdict(tmp_path, image, "img")
    (tmp_path / "docker-load.rc").write_text("1\n")
    assert "NOT loaded (docker-load.rc 1)" in docker_verdict(tmp_path, image, "img")
    (tmp_path / "docker-load.rc").write_text("0\n")
    assert docker_verdict(tmp_path, image, "img") == "img loaded"


def test_run_killable_runs_at_the_priority_asked_and_its_children_inherit_it(tmp_path):
    out = tmp_path / "nice"
    # field 19 of /proc/PID/stat is the nice value; the inner sh is a child of the one started
    rc = vmharness.run_killable(["sh", "-c", f"sh -c 'cut -d\" \" -f19 /proc/$$/stat' > {out}"], timeout_s=30, nice=5)
    assert rc == 0 and out.read_text().strip() == str(min(os.getpriority(os.PRIO_PROCESS, 0) + 5, 19))


def test_the_kernel_headers_reach_the_guest_as_one_tarball_and_replace_only_build_and_source(tmp_path):
    # a tree as hostsetup.sh unpacks it: build and source are links, build's own entries link on
    src = tmp_path / "usr" / "src"
    (src / "common" / "include" / "linux").mkdir(parents=True)
    (src / "common" / "include" / "linux" / "sched.h").write_text("/* sched */\n")
    (src / "common" / "arch" / "x86" / "include" / "asm").mkdir(parents=True)
    (src / "common" / "arch" / "x86" / "include" / "asm" / "ptrace.h").write_text("/* x86 */\n")
    (src / "common" / "arch" / "mips" / "include").mkdir(parents=True)
    (src / "common" / "scripts").mkdir()
    (src / "amd64" / "include" / "generated").mkdir(parents=True)
    (src / "amd64" / "include" / "generated" / "autoconf.h").write_text("#define CONFIG_X 1\n")
    (src / "amd64" / "arch" / "x86" / "include" / "generated").mkdir(parents=True)
    (src / "amd64" / ".config").write_text("CONFIG_X=y\n")
    (src / "amd64" / "vmlinux").write_bytes(b"\0" * 4096)
    os.symlink("../../common/include/linux", src / "amd64" / "include" / "linux")
    os.symlink("gone.h", src / "common" / "include" / "linux" / "dangling.h")
    mods = tmp_path / "tree" / KERNEL.release        # not under a lib/modules: the test stands one in for the guest's
    mods.mkdir(parents=True)
    os.symlink(src / "amd64", mods / "build")
    os.symlink(src / "common", mods / "source")
    tar = vmharness.write_headers(mods, tmp_path / "kernel-headers.tar.gz")
    import tarfile
    with tarfile.open(tar) as t:
        names = {m.name: m for m in t.getmembers()}
    for want in ("build/include/generated/autoconf.h", "build/include/linux/sched.h", "build/.config",
                 "build/arch/x86/include/generated", "source/include/linux/sched.h",
                 "source/arch/x86/include/asm/ptrace.h"):
        assert want in names, want
    assert names["build/include/linux/sched.h"].isfile(), "links are followed: the guest has no host paths"
    assert not any(n.startswith(("build/vmlinux", "source/arch/mips", "source/scripts")) for n in names), sorted(names)
    (mods / "kernel").mkdir()
    (mods / "modules.dep").write_text("")
    script = vmharness.guest_script(tmp_path, [], modules=mods, headers=tar)
    assert f"ln -s {mods} /lib/modules/$rel" not in script
    # the guest's lines after its tmpfs mount, run by a real sh on a directory standing for /lib/modules
    lines = script.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("mount -t tmpfs -o mode=0755 agentcgroup-modules"))
    end = next(i for i, ln in enumerate(lines) if ln.startswith("h=/lib/modules"))
    def guest(lib: Path) -> Path:
        (lib / "R").mkdir(parents=True)
        body = "\n".join(lines[start + 1:end]).replace("/lib/modules", str(lib))
        subprocess.run(["sh", "-c", f"rel=R\n{body}"], check=True, timeout=60)
        return lib / "R"
    got = guest(tmp_path / "lm1")
    assert (got / "kernel").is_symlink() and (got / "modules.dep").is_symlink()
    assert not (got / "build").is_symlink() and (got / "build" / "include" / "generated" / "autoconf.h").is_file()
    assert (got / "source" / "include" / "linux" / "sched.h").read_text() == "/* sched */\n"
    # the host could not write it: the tree's own links, at once
    tar.rename(tmp_path / "elsewhere.tar.gz")
    Path(str(tar) + ".failed").write_text("disk full\n")
    got = guest(tmp_path / "lm2")
    assert (got / "build").is_symlink() and os.readlink(got / "build") == str(mods / "build")
    # without the tarball, the tree itself (as before)
    assert f"ln -s {mods} /lib/modules/$rel" in vmharness.guest_script(tmp_path, [], modules=mods)


def _kernel_with_config(tmp_path: Path, line: str) -> vmharness.Kernel:
    boot = tmp_path / "boot"
    boot.mkdir(parents=True)
    (boot / f"vmlinuz-{KERNEL.release}").write_bytes(b"")
    (boot / f"config-{KERNEL.release}").write_text(f"CONFIG_X=y\n{line}\n")
    return vmharness.Kernel("6.12", KERNEL.release, boot / f"vmlinuz-{KERNEL.release}")


def test_the_root_goes_over_virtio_fs_only_where_the_kernel_has_it_built_in(tmp_path):
    assert vmharness.root_share(_kernel_with_config(tmp_path / "m", "CONFIG_VIRTIO_FS=m")) == (None, ["--force-9p"])
    shim, options = vmharness.root_share(_kernel_with_config(tmp_path / "y", "CONFIG_VIRTIO_FS=y"))
    assert options == []
    if vmharness.VIRTIOFSD_C.exists():       # qemu 7.2's C daemon: the shim, first on vng's PATH
        try:
            assert (shim / "virtiofsd").resolve() == vmharness.VIRTIOFS_SHIM
            # host root runs what vng finds there: a directory of its own, not the guest's writable one
            assert shim.stat().st_mode & 0o077 == 0 and shim.stat().st_uid == os.geteuid()
        finally:
            shutil.rmtree(shim)
    else:                                    # vng finds a Rust daemon itself, or takes 9p
        assert shim is None
    # the verdict says which the guest got
    (tmp_path / "probe.mounts").write_text("ROOTFS / virtiofs ro,relatime 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n")
    assert vmharness.read_probe(tmp_path).root_fs == "virtiofs"


@pytest.mark.vm
@pytest.mark.root
def test_the_virtio_fs_shim_serves_a_read_only_root_and_leaves_nothing_behind(tmp_path):
    """virtiofsd.sh as vng starts it (its options, in the background, then waiting for S.pid): the
    real C daemon serves the tree, in which nothing can be written, and is gone, with its mount
    point, once vng signals the pid it was given."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the shim's mount namespace and the daemon")
    if not vmharness.VIRTIOFSD_C.exists():
        pytest.skip(f"{vmharness.VIRTIOFSD_C} is missing (qemu-system-common of qemu 7.2; qemu 8 ships none)")
    sock = tmp_path / "virtme-sock"
    sock.write_text("")                              # vng's mkstemp
    before = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("agentcgroup-virtiofs.*"))
    shim = subprocess.Popen(["sh", str(vmharness.VIRTIOFS_SHIM), "--syslog", "--no-announce-submounts",
                             "--readonly", "--socket-path", str(sock), "--shared-dir", "/", "--sandbox",
                             "none", "--cache", "always"])
    pidfile = Path(f"{sock}.pid")
    try:
        deadline = time.monotonic() + 30
        while not pidfile.exists() and time.monotonic() < deadline and shim.poll() is None:
            time.sleep(0.05)
        assert pidfile.exists(), f"no {pidfile}: the shim ended with {shim.poll()}"
        pid = int(pidfile.read_text())
        assert sock.is_socket() and Path(f"/proc/{pid}/comm").read_text().strip() == "virtiofsd"
        (root,) = set(Path(os.environ.get("TMPDIR", "/tmp")).glob("agentcgroup-virtiofs.*")) - before
        canary = f"agentcgroup-canary-{os.getpid()}"
        for place in ("", "tmp", "root", "dev/shm"):   # the tree and mounts under it, some rw on the host
            target = root / place / canary
            tried = subprocess.run(["nsenter", "-t", str(pid), "-m", "touch", str(target)],
                                   capture_output=True, text=True, timeout=30)
            assert tried.returncode != 0 and "Read-only file system" in tried.stderr, (place, tried)
            assert not (Path("/") / place / canary).exists()
        os.kill(pid, 15)                             # as vng ends it
        assert shim.wait(timeout=30) is not None
        assert not root.exists(), "the shim's mount point is left behind"
    finally:
        if shim.poll() is None:
            shim.kill()
            shim.wait()
