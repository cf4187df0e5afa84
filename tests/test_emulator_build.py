"""The emulator's binary: replay/emulator.c compiled with the host's real `cc` on first use into a
cache keyed by the source's hash, atomically (two processes building at once both get a working
binary and leave no temporary behind), in a directory only this user may write; without a compiler
one ExecutorUnavailable naming it; the binary refuses bad arguments naming them."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from pytest_agentcgroup.errors import ExecutorUnavailable
from pytest_agentcgroup.replay import emulator_build
from pytest_agentcgroup.replay.executors import EmulateExecutor


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty cache ($XDG_CACHE_HOME in tmp_path) and no binary remembered by this process."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on PATH: apt-get install gcc")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    emulator_build.emulator_binary.cache_clear()
    yield tmp_path / "xdg" / "agentcgroup"
    emulator_build.emulator_binary.cache_clear()


def test_built_once_into_the_cache_named_by_the_source_hash(fresh):
    path = emulator_build.emulator_binary()
    assert os.path.dirname(path) == str(fresh) and os.path.basename(path).startswith("emulator-")
    mtime = os.stat(path).st_mtime_ns
    emulator_build.emulator_binary.cache_clear()
    assert emulator_build.emulator_binary() == path and os.stat(path).st_mtime_ns == mtime, "rebuilt"
    assert oct(os.stat(fresh).st_mode & 0o777) == "0o700"
    assert subprocess.run([path, "0", "0", "0", "0", "5", str(fresh)]).returncode == 0


def test_clean_emulator_removes_the_build_and_the_next_use_compiles_again(fresh, monkeypatch):
    """`make clean-emulator` (.ci/run): the cached binary goes, so CI compiles it as a fresh machine does."""
    monkeypatch.setattr(emulator_build, "cache_dirs", lambda: [fresh])   # never the caches other runs use
    path = emulator_build.emulator_binary()
    kept = [fresh / "notes.txt", fresh / "emulator-of-another-user"]     # only our own emulator-* go
    if os.geteuid() != 0:
        kept.pop()                        # without root no file of another user can be made here
    for f in kept:
        f.write_text("x")
    if os.geteuid() == 0:
        os.chown(kept[1], 65534, 65534)
    assert emulator_build.remove_built() == [fresh / os.path.basename(path)]
    assert not os.path.exists(path) and all(f.exists() for f in kept)
    assert emulator_build.emulator_binary() == path and os.path.exists(path), "not compiled again"


def test_agentcgroup_emulator_clean_names_what_it_removed(fresh, monkeypatch, capsys):
    from pytest_agentcgroup.cli import main
    monkeypatch.setattr(emulator_build, "cache_dirs", lambda: [fresh])   # never the caches other runs use
    path = emulator_build.emulator_binary()
    assert main(["emulator", "clean"]) == 0
    assert capsys.readouterr().out == f"removed {path}\n" and not os.path.exists(path)
    assert main(["emulator", "clean"]) == 0 and capsys.readouterr().out == "", "silent when there is none"


def test_two_processes_building_at_once_both_get_it(fresh):
    code = "from pytest_agentcgroup.replay import emulator_build as b; print(b.emulator_binary())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    paths = {p.communicate()[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs) and len(paths) == 1, paths
    assert os.listdir(fresh) == [os.path.basename(paths.pop())], "a temporary was left behind"


def test_a_cache_others_may_write_is_not_used(fresh, monkeypatch, tmp_path):
    fresh.mkdir(parents=True)
    fresh.chmod(0o777)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = emulator_build.emulator_binary()
    assert path.startswith(str(tmp_path / "home" / ".cache" / "agentcgroup")), path
    assert os.listdir(fresh) == []


@pytest.mark.root                  # chowns a directory to another user
def test_a_cache_under_a_directory_another_user_owns_is_not_used(fresh, monkeypatch, tmp_path):
    # as root with XDG_CACHE_HOME in another user's directory, that user could rename the cache away
    # and plant emulator-<hash> (a predictable name) for root to exec: the whole path is checked
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    os.chown(other, 65534, 65534)
    monkeypatch.setenv("XDG_CACHE_HOME", str(other / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = emulator_build.emulator_binary()
    assert path.startswith(str(tmp_path / "home" / ".cache" / "agentcgroup")), path
    assert os.listdir(other) == [], "a directory was made under another user's"
    emulator_build.emulator_binary.cache_clear()
    monkeypatch.setenv("HOME", str(other))
    assert not emulator_build.emulator_binary().startswith(str(other))


def test_an_empty_cached_binary_is_rebuilt(fresh):
    path = emulator_build.emulator_binary()
    open(path, "w").close()         # as a crash between create and write would leave it
    emulator_build.emulator_binary.cache_clear()
    assert emulator_build.emulator_binary() == path and os.path.getsize(path) > 0
    assert subprocess.run([path, "0", "0", "0", "0", "5", str(fresh)]).returncode == 0


@pytest.mark.root
def test_a_read_only_cache_is_passed_over(fresh, monkeypatch, tmp_path):
    fresh.mkdir(parents=True, mode=0o700)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,mode=0700", "none", str(fresh)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (needs root): no read-only directory to try")
    try:
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        path = emulator_build.emulator_binary()
    finally:
        subprocess.run(["umount", str(fresh)], check=True)
    assert path.startswith(str(tmp_path / "home" / ".cache" / "agentcgroup")), path


def test_without_a_compiler_the_executor_says_which(fresh, monkeypatch, tmp_path):
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ExecutorUnavailable) as got:
        EmulateExecutor().start(None)
    assert str(got.value) == ("the emulate executor needs a C compiler, cc (Debian package gcc; `make setup` "
                              "installs it), which is not installed")


@pytest.mark.parametrize("argv, says", [
    (["1", "x", "0", "0", "10"], "RAMP_MS must be a number >= 0, got 'x'"),
    (["1", "0", "0", "0", "10", "--curve=/nonexistent/c.txt"], "cannot read the curve /nonexistent/c.txt"),
    (["1", "0"], "usage:"),
    # sizes past any machine's (a cast of 1e30 to long is LONG_MIN: it allocated until SIGKILL)
    (["1e30", "0", "0", "0", "10"], "PEAK_BYTES must be at most"),
    (["0", "0", "0", "1e30", "10"], "IO_BYTES must be at most"),
    (["0", "0", "0", "0", "inf"], "DURATION_MS must be a number >= 0, got 'inf'"),
    (["0", "0", "0", "0", "10", "--x"], "'--x' is an unknown option"),
    (["0", "0", "0", "0", "10", "log", "extra"], "'extra' is an extra argument"),
    (["0", "0", "0", "0", "10", "--curve=C", "--curve=C"], "'--curve=C' is a second --curve"),
    # curve lines: a value past 2^46 bytes (its `want` went negative: SIGSEGV), inf, three fields on
    # one line (fscanf read across line breaks), garbage
    (["0", "0", "0", "0", "10", "--curve=C:0 8\n5 1e15\n"], "line 2 is out of range"),
    (["0", "0", "0", "0", "10", "--curve=C:0 inf\n"], "line 1 is out of range"),
    (["0", "0", "0", "0", "10", "--curve=C:0 8 100\n5 10\n"], "line 1 is not `T_MS MB`"),
    (["0", "0", "0", "0", "10", "--curve=C:0 8\n\n5 x\n"], "line 3 is not `T_MS MB`"),
])
def test_the_emulator_refuses_bad_arguments_naming_them(fresh, tmp_path, argv, says):
    argv = list(argv)
    for i, a in enumerate(argv):        # --curve=C[:TEXT]: a curve file in tmp_path (with TEXT)
        if a.startswith("--curve=C"):
            (tmp_path / "c.txt").write_text(a.partition(":")[2])
            argv[i] = f"--curve={tmp_path / 'c.txt'}"
    if len(argv) > 2:
        argv = [*argv[:5], str(tmp_path), *argv[5:]]
    says = says.replace("'--curve=C'", f"'--curve={tmp_path / 'c.txt'}'")
    r = subprocess.run([emulator_build.emulator_binary(), *argv], capture_output=True, text=True)
    assert r.returncode == 2 and says in r.stderr, r.stderr
