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
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.(?:tar\.gz|tar\.bz2|tgz|zip|whl)$")


class WorkspaceError(RuntimeError):
    """A workspace that cannot be chosen, locked or built; the message says which and why."""


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
    sdist: dict
    wheels: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()
    provider: str = "pypi"
    eol: str | None = None
    system: str | None = None

    def to_json(self) -> dict:
        out = asdict(self)
        del out["key"]
        out["wheels"], out["notes"] = list(self.wheels), list(self.notes)
        for k in ("eol", "system"):
            if out[k] is None:
                del out[k]
        return out

    def describe(self) -> str:
        """`pypi linopy==0.0.9`: what a replay's records say of their workspace."""
        return f"pypi {self.project}=={self.version}" + (f" on {self.system}'s python3" if self.system else "")


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


def clean_abs(path) -> bool:
    return (isinstance(path, str) and path.startswith("/") and not path.startswith("//") and path != "/"
            and os.path.normpath(path) == path and "\0" not in path and "\n" not in path and len(path) <= 4096)


def parse_entry(key: str, raw, where: str) -> Locked:
    def bad(field_: str, why: str):
        return WorkspaceError(f"{where}: workspaces.{key}.{field_}: {why}")
    if not isinstance(raw, dict):
        raise bad("", "expected an object")
    if raw.get("provider", "pypi") != "pypi":
        raise bad("provider", f"unknown provider {raw.get('provider')!r}; a lock pins pypi workspaces")
    for k in ("project", "version", "chosen_by", "path", "env_path", "interpreter", "interpreter_version"):
        if not isinstance(raw.get(k), str) or not raw[k].strip():
            raise bad(k, "expected a non-empty string")
    if not _NAME.match(raw["project"]) or not _NAME.match(raw["version"]):
        raise bad("project", f"{raw['project']!r}=={raw['version']!r} is not a project name and version")
    for k in ("path", "env_path", "interpreter"):
        if not clean_abs(raw[k]):
            raise bad(k, f"{raw[k]!r} is not a clean absolute path")
    if not INTERPRETER.fullmatch(raw["interpreter"]):
        # a lock may come with a corpus: the host runs this program to make the environment
        raise bad("interpreter", f"{raw['interpreter']!r} is not a system python (/usr/bin or /usr/local/bin, python3[.N])")
    pins = [("sdist", raw.get("sdist"))] + [(f"wheels[{i}]", w) for i, w in enumerate(raw.get("wheels") or [])]
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
                  interpreter_version=raw["interpreter_version"], sdist=dict(raw["sdist"]),
                  wheels=tuple(dict(w) for w in raw.get("wheels") or []), notes=tuple(notes), eol=raw.get("eol"),
                  system=raw.get("system"))


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
        return cls(path, {k: parse_entry(k, v, str(path)) for k, v in data["workspaces"].items()})

    def write(self) -> None:
        data = {"schema": SCHEMA, "workspaces": {k: e.to_json() for k, e in sorted(self.entries.items())}}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)
