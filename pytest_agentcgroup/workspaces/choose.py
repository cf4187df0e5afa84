"""Locking a task's PyPI workspace: which release of the project, and which wheels beside it.

The release (`chosen_by` in the lock says which rule decided, with its figures):
1. one the trajectory's own outputs name (`pip show` / `pip list` / a `<project>-X.Y.Z` path or a
   `<project> X.Y.Z` banner) among the releases of the task's version series;
2. else the one whose sdist agrees best with what the trajectory saw of its files: first the most
   edits that apply (a `str_replace` applies when its `old_str` occurs exactly once, an `insert`
   when its line exists; edits are replayed in order in memory, files the agent created included),
   then the most lines the editor or the shell showed (seen.py) or an edit expected (`old_str`
   lines) that the file has, at that number for a view; the oldest of those that tie, final
   releases before pre-releases (the first release with all the trajectory saw: later ones only add
   what it did not, the task's fix perhaps), when anything agrees at all. Without a series, the
   MAX_CANDIDATES newest releases are compared;
3. else the newest release of the series with an sdist.
Files are compared with LF line ends; where the chosen sdist has CRLF in a file the trajectory
edited or viewed (its editor saw LF: a git checkout), the lock says `eol: "lf"` and the build
converts the sdist's text files to LF.
The series is the task's version label: `0.0` takes 0.0 and 0.0.x, never 0.0x.

The environment: the sdist's own requirements (requirements.py), pytest (the version the
trajectory's pytest banner shows, when it installs here; none where its outputs say its
environment had none) and the modules it ran as `python -m M` that nothing else gives (where they
resolve). pip resolves them for the lock's interpreter (the host's python3, or with `python` a
Debian root's, roots.py), wheels only, and the dependencies are held to their era: each one whose
chosen release came out after the project's next release is capped at its newest release from
before then that has a wheel for this interpreter; where its era had none, at the first later
one that has (none such, or a project that did not exist then: pip's choice stands, and a note
says so).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..traces.ir import Trace
from ..traces.task import Task, task_of
from .git import blob_ids, checkout, committed, text_files
from .lock import COMMIT, REPOSITORY, Locked, RegistryUnreachable, WorkspaceError, clean_abs, task_key
from .requirements import requirement, requirements
from .pypi import SIMPLE_INDEX, NoSuchProject, download_sdist, pip, releases, sdist_files, sdist_of, uploaded
from .build import cache_root, sdist_cache
from .roots import ensure_root, run_in, system_for
from .seen import (outputs, absent, crlf_seen, edit_score, modules_run, named_version, paths_seen, pytest_lacked,
                   recorded_blobs)

INTERPRETER = "/usr/bin/python3"      # the sandbox's own (its /usr is the host's, read-only)
DEFAULT_ENV = "/opt/venv"             # where the environment is when the trace names no interpreter
MAX_CANDIDATES = 40                   # sdists downloaded to compare with the edits, newest first
ERA_ROUNDS = 8
#: the pip that resolves on a system root's python3 (roots.py), pinned: only the lock runs it
RESOLVER_PIP = "pip==24.2 --hash=sha256:2cd581cf58ab7fcfca4ce8efa6dcacd0de5bf8d0a3eb9ec927e07405f4d9e2a2"


def _v(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def in_series(version: str, series: str | None) -> bool:
    return series is None or version == series or version.startswith(series + ".")


def choose_release(trace: Trace, task: Task, project: str, rels: dict[str, list[dict]],
                   forced: str | None = None) -> tuple[str, str]:
    """(version, how it was chosen) of the release whose sdist is the task's source."""
    with_sdist = {v: f for v, f in rels.items() if sdist_of(f) and _v(v) is not None and not all(x.get("yanked") for x in f)}
    if forced:
        if forced not in with_sdist:
            raise WorkspaceError(f"{project} {forced} has no sdist on PyPI")
        return forced, "given on the command line (--version)"
    cands = sorted((v for v in with_sdist if in_series(v, task.version)), key=lambda v: uploaded(with_sdist[v]) or "")
    if not cands:
        raise WorkspaceError(f"no release of {project} in the task's version series {task.version!r} has an sdist "
                             f"on PyPI (releases with one: {', '.join(sorted(with_sdist, key=_v)[-8:]) or 'none'})")
    named = named_version(trace, project, cands)
    if named:
        return named[0], f"the trajectory's output names {project} {named[0]} (step {named[1]})"
    scores, wanted, cache = {}, paths_seen(trace, task), sdist_cache()
    for v in cands[-MAX_CANDIDATES:]:
        sd = sdist_of(with_sdist[v])
        data = download_sdist(project, sd["filename"], sd["digests"]["sha256"], cache=cache)
        scores[v] = edit_score(trace, task, lf(sdist_files(data, sd["filename"], only=wanted)))
    best = max((a, g) for a, _, g in scores.values())
    series = f"series {task.version}" if task.version else "releases"
    if best > (0, 0):
        top = sorted((v for v in cands if v in scores and (scores[v][0], scores[v][2]) == best),
                     key=lambda v: _v(v).is_prerelease)          # a final release before a pre-release
        said = ", ".join(f"{v}: {a}/{t} edits, {g} lines" for v, (a, t, g) in scores.items())
        return top[0], (f"its sdist agrees best with the files the trajectory edited and viewed: {best[0]} of its "
                         f"{scores[top[0]][1]} edits of existing files apply and {best[1]} lines it saw are there "
                         f"(the {series} with an sdist: {said}); of {len(top)} that tie, the oldest (final releases first)")
    newest = cands[-1]
    return newest, (f"the newest release of the {series} with an sdist (uploaded {(uploaded(with_sdist[newest]) or '?')[:10]});"
                    " the trajectory names no version, and no sdist applies any of its edits")


