"""The workspace lock file: for each task of a corpus, the PyPI workspace its replays use, every file
pinned by sha256. `agentcgroup traces lock` writes it (choose.py); a replay reads it (provide.py)
and builds what it pins (build.py).

    <corpus>/workspaces.lock.json
    {"schema": "agentcgroup-workspaces/1",
     "workspaces": {
       "PyPSA__linopy-79": {                        # the task's key (task_key)
         "provider": "pypi",
         "project": "linopy", "version": "0.0.9",   # the release whose sdist is the source
         "chosen_by": "the sdist applies 7 of the trajectory's 7 edits of its files ...",
         "path": "/workspace/PyPSA__linopy__0.0",   # where the steps see the source
         "env_path": "/opt/conda/envs/testbed",     # where they see the environment (the agent's interpreter's)
         "interpreter": "/usr/bin/python3",         # the environment is made from it (the sandbox's /usr)
         "system": "debian-bullseye",               # optional: whose /usr that is (roots.py); else the host's
         "interpreter_version": "3.11.2",
         "sdist": {"file": "linopy-0.0.9.tar.gz", "sha256": "..."},
         "wheels": [{"name": "numpy", "version": "1.23.5", "file": "numpy-...whl", "sha256": "..."}, ...],
         "notes": ["the trajectory ran Python 3.9.20; this environment has 3.11.2", ...],
         "eol": "lf"}}}                             # optional: the sdist's CRLF text made LF (choose.py)

A git workspace (provider "git", git.py) names `repository` (a URL, or a local repository: a path
relative to the lock's directory, as a corpus names the store it ships, or an absolute one inside
it) and `commit` (40 hex digits) instead of `sdist`, and may say where the commit was found
(`commit_from`); its version is `0+git.<commit[:12]>`.

A lock that is not one (bad JSON, a missing key, a hash that is not 64 hex digits, a path that is
not clean and absolute) is a WorkspaceError naming the file, the task and the field.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..traces.task import Task

SCHEMA = "agentcgroup-workspaces/1"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")    # 0+git.<commit>: a checkout's, PEP 440 local
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.(?:tar\.gz|tar\.bz2|tgz|zip|whl)$")


class WorkspaceError(RuntimeError):
    """A workspace that cannot be chosen, locked or built; the message says which and why."""


class RegistryUnreachable(WorkspaceError):
    """A workspace that cannot be locked or built because the network failed: `registry` (a package
    index, a git repository's host) could not be reached. Any other WorkspaceError is the
    workspace's own (a bad lock, a file that is not the pinned one, a conflict)."""

    def __init__(self, message: str, registry: str = "the registry"):
        super().__init__(message)
        self.registry = registry


@dataclass(frozen=True)
class Locked:
    """One task's pinned PyPI workspace (the lock file's entry)."""
    key: str
    project: str
    version: str
    chosen_by: str
    path: str
    env_path: str
    interpreter: str
    interpreter_version: str
    sdist: dict | None
    wheels: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()
    provider: str = "pypi"
    eol: str | None = None
    system: str | None = None
    repository: str | None = None      # provider git: the repository and the commit it is checked out at
    commit: str | None = None
    commit_from: str | None = None     # provider git: where the commit was found (public data)
    #: provider git, a repository relative to the lock: its absolute path (not written to the lock)
    local_path: str | None = field(default=None, compare=False)

    def to_json(self) -> dict:
        out = asdict(self)
        del out["key"], out["local_path"]
        out["wheels"], out["notes"] = list(self.wheels), list(self.notes)
        for k in ("eol", "system", "repository", "commit", "commit_from", "sdist"):
            if out[k] is None:
                del out[k]
        return out

    def describe(self) -> str:
        """`pypi linopy==0.0.9`: what a replay's records say of their workspace."""
        what = (f"git {self.repository}@{self.commit[:12]}" if self.provider == "git" else
                f"pypi {self.project}=={self.version}")
        return what + (f" on {self.system}'s python3" if self.system else "")


def task_key(task: Task) -> str | None:
    """The key a task's workspace has in a lock: its instance id, else `<repository>@<version>`."""
    if task.instance_id:
        return task.instance_id
    if task.repository and task.version:
        return f"{task.repository}@{task.version}"
    return None


#: the interpreters a lock may name: the system's (the sandbox shows the host's /usr read-only)
INTERPRETER = re.compile(r"/usr(/local)?/bin/python3(\.\d+)?")
#: the systems a lock may name instead of the host's: name -> (Debian suite, its python3's X.Y);
#: roots.py makes them
SYSTEMS = {"debian-bullseye": ("bullseye", "3.9")}
#: what a git lock entry may name as its repository (git.py clones it): a URL of the protocols
#: git.py allows, or an absolute path (a local clone); and its commit
REPOSITORY = re.compile(r"(?:(?:https?|git|file)://[^\s]+|/[^\s]*)")
#: a local repository named relative to the lock's directory (a store the corpus ships)
RELATIVE = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.+/-]*")
COMMIT = re.compile(r"[0-9a-f]{40}")


