"""The dynamic `agentcgroup` arm: an event-driven controller, and its `bpf-soft` control arm.

Rules are data (arms.py Rules checks them): an arm's `rules` table in experiments/agentcgroup.toml
(the arm's own memory_high_mb / memory_max_mb are the limits), or a dict:

    [arms.agentcgroup]
    policy = "agentcgroup"
    memory_high_mb = 512         # soft limit put on every step (v2 memory.high; v1: see below)
    memory_max_mb = 2048         # hard ceiling
    [arms.agentcgroup.rules]
    ebpf = true                  # false = the `bpf-soft` control arm: same limits, no eBPF, no actions
    hold_ms = 200                # a throttled (SIGSTOPped) step is resumed after this long
    freeze_after = 3             # the Nth throttle of one step within `window_ms` freezes it instead
    freeze_hold_ms = 1000        # a frozen step is thawed after this long
    kill_after = 2               # the Nth freeze of one step kills it (cgroup.kill); 0 = never
    window_ms = 5000
    raise_step_mb = 64           # each resume of a low step / each reclaim of a high step grants this...
    raise_max_mb = 256           # ...up to this much above memory_high_mb (never above memory_max_mb)
    cpu_weight = { high = 400, normal = 100, low = 25 }   # each step's cpu weight by its priority
    [arms.agentcgroup.rules.priorities]   # step kind -> low | normal | high; "default" for the rest
    test = "low"                 # kinds: traces/classify.py step_kind (test, install, build, vcs,
    install = "low"              # search, fileops, other; or the tool: edit, read, python, ...)
    edit = "high"
    default = "normal"

What happens, top to bottom (see `Controller.handle` and `Controller.tick`):

  One time rule: hold_ms, window_ms and freeze_hold_ms are in the trace's recorded time. A step
  replayed at time_scale s (the emulate executor; real commands run at 1) is held s x hold_ms, so
  the policy acts at the pace of the replay: 100 ms of recorded hold is 5 ms at time_scale 0.05.

  1. add_step(cg, kind, time_scale=s, soft_mb=None): the soft/hard limits (`soft_mb`: the step's
     own soft limit, an arm with limit_from: arms.py; grants then go raise_max_mb above it) and the
     priority's cpu weight (rules `cpu_weight`; the same without eBPF) go on the step's cgroup; its v2 id is registered with
     bpf/reclaim_throttle.bpf.c — low priority in "stop" mode (the kernel SIGSTOPs the allocating
     process at the first memcg reclaim), high priority in "notify" mode (when it may grow),
     normal priority in "record" mode (the kernel only stamps and counts).
     On cgroup v1 memcg reclaim happens only at a hard limit, so a low step's soft limit becomes a
     tripwire: the hard limit is set to the soft limit with the OOM killer disabled
     (memory.oom_control), and the kernel parks the allocating task there instead of killing it.
     Only the controller lifts it, so the bpf-soft arm (no controller) keeps the plain v1 soft limit.
  2. The kernel posts one ring-buffer event per pressure episode (a mark fires once, then disarms).
  3. handle(event):
       low priority   -> it is already stopped: a throttle. The Nth throttle in the window escalates
                         to freeze (cgroup.freeze=1), the Mth freeze to cgroup.kill. A resume is
                         scheduled after the hold time: re-arm, grant raise_step_mb (v1: the tripwire
                         moves up; at the ceiling it becomes the plain hard limit with the OOM killer
                         back on, so the kernel decides from there), thaw / SIGCONT.
       high           -> grant raise_step_mb at once; re-arm while there is room left to grant.
  4. tick(): due resumes run. `start()` runs poll+tick in a thread; `close()` resumes everything.
     Releasing a step (remove_step, close) lifts what could park it: the v1 tripwire, and on v2
     its memory.high (-> "max"; memory.max stays), for every priority: a normal step is only
     observed while governed, but above memory.high the v2 kernel throttles it too.
With ebpf = false nothing is loaded: steps get the same limits and the controller does nothing,
so a difference between the two arms is the eBPF policy's doing.

External loaders: bcc cannot attach struct_ops programs (sched_ext schedulers, memcg_bpf_ops).
Where the kernel has them (see features.probe()), `external_loader = ["/path/to/scx_foo", ...]`
in the rules runs that program for the arm's lifetime (external.py).
"""
from __future__ import annotations

