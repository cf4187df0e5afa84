"""Step cgroups made before their step and removed after it: the cgroup lifecycle off the step's
critical path.

A step's own cost with a fresh cgroup is mkdir (one per hierarchy), limits, fork (from a large
Python process: most of a spawn's time), the joins, exec, wait, counters and rmdir. A StepPool keeps
one step cgroup ready — made, limited, with a `Parked` child already joined to it — so on the
critical path a step only hands its argv to the parked child, waits, and reads counters. Removing
the used cgroup and preparing the next one happen in `tidy()`, which the replayer calls after the
step's result has been delivered (between tool calls, while an agent would be thinking).

Pooled cgroups are named `p<n>` (n counts up per placement): a cgroup cannot be renamed on v2, and
which step a cgroup will serve is not known when it is made. A record's step id says which step it
was; `ArmPlacement.step_cg` is the cgroup of the step in progress.
"""
from __future__ import annotations

from typing import Callable

from ..proc import Parked
from .node import Cgroup


class StepPool:
    def __init__(self, make: Callable[[str], Cgroup]):
        self._make = make                   # name -> a new step cgroup with its limits
        self._ready: tuple[Cgroup, Parked] | None = None
        self._retired: list[Cgroup] = []
        self._made = 0

    def _prepare(self) -> tuple[Cgroup, Parked]:
        cg = self._make(f"p{self._made}")
        self._made += 1
        try:
            cg.counters()                   # opens its counter files (and cgroup.events, which
            cg.populated()                  # end_step polls) now rather than after the step
            return cg, Parked(cg.join_files())
        except BaseException:
            cg.remove()
            raise

    def take(self) -> tuple[Cgroup, Parked]:
        """The ready cgroup and its parked child (made now if tidy() has not run since the last take)."""
        entry, self._ready = self._ready or self._prepare(), None
        return entry

    def retire(self, cg: Cgroup) -> None:
        """A used step cgroup (its processes killed and counted): removed at the next tidy()."""
        self._retired.append(cg)

    def tidy(self) -> None:
        """Off the critical path: remove retired cgroups, prepare the next one."""
        retired, self._retired = self._retired, []
        for cg in retired:
            cg.remove()
        if self._ready is None:
            self._ready = self._prepare()

    def close(self) -> None:
        retired, self._retired = self._retired, []
        ready, self._ready = self._ready, None
        if ready is not None:
            ready[1].discard()
            retired.append(ready[0])
        for cg in retired:
            cg.remove()
