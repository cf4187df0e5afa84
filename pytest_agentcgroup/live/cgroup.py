"""The cgroup of one live session: an inner cgroup that its tool calls' cgroups are made under (by
cgroups/placement.py ArmPlacement, as a replay's steps are), and that can outlive the process that
made it, so that `agentcgroup exec` calls from one shell share it across invocations.

    <this process's cgroup>/agentcgroup-live-<hex>/     the session (inner): a trace-scope arm's limits
        s<n>/                                             one tool call (a leaf): a step-scope arm's limits

Its name is not a run root's (cgroups/tree.py `agentcgroup-<pid>-<ticks>`): a later run's sweep of
run roots whose maker is gone leaves it alone. It is removed when the session ends (the context
manager's exit; `agentcgroup exec --end`). On pure v2 the cgroup the session is made in first gives
its controllers to its children (cgroups/delegate.py, as for a run root); a non-root user needs that
cgroup delegated to them (docs/live.md).
"""
from __future__ import annotations

import json
import secrets
from pathlib import Path

from ..cgroups.delegate import Delegation
from ..cgroups.host import CgroupHost, CgroupUnavailable, check_writable
from ..cgroups.node import Cgroup, remove_tree
from ..cgroups.tree import CONTROLLERS, live_run_roots

PREFIX = "agentcgroup-live-"


def make_session_cgroup(host: CgroupHost) -> tuple[Cgroup, tuple[str, ...]]:
    """A new session cgroup under this process's cgroup and the controllers its children get."""
    check_writable(host)
    controllers = tuple(c for c in CONTROLLERS if host.mode == "v2" or c in host.v1)
    parents = {"unified": host.unified, **host.v1}
    name = PREFIX + secrets.token_hex(6)
    try:
        if host.mode == "v2":
            delegation = Delegation(host)
            with delegation.locked():
                refused = delegation.ensure(controllers)
                controllers = tuple(c for c in controllers if c not in refused)
                cg = Cgroup.make(host, parents, name, controllers, inner=True)
        else:
            cg = Cgroup.make(host, parents, name, controllers, inner=True)
    except PermissionError as exc:
        raise CgroupUnavailable(f"cannot create cgroups under {Path(exc.filename).parent}: {exc.strerror} "
                                "(run as root, or in a cgroup delegated to this user)") from None
    controllers = tuple(c for c in controllers if c not in cg.refused)     # optional ones the kernel refused
    return cg, controllers


def describe(cg: Cgroup, controllers: tuple[str, ...]) -> dict:
    """What reopen_session_cgroup needs to find the session's cgroup again (kept in a session directory)."""
    return {"paths": {k: str(v) for k, v in cg.paths.items()}, "controllers": list(controllers)}


def reopen_session_cgroup(host: CgroupHost, described: dict, where: str) -> tuple[Cgroup, tuple[str, ...]]:
    """The session cgroup `described` names (describe()), or CgroupUnavailable saying it is gone."""
    try:
        paths = {str(k): Path(v) for k, v in described["paths"].items()}
        controllers = tuple(str(c) for c in described["controllers"])
    except (KeyError, TypeError, AttributeError):
        raise CgroupUnavailable(f"{where}: cgroup: expected {{paths, controllers}}, "
                                f"got {json.dumps(described)[:200]}") from None
    missing = [str(p) for p in paths.values() if not p.name.startswith(PREFIX) or not p.is_dir()]
    if "unified" not in paths or missing:
        raise CgroupUnavailable(f"{where}: the session's cgroup is gone or not a session's "
                                f"({', '.join(missing) or 'no unified path'}); end the session (--end) and start a new one")
    return Cgroup(host, paths, inner=True), controllers


def remove_session_cgroup(cg: Cgroup) -> None:
    """Kill whatever is left in it, remove it; on v2 give back the controllers when nothing else
    of ours uses them (as the last run root does: cgroups/tree.py)."""
    cg.remove()
    host = cg.host
    if host.mode == "v2" and cg.unified.parent == host.unified:
        delegation = Delegation(host)
        with delegation.locked():
            others = [p for p in host.unified.iterdir() if p.name.startswith(PREFIX)]
            if not others and not live_run_roots(host.unified):
                delegation.release()


def remove_what_is_left(described: dict) -> None:
    """The directories of a session cgroup that is partly gone (its unified one removed by hand, a
    reboot's fresh hierarchies): whichever of them still exist, removed."""
    paths = described.get("paths") if isinstance(described, dict) else None
    for path in map(Path, (paths or {}).values() if isinstance(paths, dict) else ()):
        if path.name.startswith(PREFIX) and path.is_dir():
            remove_tree(path)