import heapq
import itertools
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..arms import Arm, Rules
from ..cgroups.host import CgroupUnavailable
from ..cgroups.node import MB, Cgroup
from .external import ExternalLoader
from .loader import ClosedOnExit

#: Kernel features an arm with ebpf = true needs (names of features.probe()).
NEEDS = ("root", "bcc", "kernel_headers", "bpf_syscall", "ringbuf", "tracefs", "tp:vmscan/mm_vmscan_memcg_reclaim_begin")
_COUNTS = ("throttles", "freezes", "raises", "policy_kills")


def missing_features(rules: Rules) -> str | None:
    """None when this host can run these rules, else which kernel feature is missing and why."""
    if not rules.ebpf:
        return None
    from . import features
    return features.missing(*NEEDS)


def policy_for(arm: Arm) -> "Controller | None":
    """The controller of a policy arm (None for a static arm). Raises BPFUnavailable when eBPF is
    needed and cannot be loaded; check `missing_features` first for the exact reason."""
    return Controller(Rules.from_arm(arm)) if arm.policy is not None else None


@dataclass
class Action:
    ts_ns: int
    cgroup_id: int
    what: str            # throttle | resume | freeze | thaw | kill | raise | lift | error
    detail: str = ""


@dataclass(eq=False)
class _Step:
    cg: Cgroup
    kind: str | None
    priority: str
    soft_bytes: int | None
    time_scale: float = 1.0                         # the replay's pace: the rules' timers x this
    tripwire: bool = False                          # v1: the hard limit is at soft_bytes, OOM killer off
    strikes: list = field(default_factory=list)     # ts_ns of throttles in the window
    freezes: int = 0
    frozen: bool = False
    stopped_pid: int | None = None
    counts: dict = field(default_factory=lambda: dict.fromkeys(_COUNTS, 0))
    # the cgroup's id, read once while it exists: a resume can fall due after the step's cgroup was
    # removed, and Cgroup.id (a stat) would then raise in the event loop's thread and end it
    cgid: int = 0
    added_ns: int = field(default_factory=time.monotonic_ns)
    grants: list = field(default_factory=list)      # [ms since add_step, soft limit MiB] per raise
    cpu_weight: int | None = None                   # the weight set on the step's cgroup, if any
    cpu_weight_missing: str | None = None           # why the rules' weight for its priority is not set
    start_soft_bytes: int | None = None             # the soft limit it started at: grants go raise_max_mb above


