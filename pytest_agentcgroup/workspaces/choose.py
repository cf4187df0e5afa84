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

The environment: the sdist's own requirements (PKG-INFO's Requires-Dist, setup.cfg, pyproject.toml,
a setup.py's install_requires / tests_require / extras_require built from literals,
requirements.txt), with its `test`/`tests`/`testing` extras, and pytest (the version the
trajectory's pytest banner shows, when it installs here; none where its outputs say its
environment had none). pip resolves them for the lock's interpreter, wheels only, and the
dependencies are held to their era: each one whose chosen release came out after the project's
next release is capped at its newest release from before then that has a wheel for this
interpreter (none such: pip's choice stands, and a note says so).
"""
from __future__ import annotations

import ast
import configparser
import json
import re
import subprocess
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..traces.ir import Trace
from ..traces.task import Task, task_of
from .lock import Locked, WorkspaceError, clean_abs, task_key
from .pypi import SIMPLE_INDEX, download_sdist, pip, releases, sdist_files, sdist_of, uploaded
from .build import sdist_cache
from .seen import outputs, absent, crlf_seen, edit_score, named_version, paths_seen, pytest_lacked

INTERPRETER = "/usr/bin/python3"      # the sandbox's own (its /usr is the host's, read-only)
DEFAULT_ENV = "/opt/venv"             # where the environment is when the trace names no interpreter
TEST_EXTRAS = ("test", "tests", "testing")
MAX_CANDIDATES = 40                   # sdists downloaded to compare with the edits, newest first
ERA_ROUNDS = 8


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


def requirements(files: dict[str, str], project: str) -> list[str]:
    """The sdist's requirements with its test extras (module docstring), as PEP 508 strings."""
    found: list[str] = []
    for line in files.get("PKG-INFO", "").splitlines():
        if line.startswith("Requires-Dist:"):
            found.append(line.split(":", 1)[1].strip())
    cfg = configparser.ConfigParser(interpolation=None)
    try:
        cfg.read_string(files.get("setup.cfg", ""))
        found += cfg.get("options", "install_requires", fallback="").splitlines()
        found += [x for k in TEST_EXTRAS for x in cfg.get("options.extras_require", k, fallback="").splitlines()]
        found += cfg.get("options", "tests_require", fallback="").splitlines()
    except configparser.Error:
        pass
    try:
        proj = tomllib.loads(files.get("pyproject.toml", "")).get("project", {})
        found += list(proj.get("dependencies") or [])
        found += [x for k in TEST_EXTRAS for x in (proj.get("optional-dependencies") or {}).get(k, [])]
    except (tomllib.TOMLDecodeError, AttributeError, TypeError):
        pass
    found += _setup_py(files.get("setup.py", ""))
    if not any(x.strip() for x in found):
        found += [x for x in files.get("requirements.txt", "").splitlines() if x.strip() and not x.startswith(("-", "#"))]
    out, me = [], canonicalize_name(project)
    for raw in found:
        req = _requirement(raw.split("#", 1)[0].strip())
        if req is None:
            continue
        marker = str(req.marker) if req.marker else ""
        extra = re.search(r'extra == "([^"]+)"', marker)
        if canonicalize_name(req.name) == me or (extra and extra.group(1) not in TEST_EXTRAS):
            continue
        req.marker = None if extra else req.marker
        if str(req) not in out:
            out.append(str(req))
    return out


def _requirement(text: str) -> Requirement | None:
    """`text` as a requirement; one today's parser refuses but the tools of its time took (a version
    ending in a dot: `xarray<=2022.03.`) with that dot dropped, else its bare name; None for none."""
    for attempt in (text, re.sub(r"(\d)\.(?=\s*(?:,|;|$))", r"\1", text)):
        try:
            return Requirement(attempt)
        except InvalidRequirement:
            pass
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", text)
    return Requirement(name.group(0)) if name else None


def _setup_py(text: str) -> list[str]:
    """The literal install_requires, tests_require and test extras of a setup.py (names bound at
    its top level to literals are followed); its code is never run."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    names = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}

    def literal(node, depth=0):
        """The value of an expression built from literals (and names bound to them) with lists,
        tuples, dicts, `%`, `+` and f-strings; None for anything else, or for a string no
        requirement would be (a hostile sdist cannot make a huge one)."""
        node = names.get(node.id, node) if isinstance(node, ast.Name) else node
        if depth > 8:
            return None
        if isinstance(node, ast.Constant):
            return node.value if isinstance(node.value, (str, int, float)) and not isinstance(node.value, bool) else None
        if isinstance(node, (ast.List, ast.Tuple)):          # ['mpmath>=%s' % min_version, ...]
            items = [literal(x, depth + 1) for x in node.elts]
            return None if any(x is None for x in items) else items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Dict) and None not in node.keys:          # extras_require={...}
            keys = [literal(k, depth + 1) for k in node.keys]
            return {k: literal(v, depth + 1) for k, v in zip(keys, node.values) if isinstance(k, str)}
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
            left, right = literal(node.left, depth + 1), literal(node.right, depth + 1)
            if left is None or right is None or isinstance(left, str) and re.search(r"%[-#0 +]*\d{3}", left):
                return None
            try:
                val = left % right if isinstance(node.op, ast.Mod) and isinstance(left, str) \
                    and not isinstance(right, (list, dict)) \
                    else left + right if isinstance(left, (str, list, tuple)) and type(left) is type(right) else None
            except Exception:                # a format that does not fit its values
                return None
            return val if not isinstance(val, str) or len(val) <= 1000 else None
        if isinstance(node, ast.JoinedStr):                 # f'mpmath>={min_version}'
            parts = []
            for v in node.values:
                x = v.value if isinstance(v, ast.Constant) else literal(v.value, depth + 1) \
                    if isinstance(v, ast.FormattedValue) and v.format_spec is None and v.conversion == -1 else None
                if not isinstance(x, (str, int, float)) or isinstance(x, bool):
                    return None
                parts.append(str(x))
            return "".join(parts)
        return None

    def strings(val) -> list[str]:
        return [val] if isinstance(val, str) else [x for x in val if isinstance(x, str)] \
            if isinstance(val, (list, tuple)) else []
    out: list[str] = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        for kw in call.keywords:
            val = literal(kw.value) if kw.arg in ("install_requires", "tests_require", "extras_require") else None
            if kw.arg == "extras_require":
                val = [x for k in TEST_EXTRAS for x in strings(val.get(k))] if isinstance(val, dict) else None
            out += [line for x in strings(val) for line in x.splitlines()]
    return out


def _compatible(filename: str, tags: set[str]) -> bool:
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return any(str(t) in tags for t in wheel_tags)


def era_release(name: str, cutoff: str, tags: set[str], python: str) -> str | None:
    """The newest release of `name` uploaded before `cutoff` with a wheel for these tags."""
    best = None
    for v, files in releases(name).items():
        when, ver = uploaded(files), _v(v)
        if when is None or when > cutoff or ver is None or ver.is_prerelease:
            continue
        ok = any(f.get("packagetype") == "bdist_wheel" and not f.get("yanked") and _compatible(f["filename"], tags)
                 and _python_ok(f.get("requires_python"), python) for f in files)
        if ok and (best is None or ver > best):
            best = ver
    return str(best) if best else None


def _python_ok(spec, python: str) -> bool:
    try:
        return not spec or Version(python) in SpecifierSet(spec)
    except (InvalidSpecifier, InvalidVersion):
        return True


def resolve(reqs: list[str], cutoff: str | None, interpreter: str = INTERPRETER) -> tuple[list[dict], str, list[str]]:
    """(wheels, the interpreter's version, notes): what pip installs for `reqs` on `interpreter`,
    wheels only, dependencies held to `cutoff` (module docstring). Tasks of one release resolve the
    same: pip runs once per process for each (requirements, cutoff, interpreter)."""
    key = (tuple(reqs), cutoff, interpreter)
    if key not in _RESOLVED:
        _RESOLVED[key] = _resolve(reqs, cutoff, interpreter)
    wheels, version, notes = _RESOLVED[key]
    return list(wheels), version, list(notes)


_RESOLVED: dict[tuple, tuple[list[dict], str, list[str]]] = {}


def _resolve(reqs: list[str], cutoff: str | None, interpreter: str) -> tuple[list[dict], str, list[str]]:
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="agentcgroup-lock-") as tmp:
        tmp = Path(tmp)
        done = subprocess.run([interpreter, "-m", "venv", str(tmp / "env")], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise WorkspaceError(f"{interpreter} -m venv failed: {done.stderr.strip()[-400:]}")
        py = str(tmp / "env" / "bin" / "python")
        probe = subprocess.run([py, "-c", "import json, platform; from pip._vendor.packaging.tags import sys_tags; "
                                "print(json.dumps([platform.python_version(), [str(t) for t in sys_tags()]]))"],
                               capture_output=True, text=True, timeout=60)
        version, tags = json.loads(probe.stdout)
        tags = set(tags)
        (tmp / "req.txt").write_text("\n".join(reqs) + "\n")
        # a requirement pinned with == (the trajectory's pytest) is kept as it is
        pinned = {canonicalize_name(r.name) for r in map(Requirement, reqs) if any(sp.operator == "==" for sp in r.specifier)}
        caps: dict[str, str] = {n: "" for n in pinned}
        items = _dry_run(py, tmp, caps)
        late: list[str] = []
        for _ in range(ERA_ROUNDS if cutoff else 0):
            new = {}
            for it in items:
                name, ver = canonicalize_name(it["metadata"]["name"]), it["metadata"]["version"]
                if name in caps or (uploaded(releases(name).get(ver, [])) or "") <= cutoff:
                    continue
                era = era_release(name, cutoff, tags, version)
                clash = _clash(name, era, items, pinned) if era else None
                if era is None or clash:
                    late.append(f"{name} {ver}" + (f" (its era's {era} does not satisfy {clash})" if clash else ""))
                    caps[name] = ""
                elif era != ver:
                    new[name] = f"{name}<={era}"
            if not new:
                break
            items = _cap(py, tmp, caps, sorted(new.items()), items, late)
        if late:
            notes.append(f"newer than {cutoff[:10]}, the project's next release, for want of an older release that "
                         f"installs on Python {version}: {', '.join(late)}")
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
         late: list[str]) -> list[dict]:
    """Add the caps `new` to `caps`: all at once, else each half on its own (a cap that conflicts
    with the others' requirements is dropped, said in `late`); the resolution with those kept."""
    try:
        items = _dry_run(py, tmp, {**caps, **dict(new)})
        caps.update(dict(new))
        return items
    except WorkspaceError:
        if len(new) == 1:
            caps[new[0][0]] = ""
            late.append(f"{new[0][0]} (its era's {new[0][1]} conflicts with the other requirements)")
            return items
    half = len(new) // 2
    items = _cap(py, tmp, caps, new[:half], items, late)
    return _cap(py, tmp, caps, new[half:], items, late)


def _dry_run(py: str, tmp: Path, caps: dict[str, str]) -> list[dict]:
    (tmp / "caps.txt").write_text("\n".join(c for c in caps.values() if c) + "\n")
    report = tmp / "report.json"
    pip(py, ["install", "--dry-run", "--ignore-installed", "--only-binary=:all:", "--index-url", SIMPLE_INDEX,
             "--report", str(report), "-r", str(tmp / "req.txt"), "-c", str(tmp / "caps.txt")],
        what="resolving the workspace's requirements")
    return json.loads(report.read_text()).get("install", [])


def lock(trace: Trace, *, project: str | None = None, version: str | None = None,
         interpreter: str = INTERPRETER) -> Locked:
    """The lock entry of `trace`'s task (network: PyPI). WorkspaceError saying why there is none."""
    task = task_of(trace)
    key = task_key(task) if task else None
    if task is None or key is None:
        raise WorkspaceError(f"trace {trace.trace_id} names no task (instance id, or repository and version) to lock")
    if not clean_abs(task.path):
        raise WorkspaceError(f"trace {trace.trace_id}: task {key} names no repository path the agent used (task.path)")
    project = project or (task.repository or "").rsplit("/", 1)[-1]
    if not project:
        raise WorkspaceError(f"trace {trace.trace_id}: task {key} names no repository; say the project (--project)")
    rels = releases(project)
    chosen, how = choose_release(trace, task, project, rels, forced=version)
    sd = sdist_of(rels[chosen])
    files = sdist_files(download_sdist(project, sd["filename"], sd["digests"]["sha256"], cache=sdist_cache()),
                        sd["filename"])
    later = sorted(t for v, f in rels.items() if (t := uploaded(f)) and t > (uploaded(rels[chosen]) or ""))
    reqs = requirements(lf(files), project)
    eol = "lf" if crlf_seen(trace, task, files) else None
    banner = next((m.group(1) for _, t in outputs(trace) if (m := re.search(r"\bpytest-(\d+(?:\.\d+)+)", t))), None)
    lacked = None if banner else pytest_lacked(trace)
    pytest_req = [] if lacked is not None else [f"pytest=={banner}" if banner else "pytest"]
    notes = [f"no pytest: the trajectory's environment had none (step {lacked})"] if lacked is not None else []
    try:
        wheels, py_version, more = resolve([*reqs, *pytest_req], later[0] if later else None, interpreter)
        notes += more
    except WorkspaceError as exc:
        if not banner:
            raise
        notes.append(f"pytest=={banner} (the trajectory's) does not resolve here: {str(exc).splitlines()[-1][:160]}")
        wheels, py_version, more = resolve([*reqs, "pytest"], later[0] if later else None, interpreter)
        notes += more
    recorded_py = next((m.group(1) for _, t in outputs(trace) if (m := re.search(r"\bPython (\d+\.\d+\.\d+)", t))), None)
    if recorded_py and recorded_py.rsplit(".", 1)[0] != py_version.rsplit(".", 1)[0]:
        notes.insert(0, f"the trajectory ran Python {recorded_py}; this environment has {py_version}")
    missing = absent(trace, task, files)
    if missing:
        notes.append(f"the sdist lacks {len(missing)} file(s) the trajectory viewed or edited: "
                     f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    env = task.python.rsplit("/bin/", 1)[0] if task.python and "/bin/" in task.python else DEFAULT_ENV
    return Locked(key=key, project=project, version=chosen, chosen_by=how, path=task.path,
                  env_path=env if clean_abs(env) else DEFAULT_ENV, interpreter=interpreter,
                  interpreter_version=py_version, sdist={"file": sd["filename"], "sha256": sd["digests"]["sha256"]},
                  wheels=tuple(wheels), notes=tuple(notes) + ((
                      "the sdist's CRLF line ends are made LF, as the trajectory's editor saw its files",) if eol else ()),
                  eol=eol)
