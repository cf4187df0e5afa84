"""Profile traces: each trace's executing steps run once, in order, in one workspace per trace (the
state an agent's run leaves carries from step to step: files, the shell's directory), each step
measured in its own cgroup (meter.py); the trace is written back with recorded figures.

What a profiled step carries (traces/ir.py):
- `duration_ms`: wall time, spawn to reap; `profile`: peak_mb (the kernel's per-cgroup peak),
  ramp_ms (start to the highest reading of the curve), cpu_ms (user + system), io_bytes (where the
  kernel counts it per cgroup and the workspace is not a tmpfs; omitted otherwise), curve (memory
  every few ms, 0 at the spawn) — every number `recorded`, except a peak taken from the curve where
  the kernel has no memory.peak (`derived`; source.profiled.peak_from_curve lists those steps);
- `outcome`: timeout (killed at its timeout) > oom (any OOM kill in its cgroup) > failed (exit != 0)
  > ok; `error` for a step that could not start (refused or not spawnable; nothing measured). A
  step killed by a signal has exit_code 128 + signal (the shell's convention); a timed-out step none;
- `original`: the figures the step had before (kept from an earlier `original` when a profiled
  trace is profiled again, so it always holds the source's own);
- `output`: the head of what it printed here, for a step whose source recorded its output.
The trace's `source.faithfulness` is its verdict by the faithfulness rule
(metrics/source_faithfulness.py), judged here from what this run recorded.
An edit the trace recorded in full is applied by the editor (replay/editor.py) and profiled like a
command. Steps that execute nothing here (read, search, noop, browser, an edit kept only as its
size: the agent runtime's own work, not a command) keep their profile unchanged and get no outcome:
that is what "not profiled" means.

Output: OUT/<trace_id>.json (the corpus layout), written whole once the trace has ended (a
`.partial` file before), and OUT/manifest.json listing it (merged: the rest of the manifest and the
entry's other keys kept). A trace whose output is complete is skipped (resume, and listed if it was
not); anything else is profiled again. An output path that is an input file, or an existing file
that is not a profiled trace, is refused before anything runs, as is a manifest that does not read.
"""
from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ..cgroups.host import detect
from ..programs import which
from ..cgroups.tree import RunTree
from ..replay.executors import make_executor
from ..replay.executors.base import SeedFailed
from ..replay.replayer import StepResult, replay_step
from ..metrics.source_faithfulness import OUTPUT_KEPT, judge_trace
from ..traces.corpus import LOCK_FILE, MANIFEST, ir_files
from ..traces.ir import Curve, Measure, Original, Outcome, Profile, Step, Trace, TraceError, read_traces
from ..workspaces.lock import WorkspaceError
from ..workspaces.roots import run_in
from ..workspaces.provide import EMPTY, Provided, provide
from . import ProfileError
from .meter import SAMPLE_PERIOD_S, StepMeasure, StepMeter, peak_rss_mib
from .output import (add_to_manifest, check_manifest, check_outputs, check_writable, is_complete, output_path,
                     step_line, write_profiled)

MB = 1024 * 1024


@dataclass(frozen=True)
class Settings:
    executor: str = "sandbox"            # sandbox | docker
    # the traces' workspace: a directory copied to each trace's task path (or working directory),
    # the string "empty" for none; unset: the task's, from the lock beside the traces (provide.py)
    workspace: Path | str | None = None
    image: str | None = None             # docker: the image (default: the trace's SWE-rebench image, else local)
    step_timeout_s: float = 120.0
    memory_max_mb: int = 4096            # each step's hard memory limit (above it: OOM-killed, outcome oom)
    pids_max: int = 1024
    period_s: float = SAMPLE_PERIOD_S
    subset: str = "profiled"             # the manifest subset the profiled traces are listed in
    # written as FAMILY/<the rest of the id>, beside the original in one corpus; None: its own id
    family: str | None = None
    command: str = ""                    # the command line, for the traces' provenance
    # the CPUs the steps may use: a -n worker's slice (parallel.py); None: all this process may use
    step_cpus: tuple[int, ...] | None = None


