"""`agentcgroup traces profile -n N`: N worker processes profile the traces side by side, each on
its own slice of the CPUs and 1/N of the memory (cgroups/isolate.py, as xdist workers get under
--agentcgroup-isolate), so that concurrent steps do not take each other's CPU time.

Roles: the parent hands out traces one at a time from a queue (most steps first, so the last ones
to finish are short), turns the workers' events into the progress bar and the manifest (one writer),
and stops them all on the first error or on ^C/SIGTERM; a worker (_work) owns a run tree, its
isolation and, for docker, its handle on the shared engine (the parent keeps one open so the
engine outlives any single worker), profiles (run.profile_one, handed in) and writes each trace whole
(output.write_profiled), so that a run stopped anywhere resumes like a serial one.
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue as queues
import signal
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Callable

from ..cgroups.host import CgroupUnavailable, detect
from ..cgroups.isolate import WorkerIsolation, cpu_slice
from ..cgroups.tree import RunTree
from ..errors import ExecutorUnavailable
from ..traces.ir import Trace, read_traces
from ..workspaces.lock import WorkspaceError
from . import ProfileError
from .output import add_to_manifest, step_line, write_profiled
from .meter import peak_rss_mib

#: how often the parent looks at its workers while no event comes (a worker killed says nothing)
POLL_S = 1.0
PR_SET_PDEATHSIG = 1
MB = 1024 * 1024


def profile_parallel(todo: list[tuple[Trace, Path]], corpus_of: dict[str, Path], out: Path, settings, workers: int,
                     controllers: tuple[str, ...], profile_one: Callable, *, progress: Callable[[str], None],
                     advance: Callable[[int, int], None]) -> tuple[list[str], float]:
    """Profile `todo` ((trace, output path) pairs) with `workers` processes: the trace ids written,
    in the order they ended, and the largest worker's peak RSS (MiB). Raises ProfileError for the
    first worker that could not go on, or one that ended before saying it was done. Every trace a
    worker wrote is in the manifest, however the run ended."""
    check_workers(workers)
    ctx = mp.get_context("spawn")                    # no fork of a process that may hold threads (docker SDK)
    jobs, events = ctx.Queue(), ctx.Queue()
    jobs.cancel_join_thread()                        # jobs never taken must not hold this process at exit
    for index in sorted(range(len(todo)), key=lambda k: -len(todo[k][0].steps)):
        jobs.put(index)
    for _ in range(workers):
        jobs.put(None)
    total = sum(len(t.steps) for t, _ in todo)
    state = {"stepped": 0, "done": [], "failure": None, "rss": 0.0, "running": set(range(workers))}

    def take(event) -> None:
        kind, i, *rest = event
        if kind == "step":
            state["stepped"] += 1
            advance(state["stepped"], total)
            progress(f"[worker {i}] {rest[0]}")
        elif kind == "done":
            trace_id, dst = rest
            add_to_manifest(out, [(next(iter(read_traces(Path(dst)))), Path(dst))], settings.subset)
            state["done"].append(trace_id)
        elif kind == "error":
            state["failure"] = state["failure"] or rest[0]
        elif kind == "exit":
            state["running"].discard(i)
            state["rss"] = max(state["rss"], rest[0])

    def drain() -> None:
        while True:
            try:
                take(events.get_nowait())
            except queues.Empty:
                return

    engine, procs = None, []
    try:
        if settings.executor == "docker":            # started once here, shared by the workers
            from ..engines.docker import DockerEngine
            engine = DockerEngine.acquire()
        procs = [ctx.Process(target=_work, name=f"profile-worker-{i}", daemon=True,
                             args=(i, workers, todo, corpus_of, settings, controllers, profile_one, jobs, events))
                 for i in range(workers)]
        advance(0, total)
        for proc in procs:
            proc.start()
        while state["running"] and state["failure"] is None:
            try:
                take(events.get(timeout=POLL_S))
                continue
            except queues.Empty:
                pass
            for i in sorted(state["running"]):
                if procs[i].exitcode is not None:
                    drain()                          # its last words may still be in the pipe
                    if i in state["running"]:        # none of them was "exit": killed, or crashed
                        state["running"].discard(i)
                        state["failure"] = state["failure"] or (
                            f"profile worker {i} ended (exit code {procs[i].exitcode}) before it had finished "
                            "its traces")
    finally:
        _stop(procs, drain)
        drain()                                      # the traces written before the stop: listed
        if engine is not None:
            engine.release()
    if state["failure"] is None:
        missing = [t.trace_id for t, _ in todo if t.trace_id not in state["done"]]
        if missing:
            state["failure"] = f"{len(missing)} trace(s) were not profiled: {', '.join(missing[:5])}"
    if state["failure"] is not None:
        raise ProfileError(state["failure"])
    return state["done"], state["rss"]


def check_workers(workers: int) -> None:
    """-n larger than the CPUs this process may use: one message, before anything starts."""
    try:
        cpu_slice(workers - 1, workers)
    except CgroupUnavailable as exc:
        raise ProfileError(f"-n {workers}: {exc}") from None


def _stop(procs, drain: Callable[[], None]) -> None:
    """SIGTERM to the workers still running (each then removes its step, cgroups and container, as on
    ^C), up to 30 s to do so while their events are read (a full pipe would hold them), then SIGKILL."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + 30
    while any(proc.is_alive() for proc in procs) and time.monotonic() < deadline:
        drain()
        time.sleep(0.1)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join()