def clean_abs(path) -> bool:
    return (isinstance(path, str) and path.startswith("/") and not path.startswith("//") and path != "/"
            and os.path.normpath(path) == path and "\0" not in path and "\n" not in path and len(path) <= 4096)


def local_repository_refused(repository: str, corpus: Path | None) -> str | None:
    """Why a lock may not name this repository, or None. A lock may come with a downloaded corpus,
    and a replay shows the checkout and its .git to the steps: a local one must lie inside the
    corpus (`corpus`, the lock's directory), never elsewhere on the host."""
    if not (repository.startswith("/") or repository.startswith("file://")):
        return None
    path = Path(repository.removeprefix("file://")).resolve()
    if corpus is not None and path.is_relative_to(Path(corpus).resolve()):
        return None
    return (f"{repository} is a local repository outside the corpus ({corpus}): a lock names a remote one "
            f"(https, http, git) or one the corpus holds")


def relative_repository(repository: str, corpus: Path | None) -> tuple[str | None, str | None]:
    """(the absolute path, None) of a repository named relative to the lock's directory `corpus`,
    or (None, why it may not be named so)."""
    if not RELATIVE.fullmatch(repository) or os.path.normpath(repository) != repository:
        return None, (f"{repository!r} is not an https, http, git or file URL, or an absolute path, or a clean path "
                      f"relative to the lock")
    if corpus is None:
        return None, f"{repository} is relative to a lock's directory, and this entry has none"
    top = Path(corpus).resolve()
    path = (top / repository).resolve()
    if not path.is_relative_to(top):
        return None, f"{repository} leads outside the corpus ({corpus})"
    return str(path), None