def lock_dir(start: Path) -> Path:
    """The directory whose workspace lock the traces under `start` use (load_inputs): the nearest
    with a lock from `start` up to the corpus root (manifest.json); with no corpus root above, only
    `start` and its parent. The path as given, not its symlinks' targets."""
    here = start.absolute()
    chain = [here, *here.parents]
    root = next((i for i, d in enumerate(chain) if (d / MANIFEST).is_file()), None)
    for d in chain[:root + 1 if root is not None else 2]:
        if (d / LOCK_FILE).is_file():
            return start if d == here else d
    return start


def load_inputs(paths: list[Path]) -> list[tuple[Path, Trace, Path]]:
    """(file, trace, corpus) for every trace in the files (directories: traces/corpus.ir_files), all
    read before anything runs; a bad file is a ProfileError naming it. The corpus is where the
    workspace lock for the trace's task is (lock_dir): the directory given (or the file's own), else
    the nearest one above it that has a lock, up to the corpus root (the directory of manifest.json),
    so `traces/mini-swe-agent` finds `traces/workspaces.lock.json`."""
    files: list[tuple[Path, Path]] = []
    for p in paths:
        try:
            if not p.exists():
                raise ProfileError(f"{p}: no such file or directory")
            files += [(f, lock_dir(p if p.is_dir() else p.parent)) for f in ir_files([p])]
        except OSError as exc:           # e.g. a directory this user may not enter
            raise ProfileError(f"{exc.filename or p}: {exc.strerror}") from None
    out, seen = [], {}
    for f, corpus in files:
        try:
            traces = list(read_traces(f))
        except TraceError as exc:
            raise ProfileError(str(exc)) from None
        for t in traces:
            if t.trace_id in seen:
                raise ProfileError(f"{f}: trace {t.trace_id!r} is also in {seen[t.trace_id]}")
            seen[t.trace_id] = f
            out.append((f, t, corpus))
    if not out:
        raise ProfileError(f"no traces in {', '.join(map(str, paths))}")
    return out


def renamed(trace: Trace, family: str) -> Trace:
    """`trace` as FAMILY/<its id less its first part>: claude-code/haiku/x -> claude-code-recorded/haiku/x."""
    rest = trace.trace_id.split("/", 1)[1] if "/" in trace.trace_id else trace.trace_id
    return replace(trace, trace_id=f"{family}/{rest}")


def profile_traces(paths: list[Path], out: Path, settings: Settings, *,
                   progress: Callable[[str], None] = lambda line: None,
                   advance: Callable[[int, int], None] = lambda done, total: None, engine=None,
                   workers: int = 1) -> dict:
    """Profile every trace in `paths` into `out`. Returns {"profiled": [...], "skipped": [...],
    "peak_rss_mib": {"profiler": MiB[, "largest_worker": MiB]}} (this process's own peak, not its steps').
    `progress` gets a line per step (and per trace skipped), `advance` the steps done of those to
    do, from (0, total) on. docker: `engine` is a DockerEngine the caller owns; without one, one is
    acquired and released. `workers` > 1: that many processes, each on its own CPUs (parallel.py)."""
    if workers > 1:
        from .parallel import check_workers
        check_workers(workers)
    inputs = load_inputs(paths)
    if settings.family:
        inputs = [(f, renamed(t, settings.family), corpus) for f, t, corpus in inputs]
    if settings.workspace not in (None, EMPTY) and not Path(settings.workspace).is_dir():
        raise ProfileError(f"--workspace {settings.workspace}: not a directory")
    corpus_of = {t.trace_id: corpus for _, t, corpus in inputs}
    todo = [(t, output_path(out, t.trace_id)) for _, t, _ in inputs]
    # everything that could stop the writing is checked before the first step runs
    check_outputs([(f, t) for f, t, _ in inputs], todo)
    check_writable(out)
    manifest = check_manifest(out)
    complete = [(t, dst) for t, dst in todo if is_complete(dst, t)]
    skipped = [t.trace_id for t, _ in complete]
    todo = [(t, dst) for t, dst in todo if t.trace_id not in skipped]
    for tid in skipped:
        progress(f"{tid}: complete in {out}, skipped (resume)")
    # a trace written by a run that stopped before its manifest entry was: listed now
    listed = {e.get("trace_id") for e in manifest.get("traces") or [] if isinstance(e, dict)}
    in_subset = set((manifest.get("subsets") or {}).get(settings.subset) or [])
    unlisted = [(next(iter(read_traces(dst))), dst) for t, dst in complete
                if t.trace_id not in listed or t.trace_id not in in_subset]
    if unlisted:
        add_to_manifest(out, unlisted, settings.subset)
    done: list[str] = []
    if not todo:
        return _result(done, skipped)
    host = detect()
    controllers = ("memory", "pids", "cpu") + (("io",) if host.mode == "v2" and "io" in host.controllers else ())
    if workers > 1:
        from .parallel import profile_parallel
        done, worker_rss = profile_parallel(todo, corpus_of, out, settings, workers, controllers, profile_one,
                                            progress=progress, advance=advance)
        return _result(done, skipped, worker_rss)
    tree = RunTree(host, controllers=controllers)
    own_engine = None
    try:
        if settings.executor == "docker" and engine is None:
            from ..engines.docker import DockerEngine
            engine = own_engine = DockerEngine.acquire()
        total, stepped = sum(len(t.steps) for t, _ in todo), 0
        advance(0, total)
        for i, (trace, dst) in enumerate(todo, 1):
            def on_step(k: int, n: int, step: Step, i=i, trace=trace):
                nonlocal stepped
                stepped += 1
                advance(stepped, total)
                progress(f"[{i}/{len(todo)}] {step_line(trace.trace_id, k, n, step)}")
            profiled = profile_one(trace, tree, engine, settings, on_step, corpus_of[trace.trace_id])
            write_profiled(profiled, dst)
            add_to_manifest(out, [(profiled, dst)], settings.subset)
            done.append(trace.trace_id)
    finally:
        try:
            if own_engine is not None:
                own_engine.release()
        finally:
            tree.close()
    return _result(done, skipped)


