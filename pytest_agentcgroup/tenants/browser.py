"""The browser tenant: replays converted Playwright traces (tool `browser`) in real chromium.

Why not an executor (`make_executor("browser")`): an executor turns each step into its own
process, started in the step's cgroup and reaped at the step's end. A browser agent's tool calls
are not processes: they are actions inside one long-lived browser whose state (pages, cookies,
history) carries from step to step, and restarting chromium per step would measure chromium's
start-up, not the action. So the browser tenant is a runner of its own: one process
(browser_driver.py: the web app, Playwright, chromium) per tenant, started *inside the tenant's
cgroup* (joined before exec, so Playwright's node driver and every chromium process inherit it),
replaying steps in lockstep with this side, which reads the tenant cgroup's counters between steps.

    tenant = BrowserTenant(action_timeout_s=30)
    results = tenant.replay([trace], place=cgroup, rounds=1, on_step=print)

`place` is anything with `join_files()`, `counters()` (peak_bytes, cpu_usec, oom_kills),
`usage_bytes()`, `kill()` and `pids()` — a `cgroups.Cgroup` is one; replay does not import cgroups. Without
a place the browser runs where the caller runs and no tenant counters are read.

Per step (StepResult): latency_ms = the action's wall time in the driver; measures.page_load_ms =
Navigation Timing loadEventEnd of a navigation the step caused (None when it caused none);
measures.tenant_mem_mb = the tenant's memory usage after the step; counters.cpu_usec = the
tenant's CPU time during the step (all its processes); counters.peak_bytes = the tenant's peak so
far; counters.oom_kills = the kernel's OOM kills in the tenant during the step.
"""
from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable, Protocol

from ..errors import ExecutorUnavailable
from ..proc import start
from ..replay.replayer import StepResult
from ..traces.ir import Trace

#: Debian's chromium, a system package: nothing is downloaded at run time (Playwright's own builds would be).
CHROMIUM = os.environ.get("AGENTCGROUP_CHROMIUM", "/usr/bin/chromium")
#: Flags that work headless as root in a container-less host, plus a dead proxy (port 9, discard)
#: so that nothing but loopback (which bypasses proxies) is reachable from a replayed page.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                 "--proxy-server=http://127.0.0.1:9"]
_MB = 1024 * 1024


class TenantPlace(Protocol):
    def join_files(self) -> list[str]: ...
    def counters(self): ...            # .peak_bytes, .cpu_usec, .oom_kills
    def usage_bytes(self) -> int: ...
    def kill(self) -> None: ...
    def pids(self) -> list[int]: ...


def missing(chromium: str = CHROMIUM) -> str | None:
    """What the browser tenant lacks on this host, or None. Names the exact piece missing."""
    lacks = []
    if not os.access(chromium, os.X_OK):
        lacks.append(f"chromium at {chromium} (Debian package chromium; `make setup` installs it, "
                     "or set AGENTCGROUP_CHROMIUM)")
    if importlib.util.find_spec("playwright") is None:
        lacks.append("the Python package playwright (pip extra `browser`; `make setup` installs it)")
    return "the browser tenant needs " + " and ".join(lacks) if lacks else None


def _trace_job(trace: Trace, record: str | None = None) -> dict:
    return {"trace_id": trace.trace_id, "record": record,
            "steps": [{"step_id": s.step_id, "native_tool": s.native_tool, "args": s.args}
                      for s in trace.steps if s.tool == "browser"]}


