"""`agentcgroup traces profile -n N`: N worker processes profile the traces side by side, each on
its own slice of the CPUs and 1/N of the memory (cgroups/isolate.py, as xdist workers get under
--agentcgroup-isolate), so that concurrent steps do not take each other's CPU time.

Roles: the parent hands out traces one at a time from a queue (longest first, so the last ones to
finish are short), turns the workers' events into the progress bar and the manifest (one writer),
and stops them all on the first error or on ^C/SIGTERM; a worker (_work) owns a run tree, its
isolation and, for docker, its handle on the shared engine (the parent keeps one open so the
engine outlives any single worker), profiles (run.profile_one, handed in) and writes each trace whole
(output.write_profiled), so that a run stopped anywhere resumes like a serial one.
"""
from __future__ import annotations

import multiprocessing as mp
import queue as queues
import signal
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
from .output import add_to_manifest, write_profiled
from .meter import peak_rss_mib

#: how often the parent looks at its workers while no event comes (a worker killed says nothing)
POLL_S = 1.0


def profile_parallel(todo: list[tuple[Trace, Path]], corpus_of: dict[str, Path], out: Path, settings, workers: int,
                     controllers: tuple[str, ...], profile_one: Callable, *, progress: Callable[[str], None],
                     advance: Callable[[int, int], None]) -> tuple[list[str], float]:
    """Profile `todo` ((trace, output path) pairs) with `workers` processes: the trace ids written,
    in the order they ended, and the largest worker's peak RSS (MiB). Raises ProfileError for the
    first worker that could not go on."""
    check_workers(workers)
    ctx = mp.get_context("spawn")                    # no fork of a process that may hold threads (docker SDK)
    jobs, events = ctx.Queue(), ctx.Queue()
    for index in sorted(range(len(todo)), key=lambda k: -len(todo[k][0].steps)):
        jobs.put(index)
    for _ in range(workers):
        jobs.put(None)
    engine = None
    if settings.executor == "docker":                # started once here, shared by the workers
        from ..engines.docker import DockerEngine
        engine = DockerEngine.acquire()
    procs = [ctx.Process(target=_work, name=f"profile-worker-{i}", daemon=True,
                         args=(i, workers, todo, corpus_of, settings, controllers, profile_one, jobs, events))
             for i in range(workers)]
    total, stepped, done, failure, worker_rss = sum(len(t.steps) for t, _ in todo), 0, [], None, 0.0
    advance(0, total)
    try:
        for p in procs:
            p.start()
        running = set(range(workers))
        while running and failure is None:
            try:
                event = events.get(timeout=POLL_S)
            except queues.Empty:
                for i in list(running):
                    code = procs[i].exitcode
                    if code is not None:             # ended without saying so: killed, or crashed in start-up
                        running.discard(i)
                        if code != 0:
                            failure = f"profile worker {i} ended with exit code {code} before its traces were done"
                continue
            kind, i, *rest = event
            if kind == "step":
                stepped += 1
                advance(stepped, total)
                progress(f"[worker {i}] {rest[0]}")
            elif kind == "done":
                trace_id, dst = rest
                add_to_manifest(out, [(next(iter(read_traces(Path(dst)))), Path(dst))], settings.subset)
                done.append(trace_id)
            elif kind == "error":
                failure = rest[0]
            elif kind == "exit":
                running.discard(i)
                worker_rss = max(worker_rss, rest[0])
    finally:
        _stop(procs)
        if engine is not None:
            engine.release()
    if failure is not None:
        raise ProfileError(failure)
    return done, worker_rss


def check_workers(workers: int) -> None:
    """-n larger than the CPUs this process may use: one message, before anything starts."""
    try:
        cpu_slice(workers - 1, workers)
    except CgroupUnavailable as exc:
        raise ProfileError(f"-n {workers}: {exc}") from None


def _stop(procs) -> None:
    """SIGTERM to the workers still running (each then removes its step, cgroups and container, as on
    ^C), a moment to do so, then SIGKILL."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join()


def _work(index: int, count: int, todo, corpus_of, settings, controllers, profile_one, jobs, events) -> None:
    def terminated(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # ^C reaches the parent, which stops the workers
    tree = isolation = engine = None
    try:
        tree = RunTree(detect(), controllers=controllers)
        isolation = WorkerIsolation(tree, index, count)
        settings = replace(settings, step_cpus=tuple(isolation.cpus))
        if settings.executor == "docker":
            from ..engines.docker import DockerEngine
            engine = DockerEngine.acquire(join=isolation.outside)
        while (job := jobs.get()) is not None:
            trace, dst = todo[job]
            def on_step(k, n, step, trace=trace):
                status = step.outcome.status if step.outcome else "not a command"
                secs = f" {step.duration_ms.value / 1000:.1f} s" if step.outcome and step.duration_ms else ""
                events.put(("step", index, f"{trace.trace_id}: step {k}/{n} {status}{secs}"))
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
        for close in (engine and engine.release, isolation and isolation.close, tree and tree.close):
            if close:
                try:
                    close()
                except Exception:
                    pass
    events.put(("exit", index, peak_rss_mib()))


def _cpus(isolation) -> str:
    return ",".join(map(str, isolation.cpus)) if isolation is not None else "not yet isolated"