def _result(profiled: list[str], skipped: list[str], worker_rss: float | None = None) -> dict:
    rss = {"profiler": round(peak_rss_mib(), 1)}
    if worker_rss is not None:
        rss["largest_worker"] = round(worker_rss, 1)
    return {"profiled": profiled, "skipped": skipped, "peak_rss_mib": rss}


def profile_one(trace: Trace, tree: RunTree, engine, settings: Settings, on_step, corpus: Path) -> Trace:
    workload = tree.workload(trace.trace_id)
    docker, nest_in = {}, None
    if settings.executor == "docker":
        from ..cgroups.container import cgroup_parent, steps_in_container
        docker = {"engine": engine, "cgroup_parent": cgroup_parent(tree, workload)}
    try:
        executor = make_executor(settings.executor, time_scale=1.0, step_timeout_s=settings.step_timeout_s, **docker)
        if docker:
            executor.image = settings.image or executor.image_for(trace)
            nest_in = steps_in_container(tree, workload, executor)
        provided = _workspace(trace, executor, settings, corpus)
        executor.seed = provided.seed if provided is not None else None
        meter = StepMeter(workload, tree.controllers, memory_max_mb=settings.memory_max_mb,
                          pids_max=settings.pids_max, period_s=settings.period_s, nest_in=nest_in)
        steps, measures = [], []
        try:
            try:
                executor.start(trace)
            except SeedFailed as exc:
                raise ProfileError(f"trace {trace.trace_id}: {exc}") from None
            memory_fs = workspace_on_memory_fs(executor)
            for k, step in enumerate(trace.steps, 1):
                meter.last = None               # a step refused before its cgroup was made leaves none
                result = replay_step(trace, step, executor, meter)
                new = _profiled_step(step, result, meter.last, io=memory_fs is None)
                if new.outcome is not None and new.outcome.status != "error":
                    measures.append((step.step_id, meter.last))
                steps.append(new)
                on_step(k, len(trace.steps), new)
        finally:
            try:
                meter.close()
            finally:
                executor.stop()
    finally:
        workload.remove()
    source = {**trace.source, "profiled": _provenance(tree, settings, measures, executor, memory_fs, provided)}
    done = Trace(trace_id=trace.trace_id, source=source, steps=tuple(steps), task=trace.task)
    return replace(done, source={**source, "faithfulness": judge_trace(done).stored()})


