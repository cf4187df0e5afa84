"""Workspaces of traces' tasks: which provider a trace gets and the message when its task
has none, the lock file's rules, how a release is told apart by what the trajectory saw, the
requirements read from an sdist without running it, and (network) a PyPI workspace locked, built
into the cache and replayed in the sandbox without network."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_agentcgroup.traces.ir import Outcome, Step, Trace, write_trace
from pytest_agentcgroup.traces.task import Task
from pytest_agentcgroup.replay.executors.sandbox import system_binds
from pytest_agentcgroup.workspaces import choose, requirements, roots, seen
from pytest_agentcgroup.engines.docker import LOCAL_IMAGE
from pytest_agentcgroup.traces.corpus import LOCK_FILE
from pytest_agentcgroup.workspaces.lock import SCHEMA, LockFile, WorkspaceError
from pytest_agentcgroup.workspaces.provide import provide

from helpers import registry_or_skip

PATH = "/workspace/acme__widget__1.0"
TASK = Task(instance_id="acme__widget-7", repository="acme/widget", version="1.0", path=PATH)


def trace(*steps, task=TASK, trace_id="t/acme__widget-7"):
    return Trace(trace_id, {"format": "test"}, tuple(steps) or (Step(0, "bash", {"command": "ls"}),), task=task)


def entry(**over):
    e = {"provider": "pypi", "project": "widget", "version": "1.0.2", "chosen_by": "given", "path": PATH,
         "env_path": "/opt/venv", "interpreter": "/usr/bin/python3", "interpreter_version": "3.11.2",
         "sdist": {"file": "widget-1.0.2.tar.gz", "sha256": "a" * 64},
         "wheels": [{"name": "pytest", "version": "8.3.3", "file": "pytest-8.3.3-py3-none-any.whl", "sha256": "b" * 64}]}
    return {**e, **over}


def write_lock(tmp_path, **over):
    (tmp_path / LOCK_FILE).write_text(json.dumps({"schema": SCHEMA, "workspaces": {"acme__widget-7": entry(**over)}}))
    return tmp_path / LOCK_FILE


def test_a_trace_without_a_task_needs_no_workspace_and_one_with_a_task_gets_one_or_a_message(tmp_path):
    assert provide(trace(task=None, trace_id="synthetic/x"), executor="sandbox", directory=None, corpus=tmp_path) is None
    with pytest.raises(WorkspaceError) as info:
        provide(trace(), executor="sandbox", directory=None, corpus=tmp_path)
    msg = str(info.value)
    assert msg.startswith("trace t/acme__widget-7 ran on task acme__widget-7 (repository acme/widget, version 1.0, "
                          f"at {PATH}), and its workspace is missing here")
    assert "--agentcgroup-workspace DIR" in msg and f"{tmp_path / LOCK_FILE}" in msg and "--agentcgroup-workspace empty" in msg
    with pytest.raises(WorkspaceError, match="the task's image in the Docker engine"):
        provide(trace(), executor="docker", directory=None, corpus=tmp_path)
    with pytest.raises(WorkspaceError, match="the task's image in the Docker engine"):    # the local image holds no task
        provide(trace(), executor="docker", directory=None, corpus=tmp_path, image=LOCAL_IMAGE)
    got = provide(trace(), executor="docker", directory=None, corpus=tmp_path, image="swerebench/x")
    assert got.seed is None and got.name == "image swerebench/x"
    assert provide(trace(), executor="sandbox", directory="empty", corpus=tmp_path).seed is None
    own = provide(trace(), executor="sandbox", directory=str(tmp_path), corpus=None)
    assert own.seed.path == PATH and own.seed.source == tmp_path and own.seed.env_path is None
    with pytest.raises(WorkspaceError, match="not a directory"):
        provide(trace(), executor="sandbox", directory=str(tmp_path / "absent"), corpus=None)
    mine = provide(trace(), executor="docker", directory=str(tmp_path), corpus=None)    # copied into the container
    assert mine.seed == own.seed


@pytest.mark.parametrize("over, field, why", [
    ({"sdist": {"file": "widget-1.0.2.tar.gz", "sha256": "xyz"}}, "sdist.sha256", "64 lowercase hex digits"),
    ({"path": "workspace/rel"}, "path", "not a clean absolute path"),
    ({"env_path": "/opt/../etc"}, "env_path", "not a clean absolute path"),
    ({"provider": "svn"}, "provider", "unknown provider 'svn'; a lock pins pypi and git workspaces"),
    ({"wheels": [{"file": "x.whl", "sha256": "b" * 64}]}, "wheels[0]", "needs its name and version"),
    ({"eol": "crlf"}, "eol", 'expected "lf" or nothing'),
    ({"version": ""}, "version", "expected a non-empty string"),
    ({"interpreter": "/tmp/python3"}, "interpreter", "is not a system python"),
    ({"interpreter": "/usr/bin/python3-evil"}, "interpreter", "is not a system python"),
    ({"system": "debian-sid"}, "system", "unknown system 'debian-sid' (known: debian-bullseye; none: the host's)"),
    ({"system": ["debian-bullseye"]}, "system", "unknown system ['debian-bullseye']"),
    ({"system": "debian-bullseye"}, "interpreter", "/usr/bin/python3 3.11.2 is not debian-bullseye's /usr/bin/python3 (3.9)"),
    ({"system": "debian-bullseye", "interpreter": "/usr/local/bin/python3.12", "interpreter_version": "3.9.2"},
     "interpreter", "is not debian-bullseye's"),
    ({"provider": "git", "repository": "ext::sh -c touch% /tmp/pwned", "commit": "c" * 40, "sdist": None},
     "repository", "is not an https, http, git or file URL, or an absolute path"),
    ({"provider": "git", "repository": "https://example.org/w.git", "commit": "c" * 39, "sdist": None},
     "commit", "40 lowercase hex digits"),
    ({"provider": "git", "repository": "https://example.org/w.git", "commit": "c" * 40}, "sdist", "a git workspace has no sdist"),
    ({"repository": "https://example.org/w.git"}, "repository", "a pypi workspace has no repository or commit"),
    ({"provider": "git", "repository": "/srv/private.git", "commit": "c" * 40, "sdist": None}, "repository",
     "/srv/private.git is a local repository outside the corpus"),
    ({"provider": "git", "repository": "https://example.org/w.git", "commit": "c" * 40, "sdist": None, "eol": "lf"},
     "eol", "a git workspace keeps its files as committed"),
])
def test_a_lock_that_is_not_one_is_named_by_file_task_and_field(tmp_path, over, field, why):
    path = write_lock(tmp_path, **over)
    with pytest.raises(WorkspaceError) as info:
        LockFile.read(path)
    assert str(info.value).startswith(f"{path}: workspaces.acme__widget-7.{field}: ") and why in str(info.value)


def test_a_lock_reads_back_as_written(tmp_path):
    lock = LockFile.read(write_lock(tmp_path, eol="lf", notes=["n"]))
    e = lock.entries["acme__widget-7"]
    assert (e.project, e.version, e.eol, e.notes, e.describe()) == ("widget", "1.0.2", "lf", ("n",), "pypi widget==1.0.2")
    lock.write()
    assert LockFile.read(tmp_path / LOCK_FILE).entries == lock.entries
    (tmp_path / LOCK_FILE).write_text("{")
    with pytest.raises(WorkspaceError, match="invalid JSON"):
        LockFile.read(tmp_path / LOCK_FILE)
    assert LockFile.read(tmp_path / "absent.json").entries == {}
    lock = LockFile.read(write_lock(tmp_path, system="debian-bullseye", interpreter_version="3.9.2"))
    e = lock.entries["acme__widget-7"]
    assert (e.system, e.describe()) == ("debian-bullseye", "pypi widget==1.0.2 on debian-bullseye's python3")
    assert e.to_json()["system"] == "debian-bullseye" and "system" not in LockFile.read(write_lock(tmp_path)).entries[
        "acme__widget-7"].to_json()


def _repository(tmp_path):
    """A real git repository of two commits: (its path, the first commit, the second)."""
    repo = tmp_path / "upstream"
    repo.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b", "GIT_COMMITTER_DATE": "2021-03-04T05:06:07Z",
           "GIT_AUTHOR_DATE": "2021-03-04T05:06:07Z"}
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout  # noqa: E731
    run("init", "-q", "-b", "main")
    (repo / "widget").mkdir()
    (repo / "widget" / "__init__.py").write_text("VALUE = 1\n")
    (repo / "setup.py").write_text("from setuptools import setup\nsetup(name='widget', install_requires=['toolz'])\n")
    run("add", "-A")
    run("commit", "-q", "-m", "one")
    first = run("rev-parse", "HEAD").strip()
    (repo / "widget" / "__init__.py").write_text("VALUE = 2\n")
    run("commit", "-q", "-am", "two")
    return repo, first, run("rev-parse", "HEAD").strip()


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("bwrap") is None, reason="git or bubblewrap not installed")
def test_a_git_workspace_is_the_repository_at_its_commit_with_its_history_and_the_steps_use_it(tree, tmp_path):
    """A local repository (a real clone of it, as of a URL), checked out at the locked commit: the
    steps import the project from it, and the agent's git commands see that commit and the edits
    the steps make; a commit the repository does not have is one message."""
    from pytest_agentcgroup.arms import Arm
    from pytest_agentcgroup.cgroups.placement import ArmPlacement
    from pytest_agentcgroup.replay import SandboxExecutor, replay
    from pytest_agentcgroup.workspaces.build import build
    from pytest_agentcgroup.workspaces.git import checkout, committed, text_files
    repo, first, second = _repository(tmp_path)
    files = tmp_path / "read"
    checkout(str(repo), first, files)
    assert text_files(files) == {"setup.py": "from setuptools import setup\nsetup(name='widget', install_requires=['toolz'])\n",
                                 "widget/__init__.py": "VALUE = 1\n"} and committed(files) == "2021-03-04T05:06:07Z"
    assert requirements.requirements(text_files(files), "widget") == ["toolz"]
    # a lock names a local repository only inside its corpus (the lock's directory holds `upstream`)
    (repo / "PKG-INFO").symlink_to("/etc/hostname")         # a link to a host file: never read
    lock = LockFile.read(write_lock(tmp_path, provider="git", repository=f"file://{repo}", commit=first, sdist=None,
                                    version=f"0+git.{first[:12]}", wheels=[]))
    entry = lock.entries["acme__widget-7"]
    assert entry.describe() == f"git file://{repo}@{first[:12]}" and "sdist" not in entry.to_json()
    elsewhere = tmp_path / "corpus"
    elsewhere.mkdir()
    with pytest.raises(WorkspaceError, match="is a local repository outside the corpus"):
        LockFile.read(write_lock(elsewhere, provider="git", repository=str(repo), commit=first, sdist=None, wheels=[]))
    (tmp_path / "cache").mkdir()
    seed = build(entry, tmp_path / "cache")
    ex = SandboxExecutor(step_timeout_s=60)
    ex.seed = seed
    ok = Outcome("ok", 0)        # recorded outcomes: the replay keeps each step's output to compare
    steps = (Step(0, "bash", {"command": f"cd {PATH} && python -c 'import widget; print(widget.VALUE)'"},
                  recorded_outcome=ok),
             Step(1, "bash", {"command": f"cd {PATH} && git rev-parse HEAD && echo 'VALUE = 3' > widget/__init__.py "
                                         f"&& git status --porcelain"}, recorded_outcome=ok))
    results = replay(Trace("t/git", {"format": "test"}, steps, task=TASK), ex,
                     ArmPlacement(Arm("unlimited"), tree.workload("git"), tree.controllers))
    assert [r.exit_code for r in results] == [0, 0], [(r.exit_code, r.output) for r in results]
    metadata = next(Path(seed.env_source).rglob("widget-*.dist-info")) / "METADATA"
    assert metadata.read_text() == f"Metadata-Version: 2.1\nName: widget\nVersion: 0+git.{first[:12]}\n"
    # the import of step 0 left its bytecode in the working copy, as it would have in the agent's
    assert results[0].output == "1\n" and results[1].output == f"{first}\n M widget/__init__.py\n?? widget/__pycache__/\n"
    with pytest.raises(WorkspaceError, match=f"the git checkout of {repo} at {'d' * 40}: the repository has no commit {'d' * 40}"):
        checkout(str(repo), "d" * 40, tmp_path / "other")


@pytest.mark.network
@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_a_git_workspace_is_locked_at_the_commit_with_its_dependencies_held_to_its_date(tmp_path, capsys):
    from pytest_agentcgroup import cli
    from packaging.version import Version
    repo, first, _ = _repository(tmp_path)
    with pytest.raises(WorkspaceError, match="names no commit .* to check .* out at; give it \\(--commit\\)"):
        choose.lock(trace(), git=str(repo))
    with registry_or_skip():
        entry = choose.lock(trace(), git=f"file://{repo}", commit=first)
    assert (entry.provider, entry.repository, entry.commit, entry.version, entry.sdist) == (
        "git", f"file://{repo}", first, f"0+git.{first[:12]}", None)
    assert entry.chosen_by == f"the git checkout of file://{repo} at {first} (given, committed 2021-03-04)"
    pins = {w["name"].lower(): Version(w["version"]) for w in entry.wheels}
    assert pins["toolz"] <= Version("0.11.1") and pins["pytest"] < Version("6.3")      # as of March 2021
    assert cli.main(["traces", "lock", str(tmp_path), "--commit", first]) == 2
    assert "--commit and --commits go with --git" in capsys.readouterr().err
    named = trace(task=Task(**{**TASK.to_json(), "commit": first}))
    with pytest.raises(WorkspaceError, match=f"names its commit {first}; --commit {'e' * 40} is another"):
        choose.lock(named, git=f"file://{repo}", commit="e" * 40)
    elsewhere = tmp_path / "corpus"
    elsewhere.mkdir()
    write_trace(named, elsewhere / "t.json")
    assert cli.main(["traces", "lock", str(elsewhere), "--git", str(repo)]) == 1
    assert "is a local repository outside the corpus" in capsys.readouterr().err


def test_a_python_version_names_the_debian_root_that_has_it_and_its_system_is_bound_as_it_is(tmp_path):
    assert roots.system_for("3.9") == "debian-bullseye"
    with pytest.raises(WorkspaceError, match=r"no system here has Python 3.8: the host's python3, or 3.9 \(debian-bullseye\)"):
        roots.system_for("3.8")
    root = tmp_path / "root"
    for d in ("usr/bin", "usr/lib", "etc", "sbin"):
        (root / d).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    (root / "lib").symlink_to("usr/lib")
    assert system_binds(root) == ["--ro-bind", f"{root}/usr", "/usr", "--ro-bind", f"{root}/etc", "/etc",
                                  "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
                                  "--ro-bind", f"{root}/sbin", "/sbin"]       # no lib64 there: none bound


def test_a_root_made_with_other_packages_is_made_again(tmp_path):
    """A root holds git (a workspace may be a git checkout whose `git diff` the steps run): one whose
    marker names other packages, made before git was one, is not taken as complete."""
    assert "git" in roots.PACKAGES
    (tmp_path / roots.MARKER).write_text("debian-bullseye")             # made with python3, python3-venv
    assert not roots._complete(tmp_path, "debian-bullseye")
    (tmp_path / roots.MARKER).write_text(f"debian-bullseye {' '.join(roots.PACKAGES)}")
    assert roots._complete(tmp_path, "debian-bullseye") and not roots._complete(tmp_path, "debian-bookworm")


@pytest.mark.network
def test_a_module_the_trajectory_ran_is_added_only_where_nothing_else_gives_it():
    """nose (on PyPI, not the project's) is added; the standard library, the project, a script the
    trajectory wrote and one the sdist has are not asked for."""
    t = trace(bash(0, "cat > repro_issue.py <<'EOF'\nprint(1)\nEOF", ""),
              bash(1, "python -m repro_issue && python -m json.tool x.json && python -m nose", "ok\n"),
              bash(2, "python -m widget.cli && python -m tools_x", "ok\n"))
    with registry_or_skip():
        got = choose._runners(t, TASK, "widget", ["numpy"], {"tools_x/__init__.py": ""})
    assert got == {"nose": 1}


def test_the_modules_a_trajectory_ran_with_python_m_and_that_succeeded_are_found():
    t = trace(bash(0, "cd /w && python -m nose numpydoc.tests", "ok\n"),
              bash(1, "python3.9 -m tox -e py", "boom\n", 1),                # failed: not evidence
              bash(2, "ls; /opt/env/bin/python -m coverage run x.py && python -m nose -v", "ok\n"),
              bash(3, "echo python -m notrun", "python -m notrun\n"))        # an argument, not a run
    assert seen.modules_run(t) == {"nose": 0, "coverage": 2}


def test_one_process_builds_a_workspace_and_another_waits_for_it_then_uses_it(tmp_path):
    """Two xdist workers replaying one corpus: the second waits on the build lock, and once the
    first has finished it takes the built workspace (it does not build it again, nor delete it)."""
    import fcntl
    import threading
    from pytest_agentcgroup.workspaces import build as b
    e = LockFile.read(write_lock(tmp_path)).entries["acme__widget-7"]
    out = b.built_dir(e, tmp_path)
    got = []
    with open(tmp_path / f".{out.name}.lock", "a") as held:        # the first worker, building
        fcntl.flock(held, fcntl.LOCK_EX)
        waiter = threading.Thread(target=lambda: got.append(b.build(e, tmp_path, index="http://127.0.0.1:9/")))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and not got                       # waiting, not building beside it
        out.mkdir()
        (out / b.MARKER).write_text(b.entry_key(e))                # the first one's build, complete
    waiter.join(10)
    assert got == [b.seed_of(e, out)]                              # used as built (a build would fail: no index)


def test_tasks_locked_to_the_same_files_share_one_build(tmp_path):
    from pytest_agentcgroup.workspaces import build as b
    from pytest_agentcgroup.workspaces.lock import parse_entry
    one = parse_entry("acme__widget-7", entry(), "lock")
    other = parse_entry("acme__widget-8", entry(chosen_by="its sdist agrees best ...", notes=["a note"]), "lock")
    assert b.built_dir(one, tmp_path) == b.built_dir(other, tmp_path)
    for change in ({"version": "1.0.3"}, {"path": "/testbed"}, {"env_path": "/opt/env"},
                   {"wheels": [{**entry()["wheels"][0], "version": "8.3.4"}]}):
        assert b.built_dir(parse_entry("acme__widget-7", entry(**change), "lock"), tmp_path) != b.built_dir(one, tmp_path)


def view(i, path, first_line, lines):
    head = f"Here's the result of running `cat -n` on {path}:\n" + "".join(
        f"{n:6}\t{text}\n" for n, text in enumerate(lines, first_line)) + "    99\tcut"
    return Step(i, "read", {"op": "view", "path": path}, recorded_outcome=Outcome("ok"), recorded_output=head)


def test_a_release_is_told_apart_by_the_edits_that_apply_and_the_lines_the_trajectory_saw():
    f = f"{PATH}/widget/core.py"
    steps = (view(0, f, 2, ["def f():", "    return 1"]),
             Step(1, "edit", {"op": "str_replace", "path": f, "old_str": "    return 1", "new_str": "    return 2"},
                  recorded_outcome=Outcome("ok")),
             Step(2, "edit", {"op": "create", "path": f"{PATH}/new.py", "file_text": "x = 1\n"}, recorded_outcome=Outcome("ok")),
             Step(3, "edit", {"op": "insert", "path": f"{PATH}/new.py", "insert_line": 1, "new_str": "y"}, recorded_outcome=Outcome("ok")),
             view(4, f, 3, ["    return 2"]))
    t = trace(*steps)
    old = {"widget/core.py": "# widget\ndef f():\n    return 1\n"}
    new = {"widget/core.py": "# widget\ndef f():\n    return one\n"}
    # old: the edit applies, both views agree (2 lines, then the edited line), the old_str's line is there
    assert seen.edit_score(t, TASK, old) == (1, 1, 4)
    assert seen.edit_score(t, TASK, new) == (0, 1, 1)          # only `def f():` agrees
    assert seen.edit_score(t, TASK, {}) == (0, 1, 0)
    # what the trajectory saw that the sdist lacks (the agent's own new.py is no loss)
    assert seen.absent(t, TASK, old) == [] and seen.absent(t, TASK, {}) == ["widget/core.py"]
    assert seen.named_version(trace(Step(0, "bash", {"command": "pip show widget"},
                                           recorded_outcome=Outcome("ok", 0),
                                           recorded_output="Name: widget\nVersion: 1.0.2\n")),
                                "widget", ["1.0.1", "1.0.2"]) == ("1.0.2", 0)
    assert seen.named_version(t, "widget", ["1.0.1"]) is None
    assert choose.in_series("0.0.11", "0.0") and choose.in_series("0.0", "0.0") and not choose.in_series("0.01", "0.0")


def bash(i, command, output, exit_code=0):
    return Step(i, "bash", {"command": command, "cwd": PATH},
                recorded_outcome=Outcome("ok" if exit_code == 0 else "failed", exit_code), recorded_output=output)


def test_a_shells_read_only_views_place_lines_in_files_and_anything_else_is_no_view():
    core = "widget/core.py"
    cases = {
        "cat widget/core.py": ("# widget\ndef f():\n    retu", {1: "# widget", 2: "def f():"}),   # the cut line is left out
        "nl -ba widget/core.py | sed -n '2,3p'": ("     2\tdef f():\n     3\t    return 1\n", {2: "def f():", 3: "    return 1"}),
        "cat -n widget/core.py | grep return | head -n 5": ("     3\t    return 1\n", {3: "    return 1"}),
        "sed -n '2,3p' widget/core.py": ("def f():\n    return 1\n", {2: "def f():", 3: "    return 1"}),
        "grep -n -A 1 'def f' widget/core.py": ("2:def f():\n3-    return 1\n", {2: "def f():", 3: "    return 1"}),
        f"cd {PATH}/widget && head -n 1 core.py": ("# widget\n", {1: "# widget"}),
        "cat widget/core.py | sed -n '3p'": ("    return 1\n", {3: "    return 1"}),
        "head -2 widget/core.py": ("# widget\ndef f():\n", {1: "# widget", 2: "def f():"}),
        "cat widget/core.py | head -1": ("# widget\n", {1: "# widget"}),
        "nl -ba widget/core.py | grep -v '#' | tail -n +2": ("     3\t    return 1\n", {3: "    return 1"}),
    }
    for command, (output, rows) in cases.items():
        assert seen.bash_view(bash(0, command, output), PATH + "/") == (core, rows), command
    for command in ("cat widget/core.py > copy.py", "cat widget/core.py; rm x", "cat $F", "cat widget/*.py",
                    "grep -rn f widget", "cat widget/core.py other.py", "grep -c f widget/core.py",
                    "cat /etc/passwd", "cat ../outside.py", "cat widget/core.py | sort", "python widget/core.py",
                    "cat widget/core.py\nrm x", "sed -i 's/1/2/' widget/core.py", "tail -n 3 widget/core.py",
                    "head -n 5", "head -n 5 widget/core.py other.py", "sed -n '2,3p' widget/core.py | head -n 1",
                    # filters that change the rows or read a file of their own
                    "cat -n widget/core.py | sed 's/1/2/'", "cat -n widget/core.py | sed -n '2,3p' other.py",
                    "cat -n widget/core.py | tail -c 5", "cat -n widget/core.py | grep -o f",
                    "cat -n widget/core.py | head -n 3 other.py", "grep -n f widget/core.py -e",
                    # paths the shell would not take as they are
                    "cat widget/{core,other}.py", "cd - && cat core.py", "cd wid* && cat core.py", "cat ~/core.py"):
        assert seen.bash_view(bash(0, command, "def f():\n"), PATH + "/") is None, command
    assert seen.bash_view(bash(0, "cat widget/core.py", "cat: widget/core.py: No such file\n", 1), PATH + "/") is None
    assert seen.bash_view(bash(0, "cat widget/a#b.py", "x\n"), PATH + "/") == ("widget/a#b.py", {1: "x"})   # no comment
    # the views decide between two releases, as the editor's do; a file the agent wrote itself is no evidence
    t = trace(bash(0, "sed -n '2,3p' widget/core.py", "def f():\n    return 1\n"),
              Step(1, "edit", {"op": "create", "path": f"{PATH}/new.py", "file_text": "x = 1\n"}, recorded_outcome=Outcome("ok")),
              bash(2, "cat new.py", "x = 1\n"))
    old = {core: "# widget\ndef f():\n    return 1\n", "new.py": "y = 2\n"}
    assert seen.edit_score(t, TASK, old) == (0, 0, 2)
    assert seen.edit_score(t, TASK, {core: "# widget\ndef f():\n    return one\n"}) == (0, 0, 1)
    assert seen.paths_seen(t, TASK) == {core, "new.py"}


def test_a_trajectory_whose_environment_had_no_pytest_gets_none():
    assert seen.pytest_lacked(trace(bash(0, "ls", "a\n"), bash(1, "pytest x", "bash: line 1: pytest: command not found\n", 127))) == 1
    assert seen.pytest_lacked(trace(bash(0, "python -m pytest", "/usr/bin/python: No module named pytest\n", 1))) == 0
    assert seen.pytest_lacked(trace(bash(0, "pytest", "==== test session starts ====\n"))) is None


def test_requirements_are_read_from_an_sdist_without_running_it():
    setup_py = '''
from setuptools import setup
DEPS = ["numpy", "xarray<=2022.03."]
setup(name="widget", install_requires=DEPS + read_requirements(),
      tests_require=["pytest-cov"], extras_require={"test": ["hypothesis"], "docs": ["sphinx"]})
'''
    # DEPS + read_requirements() is no literal: what cannot be read without running setup.py is left out
    assert requirements.requirements({"setup.py": setup_py}, "widget") == ["pytest-cov", "hypothesis"]
    setup_py = setup_py.replace("DEPS + read_requirements()", "DEPS")
    assert requirements.requirements({"setup.py": setup_py}, "widget") == ["numpy", "xarray<=2022.03", "pytest-cov", "hypothesis"]
    # strings and lists built from literals, as sympy's 'mpmath>=%s' % min_mpmath_version
    built = ('V = "0.19"\nBASE = ["toolz"]\nsetup(install_requires=BASE + ["mpmath>=%s" % V, f"attrs>={V}", "a" + "b",'
             ' "c>=%s" % (V,), "d>=%s,<%s" % (V, "2")], extras_require={"test": ["e>=%s" % V], "docs": "f"})\n')
    assert requirements.requirements({"setup.py": built}, "widget") == [
        "toolz", "mpmath>=0.19", "attrs>=0.19", "ab", "c>=0.19", "d<2,>=0.19", "e>=0.19"]
    # what only running it would tell, a format that does not fit, a string no requirement would be
    for bad in ('"m>=%s" % get_version()', '"%(v)s" % {"w": 1}', '"%0100000000d" % 1', '"%s" % unknown',
                '"%s" % ["a"]', '"a" + 1'):
        assert requirements.requirements({"setup.py": f"setup(install_requires=[{bad}], tests_require=['ok'])"}, "widget") == ["ok"], bad
    cfg = "[options]\ninstall_requires =\n    toolz>=0.10\n[options.extras_require]\ntesting = pytest-mock\n"
    pyproject = '[project]\ndependencies = ["dask"]\n[project.optional-dependencies]\ntests = ["widget[extra]", "attrs"]\n'
    pkg = 'Metadata-Version: 2.1\nRequires-Dist: tqdm\nRequires-Dist: furo; extra == "docs"\nRequires-Dist: mock; extra == "test"\n'
    assert requirements.requirements({"setup.cfg": cfg, "pyproject.toml": pyproject, "PKG-INFO": pkg}, "widget") == [
        "tqdm", "mock", "toolz>=0.10", "pytest-mock", "dask", "attrs"]


@pytest.mark.network
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
@pytest.mark.parametrize("python", [None, pytest.param("3.9", marks=pytest.mark.slow)])
def test_a_pypi_workspace_is_locked_built_and_replayed_without_network(tree, tmp_path, python):
    """more-itertools 10.5.0's sdist (it carries its tests) at the path an OpenHands run would use,
    its environment at the agent's interpreter's path: the project imports from the workspace, the
    environment's pytest runs its tests, and `pip show` names the locked release, in the sandbox.
    With python 3.9 the environment is made of a Debian bullseye root's python3, and the steps see
    that root's system (its python3, its /etc), as the sandbox's unprivileged user."""
    from pytest_agentcgroup.arms import Arm
    from pytest_agentcgroup.cgroups.placement import ArmPlacement
    from pytest_agentcgroup.replay import SandboxExecutor, replay
    from pytest_agentcgroup.workspaces.build import build, is_built
    path = "/workspace/more-itertools__more-itertools__10.5"
    task = Task(instance_id="more-itertools__more-itertools-1", repository="more-itertools/more-itertools",
                version="10.5", path=path, python="/opt/conda/envs/testbed/bin/python")
    ok = Outcome("ok", 0)        # recorded outcomes: the replay keeps each step's output to compare
    steps = (Step(0, "bash", {"command": f"cd {path} && python -c 'import more_itertools as m; print(m.__file__)'"},
                  recorded_outcome=ok),
             Step(1, "bash", {"command": "python -m pytest -q -x tests/test_recipes.py 2>&1 | tail -1"},
                  recorded_outcome=ok),
             Step(2, "bash", {"command": "pip show more-itertools > /tmp/show && sed -n 2p /tmp/show"},
                  recorded_outcome=ok),
             Step(3, "bash", {"command": "command -v pytest && pytest --version"}, recorded_outcome=ok),
             Step(4, "bash", {"command": "for p in python /usr/bin/python3; do $p -c 'import sys; print(sys.version_info[:2])'; "
                                         "done; cut -d. -f1 /etc/debian_version"}, recorded_outcome=ok))
    t = Trace("t/more-itertools", {"format": "test"}, steps, task=task)
    with registry_or_skip():
        locked = choose.lock(t, version="10.5.0", python=python)
        seed = build(locked, tmp_path)
    assert (locked.project, locked.version, locked.env_path) == ("more-itertools", "10.5.0", "/opt/conda/envs/testbed")
    assert any(w["name"].lower() == "pytest" for w in locked.wheels) and len(locked.sdist["sha256"]) == 64
    assert is_built(locked, tmp_path) and build(locked, tmp_path) == seed      # the second time: the cache
    ex = SandboxExecutor(step_timeout_s=120)
    ex.seed = seed
    results = replay(t, ex, ArmPlacement(Arm("unlimited"), tree.workload("pypi"), tree.controllers))
    assert [r.exit_code for r in results] == [0, 0, 0, 0, 0], [(r.exit_code, r.output) for r in results]
    assert results[0].output.strip() == f"{path}/more_itertools/__init__.py"
    assert " passed" in results[1].output
    assert results[2].output.strip() == "Version: 10.5.0"
    assert results[3].output.startswith("/opt/conda/envs/testbed/bin/pytest\npytest ")
    host = tuple(map(int, subprocess.run(["/usr/bin/python3", "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
                                         capture_output=True, text=True).stdout.split()))
    debian = open("/etc/debian_version").read().split(".")[0] if python is None else "11"
    want = (3, 9) if python == "3.9" else host
    assert results[4].output == f"{want}\n{want}\n{debian}\n", results[4].output
    assert (locked.system, locked.interpreter_version.rsplit(".", 1)[0]) == (
        ("debian-bullseye", "3.9") if python else (None, "%d.%d" % host))


def test_an_sdist_with_a_hard_link_unpacks_and_one_pointing_out_is_one_message(tmp_path):
    import io
    import tarfile
    from pytest_agentcgroup.workspaces.pypi import unpack_sdist

    def sdist(link_to: str) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            data = b"hello\n"
            info = tarfile.TarInfo("p-1.0/a.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            link = tarfile.TarInfo("p-1.0/b.txt")
            link.type, link.linkname = tarfile.LNKTYPE, link_to
            tar.addfile(link)
        return buf.getvalue()
    dest = unpack_sdist(sdist("p-1.0/a.txt"), "p-1.0.tar.gz", tmp_path / "ok")
    assert (dest / "a.txt").read_text() == (dest / "b.txt").read_text() == "hello\n"
    with pytest.raises(WorkspaceError, match="p-1.0.tar.gz: cannot unpack"):
        unpack_sdist(sdist("/etc/passwd"), "p-1.0.tar.gz", tmp_path / "out")


def test_a_downloaded_sdist_is_kept_under_its_sha256_and_checked_again_when_read(tmp_path, monkeypatch):
    import hashlib
    from pytest_agentcgroup.workspaces import pypi
    data = b"the sdist"
    sha = hashlib.sha256(data).hexdigest()
    fetched = []
    monkeypatch.setattr(pypi, "_download", lambda *args: fetched.append(args) or data)
    cache = tmp_path / "sdists"
    assert pypi.download_sdist("p", "p-1.tar.gz", sha, cache=cache) == data and len(fetched) == 1
    assert (cache / f"{sha}-p-1.tar.gz").read_bytes() == data
    assert pypi.download_sdist("p", "p-1.tar.gz", sha, cache=cache) == data and len(fetched) == 1     # kept
    (cache / f"{sha}-p-1.tar.gz").write_bytes(b"changed since")
    assert pypi.download_sdist("p", "p-1.tar.gz", sha, cache=cache) == data and len(fetched) == 2     # checked
    (tmp_path / "a-file").write_text("")
    assert pypi.download_sdist("p", "p-1.tar.gz", sha, cache=tmp_path / "a-file" / "sdists") == data  # no cache: no error
    assert not list(tmp_path.rglob("*.part"))


UNREACHABLE = "http://127.0.0.1:9"        # loopback, the discard port: nothing listens, the connection is refused


def _as_the_network_tests_see_it(call):
    """What registry_or_skip (the network tests' guard) makes of `call`: ("skipped", why) or
    ("raised", the WorkspaceError)."""
    try:
        with registry_or_skip():
            call()
    except pytest.skip.Exception as exc:
        return "skipped", exc.msg
    except WorkspaceError as exc:
        return "raised", exc
    pytest.fail("the call raised nothing")


def test_a_workspace_error_of_its_own_fails_the_test_and_is_never_taken_for_the_network(tmp_path):
    """A loopback index that answers: the cached sdist (present, its bytes changed) and the index's
    own file are not the pinned ones, and pip finds no such project there. Each is a WorkspaceError
    that fails the test with its message; none is a skip."""
    import functools
    import hashlib
    import http.server
    import sys
    import threading
    from pytest_agentcgroup.workspaces import pypi
    pin = hashlib.sha256(b"the pinned sdist").hexdigest()
    (tmp_path / "index" / "simple" / "p").mkdir(parents=True)
    (tmp_path / "index" / "simple" / "p" / "index.html").write_text('<a href="p-1.tar.gz">p-1.tar.gz</a>')
    (tmp_path / "index" / "simple" / "p" / "p-1.tar.gz").write_bytes(b"another file")
    cache = tmp_path / "sdists"
    cache.mkdir()
    (cache / f"{pin}-p-1.tar.gz").write_bytes(b"changed since")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(tmp_path / "index")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_address[1]}/simple"
    try:
        kind, exc = _as_the_network_tests_see_it(lambda: pypi.download_sdist("p", "p-1.tar.gz", pin, index=index, cache=cache))
        assert (kind, type(exc)) == ("raised", WorkspaceError), exc
        assert str(exc).endswith(f"p-1.tar.gz: sha256 {hashlib.sha256(b'another file').hexdigest()}, "
                                 f"not the pinned {pin}; not used")
        kind, exc = _as_the_network_tests_see_it(lambda: pypi.pip(
            sys.executable, ["download", "--no-deps", "--retries", "1", "--index-url", index, "-d", str(tmp_path / "dl"),
                             "nose"], what="fetching nose"))
        assert (kind, type(exc)) == ("raised", WorkspaceError), exc
        assert "fetching nose: pip failed" in str(exc) and "No matching distribution found for nose" in str(exc)
    finally:
        server.shutdown()
        server.server_close()


def test_an_index_or_repository_that_cannot_be_reached_is_the_network_and_skips_naming_it(tmp_path):
    """Nothing listens on the loopback address: the index's page, its JSON API, pip and a git clone
    each fail as RegistryUnreachable naming the address, which the network tests skip on."""
    import sys
    from pytest_agentcgroup.workspaces import pypi
    from pytest_agentcgroup.workspaces.git import checkout
    from pytest_agentcgroup.workspaces.lock import RegistryUnreachable
    (tmp_path / "sdists").mkdir()
    (tmp_path / "sdists" / f"{'a' * 64}-p-1.tar.gz").write_bytes(b"not the pinned one: it is downloaded again")
    kind, why = _as_the_network_tests_see_it(
        lambda: pypi.download_sdist("p", "p-1.tar.gz", "a" * 64, index=f"{UNREACHABLE}/simple", cache=tmp_path / "sdists"))
    assert kind == "skipped" and why.startswith(f"{UNREACHABLE}/simple unreachable: cannot download p-1.tar.gz "
                                                f"from {UNREACHABLE}/simple/p/ ("), why
    with pytest.raises(RegistryUnreachable, match="locking a workspace needs PyPI") as info:
        pypi.releases("p", index=f"{UNREACHABLE}/pypi")
    assert info.value.registry == f"{UNREACHABLE}/pypi"
    with pytest.raises(RegistryUnreachable, match="(?s)fetching nose: pip failed .*Connection refused") as info:
        pypi.pip(sys.executable, ["download", "--no-deps", "--retries", "1", "--index-url", f"{UNREACHABLE}/simple",
                                  "-d", str(tmp_path / "dl"), "nose"], what="fetching nose")
    assert info.value.registry == f"{UNREACHABLE}/simple"
    if shutil.which("git"):
        with pytest.raises(RegistryUnreachable, match="git (clone|fetch) failed") as info:
            checkout(f"{UNREACHABLE}/x.git", "d" * 40, tmp_path / "x")
        assert info.value.registry == f"{UNREACHABLE}/x.git/"


def test_only_the_files_asked_for_are_read_from_an_sdist():
    import io
    import tarfile
    from pytest_agentcgroup.workspaces.pypi import sdist_files
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in (("w-1/setup.py", b"setup()"), ("w-1/w/core.py", b"x = 1"), ("w-1/w/bin.dat", b"\xff\xfe")):
            info = tarfile.TarInfo(name)
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
    assert sdist_files(buf.getvalue(), "w-1.tar.gz") == {"setup.py": "setup()", "w/core.py": "x = 1"}
    assert sdist_files(buf.getvalue(), "w-1.tar.gz", only={"w/core.py", "absent.py"}) == {"w/core.py": "x = 1"}


def test_of_releases_that_agree_as_well_the_oldest_final_one_is_chosen(monkeypatch):
    files = {"w/core.py": "def f():\n    return 1\n"}
    rels = {v: [{"filename": f"widget-{v}.tar.gz", "packagetype": "sdist", "digests": {"sha256": "0" * 64},
                 "upload_time_iso_8601": when}]
            for v, when in (("0.9", "2020-01-01"), ("1.0rc1", "2020-02-01"), ("1.0", "2020-03-01"), ("1.1", "2020-04-01"))}
    monkeypatch.setattr(choose, "sdist_cache", lambda: None)
    monkeypatch.setattr(choose, "download_sdist", lambda project, filename, sha, cache: filename)
    monkeypatch.setattr(choose, "sdist_files", lambda name, filename, only: {} if "0.9" in name else files)
    t = trace(bash(0, "sed -n '1,2p' w/core.py", "def f():\n    return 1\n"), task=Task(instance_id="acme__widget-7", path=PATH))
    version, how = choose.choose_release(t, t.task, "widget", rels)
    assert version == "1.0" and "2 lines it saw are there" in how and "of 3 that tie, the oldest (final releases first)" in how


def _commits(tmp_path, n):
    """A real git repository of `n` commits, each changing widget/__init__.py: (its path, the commits)."""
    repo = tmp_path / "public"
    repo.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@b"}
    run = lambda *a: subprocess.run(["git", *a], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout  # noqa: E731
    run("init", "-q", "-b", "main")
    (repo / "widget").mkdir()
    commits = []
    for i in range(n):
        (repo / "widget" / "__init__.py").write_text(f"VALUE = {i}\n")
        run("add", "-A")
        run("commit", "-q", "-m", f"change {i}")
        commits.append(run("rev-parse", "HEAD").strip())
    return repo, commits


def _blob(repo, commit, path):
    return subprocess.run(["git", "-C", str(repo), "rev-parse", f"{commit}:{path}"], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_the_store_rebuild_command_keeps_only_the_commits_the_lock_names(tmp_path, capsys):
    """`agentcgroup tools source-store` makes the corpus's store from a repository and the lock: one
    tag per task at its commit, that commit's tree, nothing of the commit between them nor of their
    history; a workspace checked out from it is that commit with its .git."""
    from pytest_agentcgroup import cli
    from pytest_agentcgroup.workspaces.git import checkout, has_commit, store_tags
    repo, (first, between, last) = _commits(tmp_path, 3)
    corpus = tmp_path / "corpus"
    (corpus / "sources").mkdir(parents=True)
    base = entry(provider="git", repository="sources/widget.git", sdist=None, wheels=[])
    (corpus / LOCK_FILE).write_text(json.dumps({"schema": SCHEMA, "workspaces": {
        "acme__widget-7": {**base, "commit": first, "version": f"0+git.{first[:12]}"},
        "acme__widget-9": {**base, "commit": last, "version": f"0+git.{last[:12]}"}}}))
    assert cli.main(["tools", "source-store", str(corpus / LOCK_FILE), "--from", str(repo)]) == 0
    store = corpus / "sources" / "widget.git"
    assert f"{store}: 2 task(s), 2 commit(s)" in capsys.readouterr().out
    assert store_tags(store) == {"acme__widget-7": first, "acme__widget-9": last}
    assert has_commit(store, first) and has_commit(store, last) and not has_commit(store, between)
    held = subprocess.run(["git", f"--git-dir={store}", "cat-file", "--batch-all-objects", "--batch-check=%(objectname)"],
                          check=True, capture_output=True, text=True).stdout.split()
    assert _blob(repo, between, "widget/__init__.py") not in held and _blob(repo, last, "widget/__init__.py") in held
    assert sorted(p.name for p in store.iterdir()) == ["HEAD", "config", "objects", "packed-refs", "refs", "shallow"]
    assert len(list((store / "objects" / "pack").glob("*.pack"))) == 1
    # the lock reads the store back, and a workspace is its commit with its .git, history-less
    e = LockFile.read(corpus / LOCK_FILE).entries["acme__widget-9"]
    assert e.local_path == str(store.resolve()) and e.describe() == f"git sources/widget.git@{last[:12]}"
    checkout(e.local_path, last, tmp_path / "work")
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path / "work"), *a], check=True, capture_output=True,  # noqa: E731
                                    text=True).stdout
    assert (tmp_path / "work" / "widget" / "__init__.py").read_text() == "VALUE = 2\n"
    assert git("status", "--porcelain") == "" and git("log", "--format=%H").split() == [last] and git("tag") == ""
    # a repository without a locked commit: one message, and the old store kept
    assert cli.main(["tools", "source-store", str(corpus / LOCK_FILE), "--from", str(tmp_path / "work")]) == 1
    assert "acme__widget-7" in capsys.readouterr().err and store_tags(store) == {"acme__widget-7": first,
                                                                                "acme__widget-9": last}


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_a_lock_entry_outside_the_corpus_or_at_a_commit_the_store_lacks_is_one_clear_error(tmp_path):
    from pytest_agentcgroup.workspaces.git import build_store
    repo, (first, second) = _commits(tmp_path, 2)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    build_store(str(repo), {"acme__widget-7": first}, corpus / "widget.git")
    (tmp_path / "outside.git").mkdir()
    (corpus / "link.git").symlink_to(tmp_path / "outside.git")
    for named, why in [("../outside.git", "../outside.git leads outside the corpus"),
                       ("link.git", "link.git leads outside the corpus"),
                       ("sources/../../outside.git", "is not an https, http, git or file URL, or an absolute path, "
                                                     "or a clean path relative to the lock"),
                       ("-u.git", "or a clean path relative to the lock")]:
        path = write_lock(corpus, provider="git", repository=named, commit=first, sdist=None, wheels=[])
        with pytest.raises(WorkspaceError) as info:
            LockFile.read(path)
        assert str(info.value).startswith(f"{path}: workspaces.acme__widget-7.repository: ") and why in str(info.value)
    # a commit the store lacks: the replay's message names the trace, the task, the lock and the commit
    (tmp_path / "cache").mkdir()
    write_lock(corpus, provider="git", repository="widget.git", commit=second, sdist=None, wheels=[])
    with pytest.raises(WorkspaceError) as info:
        provide(trace(), executor="sandbox", directory=None, corpus=corpus)
    assert str(info.value) == (f"trace t/acme__widget-7: the workspace of task acme__widget-7 locked in {corpus / LOCK_FILE} "
                               f"cannot be built: the git checkout of {(corpus / 'widget.git').resolve()} at {second}: "
                               f"the repository has no commit {second}")


def test_the_shipped_store_holds_exactly_the_locks_commits_and_the_blobs_their_trajectories_recorded():
    """traces/sources/sympy.git: one tag per git entry of the shipped lock at its commit and no other,
    each commit's tree holds every blob its trajectory's git diff names, within its size budget."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    from pytest_agentcgroup.traces.ir import read_traces
    from pytest_agentcgroup.tools.source_store import stores_of
    from pytest_agentcgroup.workspaces.git import blob_ids, store_tags
    traces_dir = Path(__file__).resolve().parent.parent / "traces"
    lock = LockFile.read(traces_dir / LOCK_FILE)
    stores = stores_of(lock)
    assert set(stores) == {(traces_dir / "sources" / "sympy.git").resolve()}
    for store, tags in stores.items():
        assert store_tags(store) == tags and len(tags) == 26
        assert sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) <= 40 * 2**20
        for key, commit in tags.items():
            assert lock.entries[key].commit_from and lock.entries[key].system == "debian-bullseye"
            recorded = seen.recorded_blobs(next(read_traces(traces_dir / "mini-swe-agent" / f"{key}.json")))
            assert recorded, key
            have = blob_ids(store, commit, sorted(recorded))
            assert all((have[p] or "").startswith(b) for p, b in recorded.items()), (key, recorded, have)
