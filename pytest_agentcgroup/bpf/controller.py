"""The dynamic `agentcgroup` arm: an event-driven controller, and its `bpf_soft` control arm.

Rules are data (TOML or a dict), e.g.

    [agentcgroup]
    ebpf = true                  # false = the `bpf_soft` control arm: same soft limits, no eBPF
    memory_high_mb = 384         # soft limit put on every step (v2 memory.high, v1 soft limit)
    memory_max_mb = 512          # hard limit
    hold_ms = 200                # a throttled (SIGSTOPped) step is resumed after this long
    freeze_after = 3             # the Nth throttle of one step within `window_ms` freezes it instead
    freeze_hold_ms = 1000        # a frozen step is thawed after this long
    kill_after = 2               # the Nth freeze of one step kills it (cgroup.kill)
    window_ms = 5000
    raise_step_mb = 64           # reclaim in a step that may grow raises its soft limit by this...
    raise_max_mb = 256           # ...up to this much above memory_high_mb
    [agentcgroup.priorities]     # step kind -> low | normal | high; "default" for the rest
    test = "low"
    install = "low"
    edit = "high"
    default = "normal"

What happens, top to bottom (see `Controller.handle` and `Controller.tick`):

  1. add_step(cg, kind): the soft/hard limits go on the step's cgroup; its v2 id is registered with
     bpf/reclaim_throttle.bpf.c — low priority in "stop" mode (the kernel SIGSTOPs the allocating
     process at the first memcg reclaim), normal/high priority in "notify" mode.
  2. The kernel posts one ring-buffer event per pressure episode (a mark fires once, then disarms).
  3. handle(event):
       low priority   -> it is already stopped; count a strike; the Nth strike in the window
                         escalates to freeze (cgroup.freeze=1), the Mth freeze to cgroup.kill.
                         A resume (SIGCONT or thaw, then re-arm) is scheduled after the hold time.
       normal / high  -> high priority may grow: raise its soft limit by raise_step_mb (bounded).
                         Then re-arm.
  4. tick(): due resumes run.
With ebpf = false nothing is loaded: steps get the same limits and the controller does nothing,
so a difference between the two arms is the eBPF policy's doing.

External loaders: bcc cannot attach struct_ops programs (sched_ext schedulers, memcg_bpf_ops).
Where the kernel has them (see features.probe()), `external_loader = ["/path/to/scx_foo", ...]`
in the rules runs that program for the arm's lifetime (ExternalLoader); this host has neither.
"""
from __future__ import annotations

import heapq
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

from ..cgroups.node import MB, Cgroup

PRIORITIES = ("low", "normal", "high")


@dataclass(frozen=True)
class Rules:
    ebpf: bool = True
    memory_high_mb: float | None = None
    memory_max_mb: float | None = None
    hold_ms: float = 200
    freeze_after: int = 3
    freeze_hold_ms: float = 1000
    kill_after: int = 2
    window_ms: float = 5000
    raise_step_mb: float = 0
    raise_max_mb: float = 0
    priorities: dict = field(default_factory=lambda: {"default": "normal"})
    external_loader: tuple = ()

    @classmethod
    def from_dict(cls, raw: dict) -> "Rules":
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"agentcgroup rules: unknown key(s) {', '.join(sorted(unknown))}")
        pri = dict(raw.get("priorities", {"default": "normal"}))
        bad = {k: v for k, v in pri.items() if v not in PRIORITIES}
        if bad:
            raise ValueError(f"agentcgroup rules: priorities must be one of {PRIORITIES}: {bad}")
        return cls(**{**raw, "priorities": pri, "external_loader": tuple(raw.get("external_loader", ()))})

    def priority(self, kind: str | None) -> str:
        return self.priorities.get(kind or "", self.priorities.get("default", "normal"))


@dataclass
class Action:
    ts_ns: int
    cgroup_id: int
    what: str            # throttle | resume | freeze | thaw | kill | raise
    detail: str = ""


@dataclass
class _Step:
    cg: Cgroup
    kind: str | None
    priority: str
    soft_bytes: int | None
    strikes: list = field(default_factory=list)     # ts_ns of throttles in the window
    freezes: int = 0
    frozen: bool = False
    stopped_pid: int | None = None