def _profiled_step(step: Step, result: StepResult, m: StepMeasure | None, *, io: bool = True) -> Step:
    if not result.executed and not result.error:
        return step                                   # executes nothing: not profiled
    original = step.original or Original(duration_ms=step.duration_ms, profile=step.profile)
    if not result.executed or m is None:              # refused, or could not be spawned: nothing ran
        return replace(step, duration_ms=None, profile=Profile(), outcome=Outcome("error"), original=original,
                       output=None)
    if result.timed_out:
        outcome = Outcome("timeout", None)
    else:
        code = result.exit_code if result.exit_code is not None else (
            128 + result.signal if result.signal is not None else None)
        status = "oom" if m.oom_kills else "ok" if code == 0 else "failed"
        outcome = Outcome(status, code)
    rec = lambda v: Measure(round(float(v), 3), "recorded")       # noqa: E731
    curve = to_curve(step_time_base(m.curve, m.window_ms, result.latency_ms), round(result.latency_ms, 3))
    ramp = curve.t_ms[curve.mb.index(max(curve.mb))] if curve else None
    # the kernel's high-water mark is recorded; where it has none, the curve's highest reading
    # stands in: computed from recorded readings, and it can miss a spike between two of them
    peak = Measure(round(m.peak_bytes / MB, 3), "recorded" if m.peak_from == "kernel" else "derived")
    profile = Profile(peak_mb=peak,
                      ramp_ms=rec(min(ramp, result.latency_ms)) if ramp is not None else None,
                      cpu_ms=rec(m.cpu_usec / 1000.0) if m.cpu_usec is not None else None,   # None: cpu.stat not read
                      io_bytes=rec(m.io_bytes) if io and m.io_bytes is not None else None, curve=curve)
    # what it printed here, beside what its source printed: the faithfulness rule's output check
    output = result.output[:OUTPUT_KEPT] if step.recorded_output is not None and result.output is not None else None
    return replace(step, duration_ms=rec(result.latency_ms), profile=profile, outcome=outcome, original=original,
                   output=output)


def step_time_base(samples: list[tuple[float, int]], window_ms: float, duration_ms: float) -> list[tuple[float, int]]:
    """The readings (ms after the sampling window opened) on the step's own time base: 0 at its spawn,
    `duration_ms` at its reaping. The window opens before the spawn (the cgroup is made, the process
    joins it) and closes right after the reaping (a cgroup read or two, well under a millisecond), so
    the spawn is the window's end less the step's wall time. The last reading before the spawn (the
    baseline) is kept at 0, the first after the reaping at `duration_ms`, the others dropped."""
    shift = max(0.0, window_ms - duration_ms)
    moved = [(t - shift, v) for t, v in samples]
    return ([(0.0, v) for t, v in moved if t <= 0][-1:] + [(t, v) for t, v in moved if 0 < t < duration_ms]
            + [(duration_ms, v) for t, v in moved if t >= duration_ms][:1])


def to_curve(samples: list[tuple[float, int]], end_ms: float | None = None) -> Curve | None:
    """The readings as a Curve in MiB (times to 0.1 ms, none past `end_ms`); a run of equal readings
    keeps its first and last point only (the curve is the same, the file smaller)."""
    cap = (lambda t: min(t, end_ms)) if end_ms is not None else (lambda t: t)
    pts = [(cap(round(t, 1)), round(v / MB, 3)) for t, v in samples]
    if not pts:
        return None
    kept = [p for i, p in enumerate(pts)
            if i in (0, len(pts) - 1) or p[1] != pts[i - 1][1] or p[1] != pts[i + 1][1]]
    return Curve(tuple(t for t, _ in kept), tuple(mb for _, mb in kept), "recorded")


