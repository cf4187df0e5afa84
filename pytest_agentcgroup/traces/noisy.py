"""Noisy neighbours as synthetic traces, so they replay like any other tenant: a CPU hog, an
allocation stress and a fork bomb, each a `bash` step.

Under the `sandbox` (or `docker`) executor the commands really run: stress-ng for the CPU hog and the
allocation stress, a shell fork bomb that forks until its cgroup's pids limit stops it and runs until
its step timeout kills the step's cgroup. Under `emulate` the CPU hog and the allocation stress
replay their (synthetic) profile; the fork bomb then has no profile and runs as an empty step.

**Replay the fork bomb only under an arm with `pids_max`**: without a pids limit it is bounded only
by its 5 s timeout and the kernel's pid_max, and slows the whole host.

Every number here is `synthetic`: made up by us, not recorded from an agent.
"""
from __future__ import annotations

from pathlib import Path

from .ir import Measure, Profile, Step, Trace, write_trace

SOURCE = {"format": "synthetic", "dataset": "noisy-neighbours", "origin": "pytest_agentcgroup/traces/noisy.py",
          "licence": "MIT"}
CPUS = 2                                  # the CPU hog keeps this many CPUs busy

FORK_BOMB = "bomb() { bomb | bomb & }; bomb; sleep 60"


def _step(i: int, cmd: str, *, duration_ms: float, timeout_ms: float, peak_mb: float | None = None,
          cpu_ms: float | None = None, kind: str) -> Step:
    syn = lambda v: Measure(float(v), "synthetic")     # noqa: E731
    profile = Profile(peak_mb=syn(peak_mb) if peak_mb is not None else None,
                      ramp_ms=syn(duration_ms / 6) if peak_mb is not None else None,
                      cpu_ms=syn(cpu_ms) if cpu_ms is not None else None)
    return Step(i, "bash", {"command": cmd, "cwd": "/workspace", "timeout_ms": timeout_ms, "noisy": kind},
                native_tool="Bash", duration_ms=syn(duration_ms), profile=profile)


def cpu_hog(i: int = 0, seconds: int = 6) -> Step:
    return _step(i, f"stress-ng --cpu {CPUS} --cpu-method matrixprod --timeout {seconds}s --quiet",
                 duration_ms=seconds * 1000, timeout_ms=(seconds + 10) * 1000, peak_mb=16,
                 cpu_ms=CPUS * seconds * 1000, kind="cpu-hog")


def alloc_stress(i: int = 0, seconds: int = 6, mb: int = 768) -> Step:
    # two workers, each keeping mb/2 mapped and rewriting it: memory held high for the whole step
    return _step(i, f"stress-ng --vm 2 --vm-bytes {mb // 2}M --vm-keep --timeout {seconds}s --quiet",
                 duration_ms=seconds * 1000, timeout_ms=(seconds + 10) * 1000, peak_mb=mb,
                 cpu_ms=2 * seconds * 1000, kind="alloc-stress")


def fork_bomb(i: int = 0, seconds: int = 5) -> Step:
    # the shell sleeps while its bomb rages; the step's timeout (cgroup.kill) ends both
    return _step(i, FORK_BOMB, duration_ms=seconds * 1000, timeout_ms=seconds * 1000, kind="fork-bomb")


def traces() -> list[Trace]:
    def trace(name: str, steps: list[Step]) -> Trace:
        return Trace(f"synthetic/noisy-{name}", dict(SOURCE), tuple(steps))
    return [
        trace("cpu", [cpu_hog(0)]),
        trace("alloc", [alloc_stress(0)]),
        trace("forkbomb", [fork_bomb(0)]),
        trace("mix", [cpu_hog(0), alloc_stress(1), fork_bomb(2), cpu_hog(3), alloc_stress(4)]),
    ]


def write(out: Path) -> list[tuple[Trace, str]]:
    """Write every noisy trace to out/synthetic/noisy-<name>.json; returns (trace, relative file)."""
    written = []
    for t in traces():
        rel = f"synthetic/{t.trace_id.split('/', 1)[1]}.json"
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        write_trace(t, out / rel)
        written.append((t, rel))
    return written