def parse_entry(key: str, raw, where: str, corpus: Path | None = None) -> Locked:
    def bad(field_: str, why: str):
        return WorkspaceError(f"{where}: workspaces.{key}.{field_}: {why}")
    local_path = None
    if not isinstance(raw, dict):
        raise bad("", "expected an object")
    provider = raw.get("provider", "pypi")
    if provider not in ("pypi", "git"):
        raise bad("provider", f"unknown provider {provider!r}; a lock pins pypi and git workspaces")
    for k in ("project", "version", "chosen_by", "path", "env_path", "interpreter", "interpreter_version"):
        if not isinstance(raw.get(k), str) or not raw[k].strip():
            raise bad(k, "expected a non-empty string")
    if not _NAME.match(raw["project"]) or not _VERSION.match(raw["version"]):
        raise bad("project", f"{raw['project']!r}=={raw['version']!r} is not a project name and version")
    for k in ("path", "env_path", "interpreter"):
        if not clean_abs(raw[k]):
            raise bad(k, f"{raw[k]!r} is not a clean absolute path")
    if not INTERPRETER.fullmatch(raw["interpreter"]):
        # a lock may come with a corpus: the host runs this program to make the environment
        raise bad("interpreter", f"{raw['interpreter']!r} is not a system python (/usr/bin or /usr/local/bin, python3[.N])")
    if provider == "git":
        # the host runs git on it: a URL of the protocols git.py speaks, or a local path; never ext::
        if not isinstance(raw.get("repository"), str):
            raise bad("repository", f"{raw.get('repository')!r} is not an https, http, git or file URL, or a path")
        if REPOSITORY.fullmatch(raw["repository"]):
            if (why := local_repository_refused(raw["repository"], corpus)) is not None:
                raise bad("repository", why)
        else:
            local_path, why = relative_repository(raw["repository"], corpus)
            if why is not None:
                raise bad("repository", why)
        if raw.get("commit_from") is not None and (not isinstance(raw["commit_from"], str) or not raw["commit_from"].strip()):
            raise bad("commit_from", "expected a non-empty string: where the commit was found")
        if raw.get("eol") is not None:
            raise bad("eol", "a git workspace keeps its files as committed (its .git would see them changed)")
        if not isinstance(raw.get("commit"), str) or not COMMIT.fullmatch(raw["commit"]):
            raise bad("commit", "expected the commit's 40 lowercase hex digits")
        if raw.get("sdist") is not None:
            raise bad("sdist", "a git workspace has no sdist")
    elif raw.get("repository") is not None or raw.get("commit") is not None or raw.get("commit_from") is not None:
        raise bad("repository", "a pypi workspace has no repository or commit")
    pins = ([("sdist", raw.get("sdist"))] if provider == "pypi" else []) + \
        [(f"wheels[{i}]", w) for i, w in enumerate(raw.get("wheels") or [])]
    if not isinstance(raw.get("wheels", []), list):
        raise bad("wheels", "expected a list")
    for name, pin in pins:
        if not isinstance(pin, dict) or not isinstance(pin.get("file"), str) or not _FILE.match(pin["file"]):
            raise bad(name, "expected {file, sha256} naming an sdist or wheel file")
        if not isinstance(pin.get("sha256"), str) or not _SHA256.match(pin["sha256"]):
            raise bad(f"{name}.sha256", "expected 64 lowercase hex digits")
        if name != "sdist" and not (_NAME.match(str(pin.get("name", ""))) and _NAME.match(str(pin.get("version", "")))):
            raise bad(name, "a wheel needs its name and version")
    notes = raw.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise bad("notes", "expected a list of strings")
    if raw.get("eol") not in (None, "lf"):
        raise bad("eol", f"expected \"lf\" or nothing, got {raw.get('eol')!r}")
    system = raw.get("system")
    if system is not None:
        if not isinstance(system, str) or system not in SYSTEMS:
            raise bad("system", f"unknown system {system!r} (known: {', '.join(SYSTEMS)}; none: the host's)")
        version = SYSTEMS[system][1]
        if raw["interpreter"] not in ("/usr/bin/python3", f"/usr/bin/python{version}") \
                or not raw["interpreter_version"].startswith(version + "."):
            raise bad("interpreter", f"{raw['interpreter']} {raw['interpreter_version']} is not {system}'s "
                                     f"/usr/bin/python3 ({version})")
    return Locked(key=key, project=raw["project"], version=raw["version"], chosen_by=raw["chosen_by"],
                  path=raw["path"], env_path=raw["env_path"], interpreter=raw["interpreter"],
                  interpreter_version=raw["interpreter_version"], sdist=dict(raw["sdist"]) if provider == "pypi" else None,
                  wheels=tuple(dict(w) for w in raw.get("wheels") or []), notes=tuple(notes), eol=raw.get("eol"),
                  system=raw.get("system"), provider=provider, repository=raw.get("repository"), commit=raw.get("commit"),
                  commit_from=raw.get("commit_from"), local_path=local_path)


@dataclass
class LockFile:
    path: Path
    entries: dict[str, Locked] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | Path) -> "LockFile":
        """The lock at `path` (an empty one when there is no such file)."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise WorkspaceError(f"{path}: cannot read the workspace lock: {exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkspaceError(f"{path}: invalid JSON: {exc.msg} (line {exc.lineno})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("workspaces"), dict):
            raise WorkspaceError(f"{path}: not a workspace lock (expected schema {SCHEMA!r} and a workspaces object)")
        return cls(path, {k: parse_entry(k, v, str(path), path.parent) for k, v in data["workspaces"].items()})

    def write(self) -> None:
        data = {"schema": SCHEMA, "workspaces": {k: e.to_json() for k, e in sorted(self.entries.items())}}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