class Controller:
    def __init__(self, rules: Rules):
        self.rules = rules
        self.steps: dict[int, _Step] = {}
        self.actions: list[Action] = []
        self._due: list[tuple[int, int, str]] = []   # (when_ns, cgroup_id, what) heap
        self.throttle = None
        self._external = ExternalLoader(rules.external_loader) if rules.external_loader else None
        if rules.ebpf:
            from .throttle import ReclaimThrottle
            self.throttle = ReclaimThrottle()

    # -- steps -----------------------------------------------------------------------------------
    def add_step(self, cg: Cgroup, kind: str | None = None) -> None:
        r = self.rules
        if r.memory_max_mb is not None:
            cg.set_memory_max(int(r.memory_max_mb * MB))
        soft = int(r.memory_high_mb * MB) if r.memory_high_mb is not None else None
        if soft is not None:
            cg.set_memory_high(soft)
        step = _Step(cg, kind, r.priority(kind), soft)
        self.steps[cg.id] = step
        if self.throttle is not None:
            self.throttle.mark(cg.id, "stop" if step.priority == "low" else "notify")

    def remove_step(self, cg: Cgroup) -> None:
        step = self.steps.pop(cg.id, None)
        if self.throttle is not None:
            self.throttle.unmark(cg.id)
        if step is not None:
            self._resume(step, log=False)

    # -- the loop --------------------------------------------------------------------------------
    def run_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll(timeout_ms=20)

    def poll(self, timeout_ms: int = 0) -> None:
        if self.throttle is not None:
            for ev in self.throttle.poll(timeout_ms):
                self.handle(ev)
        elif timeout_ms:
            time.sleep(timeout_ms / 1000)
        self.tick()

    def handle(self, ev) -> None:
        step = self.steps.get(ev.cgroup_id)
        if step is None:
            return
        r, now = self.rules, time.monotonic_ns()
        if step.priority == "low":                          # the kernel has already stopped it
            step.stopped_pid = ev.pid
            self._log(step, "throttle", f"pid {ev.pid} stopped in-kernel "
                      f"{(ev.action_ns - ev.trigger_ns) / 1e3:.0f} us after reclaim began")
            step.strikes = [t for t in step.strikes if now - t < r.window_ms * 1e6] + [now]
            if len(step.strikes) >= r.freeze_after:
                step.strikes = []
                step.freezes += 1
                if step.freezes >= r.kill_after:
                    self._log(step, "kill", f"{step.freezes} freezes")
                    step.cg.kill()
                    return
                self._freeze(step)
                self._schedule(now + int(r.freeze_hold_ms * 1e6), step, "thaw")
            else:
                self._schedule(now + int(r.hold_ms * 1e6), step, "resume")
            return
        if step.priority == "high" and r.raise_step_mb and step.soft_bytes is not None:
            base = int(r.memory_high_mb * MB)
            new = min(step.soft_bytes + int(r.raise_step_mb * MB), base + int(r.raise_max_mb * MB))
            if new > step.soft_bytes:
                step.soft_bytes = new
                _raise_soft_limit(step.cg, new)
                self._log(step, "raise", f"soft limit -> {new // MB} MB")
        self.throttle.rearm(ev.cgroup_id)

    def tick(self) -> None:
        now = time.monotonic_ns()
        while self._due and self._due[0][0] <= now:
            _, cg_id, what = heapq.heappop(self._due)
            step = self.steps.get(cg_id)
            if step is not None:
                self._resume(step)

    # -- actuators -------------------------------------------------------------------------------
    def _freeze(self, step: _Step) -> None:
        (step.cg.unified / "cgroup.freeze").write_text("1")
        step.frozen = True
        self._log(step, "freeze")
        self._cont(step)            # stays frozen; thawing later lets it run

    def _resume(self, step: _Step, *, log: bool = True) -> None:
        if step.frozen:
            try:
                (step.cg.unified / "cgroup.freeze").write_text("0")
            except OSError:
                pass
            step.frozen = False
            log and self._log(step, "thaw")
        if step.stopped_pid is not None:
            self._cont(step)
            log and self._log(step, "resume")
        if self.throttle is not None and step.cg.id in self.steps:
            self.throttle.rearm(step.cg.id)

    def _cont(self, step: _Step) -> None:
        if step.stopped_pid is not None:
            try:
                os.kill(step.stopped_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            step.stopped_pid = None

    def _schedule(self, when_ns: int, step: _Step, what: str) -> None:
        heapq.heappush(self._due, (when_ns, step.cg.id, what))

    def _log(self, step: _Step, what: str, detail: str = "") -> None:
        self.actions.append(Action(time.monotonic_ns(), step.cg.id, what, detail))

    # -- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        try:
            for step in list(self.steps.values()):
                self._resume(step, log=False)
        finally:
            if self.throttle is not None:
                self.throttle.close()
            if self._external is not None:
                self._external.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _raise_soft_limit(cg: Cgroup, nbytes: int) -> None:
    # v1: write the soft limit directly; Cgroup.set_memory_high would register another threshold
    # eventfd each time (and drop the previous one).
    if cg.host.mode == "v2":
        (cg.unified / "memory.high").write_text(str(nbytes))
    else:
        (cg.paths["memory"] / "memory.soft_limit_in_bytes").write_text(str(nbytes))


class ExternalLoader:
    """Runs an external BPF loader (an scx_* scheduler, a memcg struct_ops loader) for the arm's
    lifetime: bcc cannot attach struct_ops. Stopped with SIGINT (their clean-detach path), then
    SIGKILL; struct_ops links die with their process, so nothing stays attached."""

    def __init__(self, argv):
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