def lf(files: dict[str, str]) -> dict[str, str]:
    return {k: v.replace("\r\n", "\n") for k, v in files.items()}


def _compatible(filename: str, tags: set[str]) -> bool:
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return any(str(t) in tags for t in wheel_tags)


def era_release(name: str, cutoff: str, tags: set[str], python: str, *, after: bool = False) -> str | None:
    """The newest release of `name` uploaded before `cutoff` with a wheel for these tags; `after`:
    the oldest uploaded after it with one (closest to the era, where its own era had none)."""
    best = None
    for v, files in releases(name).items():
        when, ver = uploaded(files), _v(v)
        if when is None or (when <= cutoff) == after or ver is None or ver.is_prerelease:
            continue
        ok = any(f.get("packagetype") == "bdist_wheel" and not f.get("yanked") and _compatible(f["filename"], tags)
                 and _python_ok(f.get("requires_python"), python) for f in files)
        if ok and (best is None or (ver < best if after else ver > best)):
            best = ver
    return str(best) if best else None


def _existed(name: str, cutoff: str) -> bool:
    """`name` had a release uploaded by `cutoff` (one that had not is a later release's new dependency)."""
    return any((when := uploaded(files)) is not None and when <= cutoff for files in releases(name).values())


def _python_ok(spec, python: str) -> bool:
    try:
        return not spec or Version(python) in SpecifierSet(spec)
    except (InvalidSpecifier, InvalidVersion):
        return True


def resolve(reqs: list[str], cutoff: str | None, interpreter: str = INTERPRETER,
            system: str | None = None) -> tuple[list[dict], str, list[str]]:
    """(wheels, the interpreter's version, notes): what pip installs for `reqs` on `interpreter`
    (of `system`'s root, roots.py; else the host's), wheels only, dependencies held to `cutoff`
    (module docstring). Tasks of one release resolve the same: pip runs once per process for each
    (requirements, cutoff, interpreter, system)."""
    key = (tuple(reqs), cutoff, interpreter, system)
    if key not in _RESOLVED:
        _RESOLVED[key] = _resolve(reqs, cutoff, interpreter, system)
    wheels, version, notes = _RESOLVED[key]
    return list(wheels), version, list(notes)