def _provenance(tree: RunTree, settings: Settings, measured: list[tuple[int, StepMeasure]], executor,
                memory_fs: str | None, provided: Provided | None) -> dict:
    measures = [m for _, m in measured]
    rates = [r for m in measures if (r := m.sample_hz) is not None]
    from_curve = [i for i, m in measured if m.peak_from != "kernel"]
    out = {"by": "agentcgroup traces profile", "command": settings.command,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "machine": {"hostname": platform.node(), "kernel": platform.release(), "cgroups": tree.host.mode,
                       "cpus": os.cpu_count(), "profiler_python": platform.python_version(),
                       "step_cpus": list(settings.step_cpus or sorted(os.sched_getaffinity(0))),
                       "steps_python3": _steps_python(settings.executor, provided)},
           "executor": settings.executor, "image": getattr(executor, "image", None),
           "workspace": provided.name if provided is not None else None,
           "step_memory_max_mb": settings.memory_max_mb, "step_pids_max": settings.pids_max,
           "step_timeout_s": settings.step_timeout_s, "sample_period_ms": settings.period_s * 1000.0,
           "sample_hz": {"min": round(min(rates), 1), "median": round(statistics.median(rates), 1)} if rates else None,
           "peak": ("no step measured" if not measures else "kernel (recorded)" if not from_curve else
                    "the kernel's (recorded) where it has one; the curve's highest reading (derived) for the "
                    "steps in peak_from_curve: this kernel has no memory.peak (cgroup v2 before 5.19)"),
           "steps_profiled": len(measures), "complete": True}
    if from_curve:
        out["peak_from_curve"] = from_curve
    if memory_fs is not None:
        out["io_bytes"] = (f"not recorded: the workspace is a {memory_fs} (memory), and io.stat counts block IO "
                           "only, so the steps' file writes would read as 0")
    elif any(m.io_bytes is None for m in measures):
        out["io_bytes"] = "not measured: no per-cgroup IO count for the step's cgroup on this host"
    elif measures:
        out["io_bytes"] = "block IO only (io.stat rbytes + wbytes): writes to a tmpfs (/tmp) are not in it"
    return out


def _steps_python(executor: str, provided: Provided | None = None) -> str:
    """The python3 the steps ran: the sandbox binds the host's /usr (or the workspace's system
    root's, workspaces/roots.py) and looks in /usr/local/bin:/usr/bin:/bin; under docker it is the
    image's (named by `image`)."""
    if executor != "sandbox":
        return "the image's python3"
    root = provided.seed.system if provided is not None and provided.seed is not None else None
    path = "/usr/bin/python3" if root is not None else which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if path is None:
        return "none on the sandbox's PATH"
    argv = [path, "-c", "import platform; print(platform.python_version())"]
    try:
        done = subprocess.run(run_in(root, argv) if root is not None else argv,
                              capture_output=True, text=True, timeout=30)
    except WorkspaceError as exc:
        return f"{path} of {root} (its version unreadable: {exc})"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{path} (its version unreadable: {exc})"
    where = f" (the workspace's {root.parent.name} root)" if root is not None else ""
    return f"{path} {done.stdout.strip()}{where}" if done.returncode == 0 else f"{path}{where} (its version unreadable)"


def workspace_on_memory_fs(executor) -> str | None:
    """The file system type of the trace's working directory when it keeps files in memory (tmpfs,
    ramfs), else None: the sandbox's bounded workspace and the local docker image's are tmpfs."""
    if getattr(executor, "init_pid", None):                      # docker: the container's view
        mountinfo, path = f"/proc/{executor.init_pid}/mountinfo", executor.home
    elif getattr(executor, "workspace", None):
        mountinfo, path = "/proc/self/mountinfo", os.path.realpath(executor.workspace)
    else:
        return None
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    best, fstype = "", None
    for line in lines:                  # "id parent maj:min root mountpoint opts ... - fstype source ..."
        fields, _, rest = line.partition(" - ")
        mnt = fields.split()[4].replace("\\040", " ")
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
            best, fstype = mnt, rest.split()[0]
    return fstype if fstype in ("tmpfs", "ramfs") else None


def _workspace(trace: Trace, executor, settings: Settings, corpus: Path) -> Provided | None:
    """The workspace `trace`'s steps start from (workspaces/provide.py: --workspace's directory, the
    task's image or its locked PyPI workspace, built now if need be), or None; a ProfileError saying
    what is missing for a trace whose task has none."""
    try:
        got = provide(trace, executor=settings.executor, corpus=corpus,
                      directory=settings.workspace if settings.workspace in (None, EMPTY) else
                      str(Path(settings.workspace).absolute()),
                      image=getattr(executor, "image", None), option="--workspace")
    except WorkspaceError as exc:
        raise ProfileError(str(exc)) from None
    return got