class BrowserTenant:
    name = "browser"

    def __init__(self, *, action_timeout_s: float = 30.0, chromium: str = CHROMIUM):
        why = missing(chromium)
        if why:
            raise ExecutorUnavailable(why)
        self.chromium = chromium
        self.action_timeout_s = action_timeout_s
        self.launch_ms: float | None = None
        self.error: str | None = None     # why the last replay ended early, if it did
        self.stderr = ""                 # the driver's stderr, kept for error messages

    def replay(self, traces: Iterable[Trace], place: TenantPlace | None = None, *, rounds: int = 1,
               on_step: Callable[[StepResult], None] | None = None,
               record: dict[str, str] | None = None) -> list[StepResult]:
        """Replay `traces` (each in a fresh browser context), `rounds` times over, in one chromium.
        `record` maps trace ids to trace.zip paths to write with Playwright's tracing."""
        traces = list(traces)
        job = {"traces": [_trace_job(t, (record or {}).get(t.trace_id)) for t in traces], "rounds": rounds,
               "action_timeout_ms": self.action_timeout_s * 1000, "chromium": self.chromium, "args": CHROMIUM_ARGS}
        steps = {(t.trace_id, s.step_id): s for t in traces for s in t.steps if s.tool == "browser"}
        order = [(t.trace_id, s.step_id) for _ in range(rounds) for t in traces for s in t.steps if s.tool == "browser"]
        self.error = None
        results: list[StepResult] = []
        errlog = tempfile.TemporaryFile(mode="w+")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        proc = start([sys.executable, "-m", "pytest_agentcgroup.tenants.browser_driver"],
                     join=place.join_files() if place else (), env=env, stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=errlog)
        lines = _Lines(proc.stdout)
        try:
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.flush()
            # The first reply waits for chromium to start, which can take a while on a loaded host.
            msg = self._read(proc, lines, 60.0 + self.action_timeout_s)
            if msg.get("event") == "ready":
                self.launch_ms = msg["launch_ms"]
                before = self._sample(place)
                for key in order:
                    msg = self._read(proc, lines, self.action_timeout_s * 2 + 10.0)
                    if msg.get("event") not in ("step", "fatal") or (msg.get("trace_id"), msg.get("step_id")) != key:
                        break
                    after = self._sample(place)
                    results.append(self._result(msg, steps[key], before, after))
                    if on_step:
                        on_step(results[-1])
                    before = after
                    if msg["event"] == "fatal":
                        break
                    try:
                        proc.stdin.write(b"go\n")
                        proc.stdin.flush()
                    except BrokenPipeError:
                        pass                     # the driver died: the next read says how
                else:
                    msg = self._read(proc, lines, 30.0)
            if msg.get("event") != "done":
                # The browser died (or never started): the steps it did not reach are recorded as
                # not executed, with the reason, so no step goes missing from the results.
                self.error = self._failure(msg, errlog)
                for key in order[len(results):]:
                    results.append(self._result({"trace_id": key[0], "step_id": key[1], "executed": False,
                                                 "error": self.error}, steps[key], None, None))
                    if on_step:
                        on_step(results[-1])
        finally:
            self._stop(proc, place)
            errlog.seek(0)
            self.stderr = errlog.read()[-4000:]
            errlog.close()
        return results

    @staticmethod
    def _read(proc: subprocess.Popen, lines: "_Lines", timeout_s: float) -> dict:
        line = lines.next(timeout_s)
        if line is None:
            return {"event": "timeout", "error": f"no reply from the browser driver within {timeout_s:.0f} s"}
        if not line:
            return {"event": "exit", "error": f"the browser driver exited ({proc.wait()})"}
        try:
            return json.loads(line)
        except ValueError:
            return {"event": "garbage", "error": f"unexpected output from the browser driver: {line[:200]!r}"}

    @staticmethod
    def _failure(msg: dict, errlog) -> str:
        if msg.get("event") == "fatal":           # the driver said what went wrong
            return f"the browser died: {msg.get('error')}"
        errlog.seek(0)
        tail = [ln for ln in errlog.read().strip().splitlines() if ln.strip()][-1:]
        return f"the browser driver stopped: {msg.get('error') or msg}" + (f" ({tail[0].strip()[:300]})" if tail else "")

    @staticmethod
    def _sample(place: TenantPlace | None) -> dict | None:
        if place is None:
            return None
        c = place.counters()
        return {"cpu_usec": c.cpu_usec, "peak_bytes": c.peak_bytes, "oom_kills": c.oom_kills,
                "usage_bytes": place.usage_bytes()}

    @staticmethod
    def _result(msg: dict, step, before: dict | None, after: dict | None) -> StepResult:
        args = step.args
        cmd = " ".join(x for x in (args.get("method") or step.native_tool, args.get("selector") or args.get("url")) if x)
        counters, measures = {}, {}
        if msg.get("page_load_ms") is not None:
            measures["page_load_ms"] = msg["page_load_ms"]
        if before is not None and after is not None:
            cpu = None if None in (after["cpu_usec"], before["cpu_usec"]) else after["cpu_usec"] - before["cpu_usec"]
            counters = {"cpu_usec": cpu, "peak_bytes": after["peak_bytes"],
                        "oom_kills": after["oom_kills"] - before["oom_kills"]}
            measures["tenant_mem_mb"] = round(after["usage_bytes"] / _MB, 3)
        return StepResult(trace_id=msg["trace_id"], step_id=msg["step_id"], tool="browser", cmd=cmd,
                          executed=bool(msg["executed"]), latency_ms=msg.get("latency_ms"),
                          exit_code=(0 if msg.get("ok") else 1) if msg["executed"] else None, signal=None,
                          timed_out=False, profile_source="none", counters=counters, error=msg.get("error"),
                          measures=measures)

    @staticmethod
    def _stop(proc: subprocess.Popen, place: TenantPlace | None) -> None:
        """Nothing of the tenant outlives the replay: close stdin (the driver exits), then kill."""
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if place is not None:
            place.kill()            # chromium children that outlived the driver, if any
            deadline = time.monotonic() + 10.0
            while place.pids() and time.monotonic() < deadline:    # killed processes take a moment to go
                time.sleep(0.01)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        proc.wait()
        proc.stdout.close()


class _Lines:
    """The driver's stdout a line at a time, read with select + os.read on the pipe itself: two
    lines that arrive together must not wait in a file object's buffer, where select cannot see
    the second one."""

    def __init__(self, pipe):
        self.fd, self.buf = pipe.fileno(), b""

    def next(self, timeout_s: float) -> bytes | None:
        """The next line (b"" at end of output), or None when none came within timeout_s."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                line, self.buf = self.buf, b""
                return line
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"