_RESOLVED: dict[tuple, tuple[list[dict], str, list[str]]] = {}


def _resolve(reqs: list[str], cutoff: str | None, interpreter: str,
             system: str | None) -> tuple[list[dict], str, list[str]]:
    notes: list[str] = []
    root = ensure_root(system, cache_root()) if system else None
    with tempfile.TemporaryDirectory(prefix="agentcgroup-lock-") as tmp:
        tmp = Path(tmp)
        inside = (lambda argv: run_in(root, argv, writable=(tmp,))) if root is not None else list
        done = subprocess.run(inside([interpreter, "-m", "venv", str(tmp / "env")]), capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise WorkspaceError(f"{interpreter} -m venv{f' ({system})' if system else ''} failed: {done.stderr.strip()[-400:]}")
        py = str(tmp / "env" / "bin" / "python")
        probe = subprocess.run(inside([py, "-c", "import json, platform; from pip._vendor.packaging.tags import sys_tags; "
                                       "print(json.dumps([platform.python_version(), [str(t) for t in sys_tags()]]))"]),
                               capture_output=True, text=True, timeout=60)
        if root is not None:        # the root's pip (its ensurepip's) predates pip install --dry-run --report
            (tmp / "pip.txt").write_text(RESOLVER_PIP + "\n")
            pip(py, ["install", "--require-hashes", "--only-binary=:all:", "--index-url", SIMPLE_INDEX,
                     "-r", str(tmp / "pip.txt")], what=f"the resolver's pip on {system}", root=root, writable=(tmp,))
        version, tags = json.loads(probe.stdout)
        tags = set(tags)
        (tmp / "req.txt").write_text("\n".join(reqs) + "\n")
        # a requirement pinned with == (the trajectory's pytest) is kept as it is
        pinned = {canonicalize_name(r.name) for r in map(Requirement, reqs) if any(sp.operator == "==" for sp in r.specifier)}
        caps: dict[str, str] = {n: "" for n in pinned}
        items = _dry_run(py, tmp, caps, root)
        late: dict[str, str] = {}
        for _ in range(ERA_ROUNDS if cutoff else 0):
            new = {}
            for it in items:
                name, ver = canonicalize_name(it["metadata"]["name"]), it["metadata"]["version"]
                if name in caps or (uploaded(releases(name).get(ver, [])) or "") <= cutoff:
                    continue
                era = era_release(name, cutoff, tags, version)
                if era is None and _existed(name, cutoff):
                    # none of its era installs here: the first one after it that does, not pip's newest
                    first = era_release(name, cutoff, tags, version, after=True)
                    if first and first != ver and not _clash(name, first, items, pinned):
                        late[name] = f"{name} {first} (the first release with a wheel for it)"
                        new[name] = f"{name}<={first}"
                        continue
                clash = _clash(name, era, items, pinned) if era else None
                if era is None or clash:
                    late[name] = f"{name} {ver}" + (f" (its era's {era} does not satisfy {clash})" if clash else "")
                    caps[name] = ""
                elif era != ver:
                    new[name] = f"{name}<={era}"
            if not new:
                break
            items = _cap(py, tmp, caps, sorted(new.items()), items, late, root)
        final = {canonicalize_name(it["metadata"]["name"]) for it in items}
        late_kept = [text for name, text in late.items() if name in final]     # not those resolved away since
        if late_kept:
            notes.append(f"newer than {cutoff[:10]}, the project's next release, for want of an older release that "
                         f"installs on Python {version}: {', '.join(late_kept)}")
    wheels = []
    for it in items:
        info = it.get("download_info") or {}
        sha = ((info.get("archive_info") or {}).get("hashes") or {}).get("sha256")
        if not sha:
            raise WorkspaceError(f"pip resolved {it['metadata']['name']} without a sha256 to pin ({info.get('url')})")
        wheels.append({"name": it["metadata"]["name"], "version": it["metadata"]["version"],
                       "file": info["url"].rsplit("/", 1)[-1], "sha256": sha})
    return sorted(wheels, key=lambda w: canonicalize_name(w["name"])), version, notes


def _clash(name: str, era: str, items: list[dict], pinned: set[str]) -> str | None:
    """The requirement of a pinned package (kept as it is) that `name`'s era release breaks, if any."""
    for it in items:
        if canonicalize_name(it["metadata"]["name"]) not in pinned:
            continue
        for raw in it["metadata"].get("requires_dist") or []:
            try:
                req = Requirement(raw)
            except InvalidRequirement:
                continue
            if canonicalize_name(req.name) == name and not (req.marker and "extra" in str(req.marker)) \
                    and not req.specifier.contains(era, prereleases=True):
                return f"{it['metadata']['name']}'s {raw}"
    return None


def _cap(py: str, tmp: Path, caps: dict[str, str], new: list[tuple[str, str]], items: list[dict],
         late: dict[str, str], root: Path | None) -> list[dict]:
    """Add the caps `new` to `caps`: all at once, else each half on its own (a cap that conflicts
    with the others' requirements is dropped, said in `late`); the resolution with those kept."""
    try:
        items = _dry_run(py, tmp, {**caps, **dict(new)}, root)
        caps.update(dict(new))
        return items
    except RegistryUnreachable:         # not a conflict: the lock cannot be made now
        raise
    except WorkspaceError:
        if len(new) == 1:
            caps[new[0][0]] = ""
            late[new[0][0]] = f"{new[0][0]} (its era's {new[0][1]} conflicts with the other requirements)"
            return items
    half = len(new) // 2
    items = _cap(py, tmp, caps, new[:half], items, late, root)
    return _cap(py, tmp, caps, new[half:], items, late, root)


def _dry_run(py: str, tmp: Path, caps: dict[str, str], root: Path | None) -> list[dict]:
    (tmp / "caps.txt").write_text("\n".join(c for c in caps.values() if c) + "\n")
    report = tmp / "report.json"
    pip(py, ["install", "--dry-run", "--ignore-installed", "--only-binary=:all:", "--index-url", SIMPLE_INDEX,
             "--report", str(report), "-r", str(tmp / "req.txt"), "-c", str(tmp / "caps.txt")],
        what="resolving the workspace's requirements", root=root, writable=(tmp,))
    return json.loads(report.read_text()).get("install", [])


def _runners(trace: Trace, task: Task, project: str, reqs: list[str], files: dict[str, str]) -> dict[str, int]:
    """{module: step}: modules the trajectory ran with `python -m` and succeeded that neither the
    standard library, pip, the project, its requirements nor a file of the sdist or of the
    trajectory's (`M.py`, `M/`) give, and that PyPI has under that name (nose, for an era's tests)."""
    have = {canonicalize_name(project), "pip", "pytest", *(canonicalize_name(r.name) for r in map(requirement, reqs) if r)}
    # the sdist's files, those the trajectory viewed or edited, and any X.py or X/ its commands name
    # (a script it wrote with the shell)
    named = [w for s in trace.steps if s.command for w in _PATH_WORD.findall(s.command)]
    local = {part.removesuffix(".py") for path in [*files, *paths_seen(trace, task), *named] for part in path.split("/")}
    out = {}
    for module, step in modules_run(trace).items():
        if module in sys.stdlib_module_names or canonicalize_name(module) in have or module in local:
            continue
        try:
            releases(module)
        except NoSuchProject:           # the module is the project's own, or one it wrote
            continue
        out[module] = step
    return out


_PATH_WORD = re.compile(r"[\w./-]+\.py\b|[\w.-]+/")


def lock(trace: Trace, *, project: str | None = None, version: str | None = None,
         interpreter: str = INTERPRETER, python: str | None = None, git: str | None = None,
         commit: str | None = None, commit_from: str | None = None, require: tuple[str, ...] = ()) -> Locked:
    """The lock entry of `trace`'s task (network: PyPI). WorkspaceError saying why there is none.
    `python` (X.Y): the environment is made of the Debian root whose python3 that is (roots.py).
    `git`: the source is that repository checked out at `commit` (default: the task's), not an
    sdist; its era is the commit's date (git.py); `commit_from` says where the commit was found.
    The commit's tree must hold the blobs the trajectory's recorded `git diff` names (seen.py).
    `require`: requirements the task's specification adds (`mpmath==1.3.0`), resolved with the
    others (one pinned with == is kept as it is)."""
    system = system_for(python) if python else None
    task = task_of(trace)
    key = task_key(task) if task else None
    if task is None or key is None:
        raise WorkspaceError(f"trace {trace.trace_id} names no task (instance id, or repository and version) to lock")
    if not clean_abs(task.path):
        raise WorkspaceError(f"trace {trace.trace_id}: task {key} names no repository path the agent used (task.path)")
    project = project or (task.repository or "").rsplit("/", 1)[-1]
    if not project:
        raise WorkspaceError(f"trace {trace.trace_id}: task {key} names no repository; say the project (--project)")
    if git is not None:
        source = _git_source(trace, task, key, git, commit)
    elif commit_from is not None:
        raise WorkspaceError("commit_from says where a git workspace's commit was found; this one is an sdist")
    else:
        source = _sdist_source(trace, task, project, version)
    files, later = source["files"], source["later"]
    reqs = requirements(lf(files), project)
    given = {canonicalize_name(r.name) for r in map(requirement, require) if r}
    reqs = [*(r for r in reqs if (q := requirement(r)) is None or canonicalize_name(q.name) not in given), *require]
    notes_required = [f"the task's specification adds {', '.join(require)}"] if require else []
    eol = "lf" if crlf_seen(trace, task, files) and git is None else None     # a checkout stays as committed
    banner = next((m.group(1) for _, t in outputs(trace) if (m := re.search(r"\bpytest-(\d+(?:\.\d+)+)", t))), None)
    lacked = None if banner else pytest_lacked(trace)
    pytest_req = [] if lacked is not None else [f"pytest=={banner}" if banner else "pytest"]
    notes = [f"no pytest: the trajectory's environment had none (step {lacked})"] if lacked is not None else []
    notes += notes_required
    runners = _runners(trace, task, project, reqs, files)
    ran = ", ".join(f"python -m {m} (step {n})" for m, n in runners.items())
    if runners:     # added where they resolve with the rest, as a wheel (a module name is not always its project's)
        try:
            # in the order the resolution below uses: resolve() keeps it, pip runs once
            resolve([*reqs, *runners, *pytest_req], later[0] if later else None, interpreter, system)
            reqs = [*reqs, *runners]
            notes.append(f"the trajectory ran {ran}: added from PyPI")
        except RegistryUnreachable:
            raise
        except WorkspaceError as exc:
            notes.append(f"the trajectory ran {ran}: not added, as it does not resolve here: "
                         f"{str(exc).splitlines()[-1][:160]}")
    try:
        wheels, py_version, more = resolve([*reqs, *pytest_req], later[0] if later else None, interpreter, system)
        notes += more
    except RegistryUnreachable:
        raise
    except WorkspaceError as exc:
        if not banner:
            raise
        notes.append(f"pytest=={banner} (the trajectory's) does not resolve here: {str(exc).splitlines()[-1][:160]}")
        wheels, py_version, more = resolve([*reqs, "pytest"], later[0] if later else None, interpreter, system)
        notes += more
    recorded_py = next((m.group(1) for _, t in outputs(trace) if (m := re.search(r"\bPython (\d+\.\d+\.\d+)", t))), None)
    if recorded_py and recorded_py.rsplit(".", 1)[0] != py_version.rsplit(".", 1)[0]:
        notes.insert(0, f"the trajectory ran Python {recorded_py}; this environment has {py_version}")
    missing = absent(trace, task, files)
    if missing:
        notes.append(f"the {source['what']} lacks {len(missing)} file(s) the trajectory viewed or edited: "
                     f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    env = task.python.rsplit("/bin/", 1)[0] if task.python and "/bin/" in task.python else DEFAULT_ENV
    return Locked(key=key, project=project, version=source["version"], chosen_by=source["how"], path=task.path,
                  env_path=env if clean_abs(env) else DEFAULT_ENV, interpreter=interpreter,
                  interpreter_version=py_version, sdist=source.get("sdist"),
                  wheels=tuple(wheels), notes=tuple(notes) + ((
                      f"the {source['what']}'s CRLF line ends are made LF, as the trajectory's editor saw its files",)
                      if eol else ()),
                  eol=eol, system=system, provider="git" if git is not None else "pypi",
                  repository=git, commit=source.get("commit"), commit_from=commit_from if git is not None else None)


def _sdist_source(trace: Trace, task: Task, project: str, version: str | None) -> dict:
    """The release's sdist (choose_release): its files, the later releases' upload times, the pin."""
    rels = releases(project)
    chosen, how = choose_release(trace, task, project, rels, forced=version)
    sd = sdist_of(rels[chosen])
    files = sdist_files(download_sdist(project, sd["filename"], sd["digests"]["sha256"], cache=sdist_cache()),
                        sd["filename"])
    later = sorted(t for v, f in rels.items() if (t := uploaded(f)) and t > (uploaded(rels[chosen]) or ""))
    return {"what": "sdist", "files": files, "later": later, "version": chosen, "how": how,
            "sdist": {"file": sd["filename"], "sha256": sd["digests"]["sha256"]}}


def _git_source(trace: Trace, task: Task, key: str, repository: str, commit: str | None) -> dict:
    """The repository checked out at `commit` (else the task's): its files, and its commit date as
    the era the dependencies are held to."""
    if task.commit and commit and task.commit != commit:
        raise WorkspaceError(f"trace {trace.trace_id}: task {key} names its commit {task.commit}; --commit {commit} "
                             f"is another (--commit is for a task that names none)")
    given = not task.commit
    commit = task.commit or commit
    if not commit:
        raise WorkspaceError(f"trace {trace.trace_id}: task {key} names no commit (40 hex digits) to check "
                             f"{repository} out at; give it (--commit)")
    if not COMMIT.fullmatch(commit):
        raise WorkspaceError(f"trace {trace.trace_id}: {'task ' + key + ' names' if not given else '--commit is'} "
                             f"{commit!r}, not a commit's 40 lowercase hex digits")
    if not REPOSITORY.fullmatch(repository):
        raise WorkspaceError(f"--git {repository}: not an https, http, git or file URL, or an absolute path")
    with tempfile.TemporaryDirectory(prefix="agentcgroup-git-") as tmp:
        checkout(repository, commit, Path(tmp) / "src")
        files, when = text_files(Path(tmp) / "src"), committed(Path(tmp) / "src")
        recorded = recorded_blobs(trace)
        have = blob_ids(Path(tmp) / "src", commit, sorted(recorded))
    wrong = [f"{p} (recorded {b}, the commit has {(have[p] or 'no such file')[:10]})" for p, b in sorted(recorded.items())
             if not (have[p] or "").startswith(b)]
    if wrong:
        raise WorkspaceError(f"trace {trace.trace_id}: {commit} is not the commit its git diff started from: "
                             + "; ".join(wrong))
    origin = "given" if given else "the task's base commit"
    held = f"; its tree holds the {len(recorded)} blob(s) the trajectory's git diff names" if recorded else ""
    return {"what": "checkout", "files": files, "later": [when], "version": f"0+git.{commit[:12]}",
            "commit": commit, "how": f"the git checkout of {repository} at {commit} ({origin}, committed {when[:10]}){held}"}