def _work(index: int, count: int, todo, corpus_of, settings, controllers, profile_one, jobs, events) -> None:
    # A process group of its own: ^C and a group's SIGTERM (timeout, a cancelled CI job) reach the
    # parent alone, which stops the workers once each; the steps keep the default dispositions.
    def terminated(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # once: a second one must not cut the cleanup short
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, terminated)
    tree = isolation = engine = None
    try:
        os.setpgrp()
        _die_with_parent()
        # a stop while the run root is being made would leave it behind: held until both are named
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            tree = RunTree(detect(), controllers=controllers)
            isolation = WorkerIsolation(tree, index, count)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        if isolation.memory_bytes < settings.memory_max_mb * MB:
            raise ProfileError(f"its share of the memory ({isolation.memory_bytes // MB} MiB, 1/{count} of what this "
                               f"command may use) is below --memory-max-mb {settings.memory_max_mb}: a step could "
                               "be OOM-killed here and not in a serial run; use fewer workers or a lower limit")
        settings = replace(settings, step_cpus=tuple(isolation.cpus))
        if settings.executor == "docker":
            from ..engines.docker import DockerEngine
            engine = DockerEngine.acquire(join=isolation.outside)
        while (job := jobs.get()) is not None:
            trace, dst = todo[job]
            def on_step(k, n, step, trace=trace):
                events.put(("step", index, step_line(trace.trace_id, k, n, step)))
            write_profiled(profile_one(trace, tree, engine, settings, on_step, corpus_of[trace.trace_id]), dst)
            events.put(("done", index, trace.trace_id, str(dst)))
    except KeyboardInterrupt:
        return
    except (ProfileError, CgroupUnavailable, ExecutorUnavailable, WorkspaceError) as exc:
        events.put(("error", index, f"worker {index} (CPUs {_cpus(isolation)}): {exc}"))
        return
    except Exception as exc:                         # the Docker engine's refusals, or a bug: its last words
        where = traceback.extract_tb(exc.__traceback__)[-1]
        events.put(("error", index, f"worker {index}: {type(exc).__name__}: {exc} "
                                    f"({Path(where.filename).name}:{where.lineno})"))
        return
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)    # the parent's stop must not cut the cleanup short
        for close in (engine and engine.release, isolation and isolation.close, tree and tree.close):
            if close:
                try:
                    close()
                except Exception:
                    pass
    events.put(("exit", index, peak_rss_mib()))


def _die_with_parent() -> None:
    """SIGTERM to this worker when the parent dies (even SIGKILLed): nobody would list its traces."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):            # not Linux's libc: the parent's own stop still applies
        pass
    if os.getppid() == 1:                        # the parent died before the call
        raise KeyboardInterrupt


def _cpus(isolation) -> str:
    return ",".join(map(str, isolation.cpus)) if isolation is not None else "not yet isolated"