class Controller(ClosedOnExit):
    """Acts on the steps it is given (add_step/remove_step, the StepPolicy of cgroups/placement.py).
    Thread-safe: `start()` runs the event loop in a thread while the caller adds and removes steps."""

    def __init__(self, rules: Rules):
        self.rules = rules
        self.steps: dict[int, _Step] = {}
        self.actions: list[Action] = []
        self._due: list[tuple[int, int, _Step]] = []   # (when_ns, seq, step) heap
        self._seq = itertools.count()
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.throttle = None
        self._external = ExternalLoader(rules.external_loader) if rules.external_loader else None
        if rules.ebpf:
            from .reclaim_throttle import ReclaimThrottle
            try:
                # no sched_switch hook: when the stopped task left the CPU is exp2's question,
                # and that hook would run on every context switch of the host for the session
                self.throttle = ReclaimThrottle(track_stop=False)
            except BaseException:
                if self._external is not None:
                    self._external.close()
                raise

    # -- steps -----------------------------------------------------------------------------------
    def add_step(self, cg: Cgroup, kind: str | None = None, *, time_scale: float = 1.0,
                 soft_mb: float | None = None) -> None:
        """`soft_mb`: this step's own soft limit instead of the rules' (an arm with limit_from: the
        limit computed for the step), granted from, up to raise_max_mb above it and the ceiling."""
        r = self.rules
        ceiling, soft = r.ceiling_bytes, r.soft_bytes if soft_mb is None else int(soft_mb * MB)
        if ceiling is not None and soft is not None:
            soft = min(soft, ceiling)
        if ceiling is not None:
            cg.set_memory_max(ceiling)
        if soft is not None:
            cg.set_memory_high(soft)
        step = _Step(cg, kind, r.priority(kind), soft, time_scale, cgid=cg.id, start_soft_bytes=soft)
        if step.priority in r.cpu_weight:
            try:
                cg.set_cpu_weight(r.cpu_weight[step.priority])
                step.cpu_weight = r.cpu_weight[step.priority]
            except CgroupUnavailable as exc:    # cpu not delegated here, or refused by the kernel:
                step.cpu_weight_missing = str(exc)  # memory policy only, and the record says why
        if self.throttle is not None and step.priority == "low" and soft is not None and cg.host.mode != "v2":
            # v1 reclaims only at a hard limit: without this the kernel would never react below
            # the ceiling. Parked, not killed, at the soft limit until the controller lifts it.
            cg.set_memory_max(soft)
            cg.set_oom_killer(False)
            step.tripwire = True
        with self._lock:
            if self.throttle is not None:      # marked first: a step the kernel side refused is not ours
                mode = {"low": "stop", "high": "notify" if r.raise_step_mb else "record"}.get(step.priority, "record")
                self.throttle.mark(cg.id, mode)
            self.steps[cg.id] = step

    def remove_step(self, cg: Cgroup) -> dict:
        """Stop acting on the step; what the controller did to it (nothing once removed)."""
        with self._lock:
            step = self.steps.pop(cg.id, None)
            if step is None:
                return {}
            if self.throttle is not None:
                self.throttle.unmark(cg.id)
            self._release(step)
            # without eBPF nothing acts on priorities: none is reported
            # grants: the envelope of the step's soft limit over time (metrics/reservation.py)
            return {"kind": step.kind, "priority": step.priority if self.throttle is not None else None,
                    **step.counts, "grants": step.grants, "cpu_weight": step.cpu_weight,
                    **({"cpu_weight_missing": step.cpu_weight_missing} if step.cpu_weight_missing else {})}

    # -- the loop --------------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0) -> None:
        if self.throttle is not None:
            events = self.throttle.poll(timeout_ms)      # not under the lock: it waits
            with self._lock:
                for ev in events:
                    self._guarded(self.handle, ev)
        elif timeout_ms:
            time.sleep(timeout_ms / 1000)
        with self._lock:
            self.tick()

    def handle(self, ev) -> None:
        step = self.steps.get(ev.cgroup_id)
        if step is None:
            return
        r, now, ms = self.rules, time.monotonic_ns(), 1e6 * step.time_scale   # recorded ms -> replay ns
        if step.priority == "low":                          # the kernel has already stopped it
            step.stopped_pid = ev.pid
            step.counts["throttles"] += 1
            self._log(step, "throttle", f"pid {ev.pid} stopped in-kernel "
                      f"{(ev.action_ns - ev.trigger_ns) / 1e3:.0f} us after reclaim began")
            step.strikes = [t for t in step.strikes if now - t < r.window_ms * ms] + [now]
            if len(step.strikes) >= r.freeze_after:
                step.strikes = []
                step.freezes += 1
                if r.kill_after and step.freezes >= r.kill_after:
                    step.counts["policy_kills"] += 1
                    self._log(step, "kill", f"{step.freezes} freezes")
                    step.cg.kill()
                    return
                self._freeze(step)
                self._schedule(now + int(r.freeze_hold_ms * ms), step)
            else:
                self._schedule(now + int(r.hold_ms * ms), step)
            return
        if step.priority == "high" and self._grant(step):
            self.throttle.rearm(ev.cgroup_id)     # listen on only while there is room to grant

    def tick(self) -> None:
        now = time.monotonic_ns()
        while self._due and self._due[0][0] <= now:
            _, _, step = heapq.heappop(self._due)
            if self.steps.get(step.cgid) is step:           # not a removed step (ids are reused)
                self._guarded(self._resume, step)

    # -- actuators -------------------------------------------------------------------------------
    def _resume(self, step: _Step) -> None:
        # re-arm first: on v1 the task wakes as soon as the tripwire moves, and its next reclaim
        # must be seen
        self.throttle.rearm(step.cg.id)
        self._grant(step)
        if step.frozen:
            self._thaw(step)
            self._log(step, "thaw")
        if step.stopped_pid is not None:
            self._cont(step)
            self._log(step, "resume")

    def _grant(self, step: _Step) -> bool:
        """More room for the step: raise_step_mb more soft limit, bounded; on v1 a tripwire that
        cannot move any more becomes the plain hard limit (OOM killer on). True if it got more."""
        r = self.rules
        if step.soft_bytes is None:
            return False
        cap = step.start_soft_bytes + int(r.raise_max_mb * MB)
        ceiling = r.ceiling_bytes
        new = min(step.soft_bytes + int(r.raise_step_mb * MB), cap if ceiling is None else min(cap, ceiling))
        if new > step.soft_bytes:
            step.soft_bytes = new
            step.counts["raises"] += 1
            step.grants.append([(time.monotonic_ns() - step.added_ns) / 1e6, new / MB])
            self._log(step, "raise", f"soft limit -> {new // MB} MB")
            if step.tripwire:
                if ceiling is not None and new >= ceiling:
                    self._lift(step)
                else:
                    step.cg.set_memory_max(new)
            elif step.cg.host.mode == "v2":
                (step.cg.unified / "memory.high").write_text(str(new))
            else:
                # write the v1 soft limit directly: Cgroup.set_memory_high would register another
                # threshold eventfd, and breaches are counted against the arm's soft limit
                (step.cg.paths["memory"] / "memory.soft_limit_in_bytes").write_text(str(new))
            return True
        if step.tripwire:               # nothing more to grant: the kernel decides at the ceiling
            self._lift(step)
        return False

    def _lift(self, step: _Step, *, log: bool = True) -> None:
        if not step.tripwire:
            return
        step.tripwire = False
        ceiling = self.rules.ceiling_bytes
        step.cg.set_memory_max(ceiling)
        step.cg.set_oom_killer(True)
        if log:
            self._log(step, "lift", "tripwire -> " + (f"hard limit {ceiling // MB} MB" if ceiling else "no limit"))

    def _freeze(self, step: _Step) -> None:
        (step.cg.unified / "cgroup.freeze").write_text("1")
        step.frozen = True
        step.counts["freezes"] += 1
        self._log(step, "freeze")
        self._cont(step)            # stays frozen; thawing later lets it run

    def _thaw(self, step: _Step) -> None:
        try:
            (step.cg.unified / "cgroup.freeze").write_text("0")
        except OSError:
            pass
        step.frozen = False

    def _release(self, step: _Step) -> None:
        """Leave nothing parked, frozen or stopped (a removed step, or the controller closing)."""
        try:
            self._lift(step, log=False)
            if self.throttle is not None and step.cg.host.mode == "v2" and step.soft_bytes is not None:
                # v2 memory.high is what parks a step (the kernel throttles above it, and with no
                # swap anonymous memory cannot be reclaimed below it): lifted like the v1 tripwire.
                # memory.max (the ceiling) stays. The bpf-soft arm (no eBPF) keeps its limits.
                (step.cg.unified / "memory.high").write_text("max")
                step.soft_bytes = None
        except OSError:
            pass                        # the cgroup is already gone
        if step.frozen:
            self._thaw(step)            # both swallow what a gone cgroup or process raises
        self._cont(step)

    def _cont(self, step: _Step) -> None:
        if step.stopped_pid is not None:
            try:
                os.kill(step.stopped_pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            step.stopped_pid = None

    def _schedule(self, when_ns: int, step: _Step) -> None:
        heapq.heappush(self._due, (when_ns, next(self._seq), step))

    def _log(self, step: _Step, what: str, detail: str = "") -> None:
        self.actions.append(Action(time.monotonic_ns(), step.cgid, what, detail))

    def _guarded(self, fn, *args) -> None:
        try:
            fn(*args)
        except OSError as exc:          # a step's cgroup went away between its event and now
            self.actions.append(Action(time.monotonic_ns(), 0, "error", f"{fn.__name__}: {exc}"))

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Run the event loop (poll + due resumes) in a thread until stop(); nothing to run without eBPF."""
        if self.throttle is None or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="agentcgroup-controller", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll(timeout_ms=20)

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    @contextmanager
    def running(self):
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            try:
                with self._lock:
                    for step in list(self.steps.values()):
                        self._release(step)
            finally:
                if self.throttle is not None:
                    self.throttle.close()
                if self._external is not None:
                    self._external.close()
