"""What a replay of real commands (sandbox, docker) asks of the harness to be a replay of its trace:
the workspace of the trace's task (workspaces/provide.py), or a failure naming it when it is
missing, and at the end the check that the steps ended as the trace recorded (metrics/faithfulness.py).

May import: workspaces/, metrics/, engines/, config and the harness's settings, state and collect.
"""
from __future__ import annotations

import pytest

from ..metrics import faithfulness
from ..traces.ir import Trace
from ..workspaces.lock import WorkspaceError
from ..workspaces.provide import Provided, provide
from .collect import Case
from .settings import setting
from .state import STATE


def workspace(config: pytest.Config, case: Case, trace: Trace, executor, executor_name: str, *,
              marker=None) -> tuple[Provided | None, str | None]:
    """(the trace's workspace, handed to `executor` as its `seed`; why it has none where its task
    needs one). Called at the test's set-up, so that a first build is not timed as its replay; the
    test fails with the why when it replays (`missing`). (None, None) under emulate: no real command runs."""
    if executor_name not in faithfulness.REAL_EXECUTORS:
        return None, None
    try:
        got = provide(trace, executor=executor_name, image=getattr(executor, "image", None),
                      directory=setting(config, "workspace", marker=marker, experiment=case.experiment),
                      corpus=config.stash[STATE].load_corpus(config).root)
    except WorkspaceError as exc:
        return None, f"{case.experiment.name} under arm {case.arm.name}: {exc}"
    if got is not None and got.seed is not None:
        executor.seed = got.seed
    return got, None


def missing(why: str | None) -> None:
    """Fail the test, before any step is replayed, when its trace's task has no workspace."""
    if why:
        pytest.fail(why, pytrace=False)


def record_fields(got: Provided | None, first: bool) -> dict:
    """What a step's record says of the trace's workspace (how it was chosen: on its first record)."""
    if got is None:
        return {}
    return {"workspace": got.name, **({"workspace_chosen_by": got.chosen_by} if first and got.chosen_by else {})}


def check(config: pytest.Config, case: Case, records: list[dict], *, marker=None) -> None:
    """Fail the test when its steps diverged from the trace beyond max_divergence, naming the first."""
    share = setting(config, "max_divergence", marker=marker, experiment=case.experiment)
    bad = faithfulness.failure(records, share)
    if bad:
        pytest.fail(f"{case.experiment.name} under arm {case.arm.name}: the replay is not faithful to its trace: "
                    f"{bad}", pytrace=False)
