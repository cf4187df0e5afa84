"""Resource emulator: reproduces one step's recorded profile in a fresh process.

Run as a script (`python -I -S emulator.py PEAK_BYTES RAMP_MS CPU_MS IO_BYTES DURATION_MS WORKDIR
[ALLOC_LOG] [--curve=FILE]`) so that start-up stays near a bare interpreter's. It imports nothing from
the package, and its schedule is a pure function of its arguments (plus the start-up baseline it
measures and subtracts).

Without a curve (a derived or synthetic profile), over DURATION_MS of wall time from its start-up:
  1. ramp: memory grows in equal chunks to PEAK_BYTES over RAMP_MS; every page is written, so the
     kernel really charges it to the cgroup (and really OOM-kills us at a hard limit);
  2. IO: IO_BYTES written to a file in WORKDIR and read back (page cache is charged to the cgroup
     too, as for a real tool), then removed;
  3. hold: the memory stays resident until DURATION_MS has passed.
The interpreter's own resident size is subtracted from PEAK_BYTES so the cgroup's peak matches it.

With --curve=FILE (a recorded curve: lines `T_MS MB`, the memory of the recorded step's cgroup T_MS
after it was spawned), memory follows the curve instead, each reading from its time until the next
one's, in whole MiB of anonymous mappings (munmap and MADV_DONTNEED really uncharge them, which
freeing to the heap may not): a step that released memory or peaked twice does so here too. The
clock starts at the spawn, as the recording's did (AGENTCGROUP_EMULATE_T0 in the environment: the
launcher's CLOCK_MONOTONIC just before it; else estimated), not at the end of our start-up. What
the cgroup holds when we begin (this interpreter, the CPU workers; our RSS where the cgroup holds
other processes too) is subtracted once. IO comes first, 1 MiB at a time, truncated after each
piece: the curve already contains the recorded step's page cache.

CPU: CPU_MS of CPU in total, paid pro rata over DURATION_MS. What is owed is carried forward: when
allocating fell behind the schedule, the CPU not yet spent is spent later (at the latest after the
last deadline), never dropped. The CPU this process already used (start-up, page faults) counts, as
it does in the recorded step's cgroup. When the CPU still owed after start-up exceeds the time left
(a step that used several cores, or a CPU-dense one start-up has made late), it is shared among as
many processes as it needs (forked workers, at most one per core): a busy loop in Python holds the
GIL, so threads could not use a second core.

With ALLOC_LOG, memory is allocated in 1 MiB pieces and the wall time of each (allocate + touch every
page: the page faults that charge it to the cgroup; not the pacing after it) is appended to that file
in ms, one line per MiB, as it happens (a kill loses nothing written before it): the allocation
latency Experiment 5 reports.
"""
import os
import sys
import time

CHUNK = 8 * 1024 * 1024
PAGE = 4096
MIB = 1024 * 1024
T0_ENV = "AGENTCGROUP_EMULATE_T0"     # monotonic seconds just before the spawn (optional)
WORKER_SLICE_S = 0.02       # a CPU worker settles its account this often


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def touch(buf) -> None:
    buf[::PAGE] = b"\x01" * len(range(0, len(buf), PAGE))    # write every page: the kernel charges it


def cgroup_usage(ours: set) -> int | None:
    """What this process's memory cgroup holds now (v1 memory.usage_in_bytes | v2 memory.current)
    when the cgroup is ours alone (no process in it but `ours`); None where it is shared or its files
    cannot be read (then RSS stands in)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [ln.rstrip("\n").split(":", 2) for ln in f]
        with open("/proc/self/mountinfo") as f:
            mounts = [ln.split() for ln in f]
        for _, ctrls, path in lines:
            v2 = ctrls == ""
            for m in mounts:
                sep = m.index("-")
                fstype, opts = m[sep + 1], m[sep + 3].split(",")
                mine = fstype == "cgroup2" if v2 else \
                    fstype == "cgroup" and "memory" in opts and "memory" in ctrls.split(",")
                if mine:
                    root, mnt = m[3], m[4]
                    rel = path[len(root):] if root != "/" and path.startswith(root) else path
                    name = "memory.current" if v2 else "memory.usage_in_bytes"
                    try:
                        with open(mnt + rel + "/cgroup.procs") as f:
                            if not {int(p) for p in f.read().split()} <= ours:
                                return None
                        with open(mnt + rel + "/" + name) as f:
                            return int(f.read())
                    except OSError:
                        continue
    except (OSError, ValueError, IndexError):
        pass
    return None


def since_spawn_s() -> float:
    """The time since this process was forked: from the instant its launcher passed in T0_ENV (just
    before the spawn), else a lower bound: its CPU time so far, or the clock since its start time in
    /proc/self/stat (clock ticks, rounded down: one tick is subtracted)."""
    try:
        return max(0.0, time.monotonic() - float(os.environ[T0_ENV]))
    except (KeyError, ValueError):
        pass
    best = time.process_time()
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        hz = os.sysconf("SC_CLK_TCK")
        best = max(best, time.clock_gettime(time.CLOCK_BOOTTIME) - (ticks + 1) / hz)
    except (OSError, ValueError, IndexError):
        pass
    return best


class Cpu:
    """CPU owed pro rata over the step, paid by this process; the account is its own CPU time."""

    def __init__(self, total_s: float, duration_s: float):
        self.total, self.duration = total_s, duration_s

    def pay(self, t_s: float, deadline: float | None) -> None:
        """Spin until the CPU owed at t_s (of the step) is spent, or the monotonic deadline passes
        (None: no deadline, the debt is paid in full)."""
        owed = self.total * min(1.0, t_s / self.duration) if self.duration > 0 else self.total
        while time.process_time() < owed:
            if deadline is not None and time.monotonic() >= deadline:
                return
            end = min(owed, time.process_time() + 0.005)
            while time.process_time() < end:
                pass


def pace(cpu: Cpu, t0: float, t_s: float) -> None:
    """Pay the CPU owed by t_s, then sleep until t_s (a late schedule carries its debt on)."""
    deadline = t0 + t_s
    cpu.pay(t_s, deadline)
    rest = deadline - time.monotonic()
    if rest > 0:
        time.sleep(rest)


def start_workers(cpu_s: float, duration_s: float, t0: float) -> tuple[float, list[int]]:
    """Fork the CPU workers a multi-core step needs: as many processes as the CPU still owed needs
    in the time still left (start-up has used some of both). Returns this process's share (its CPU
    so far included) and the workers' pids."""
    used, left = time.process_time(), duration_s - (time.monotonic() - t0)
    if duration_s <= 0 or cpu_s - used <= max(left, 0.0):
        return cpu_s, []
    n = min(-int(-(cpu_s - used) // max(left, 1e-3)), os.cpu_count() or 1)
    share, pids, parent = (cpu_s - used) / n, [], os.getpid()
    for _ in range(n - 1):
        pid = os.fork()
        if pid == 0:
            try:
                work = Cpu(share, duration_s)
                t = 0.0
                while t < duration_s and os.getppid() == parent:
                    t = min(duration_s, t + WORKER_SLICE_S)
                    pace(work, t0, t)
                if os.getppid() == parent:
                    work.pay(duration_s, None)
            finally:
                os._exit(0)
        pids.append(pid)
    return used + share, pids


def do_io(workdir: str, nbytes: int, *, bounded: bool) -> None:
    path = os.path.join(workdir, f".emulator-io-{os.getpid()}")
    block = b"\x02" * MIB
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        left = nbytes
        while left > 0:
            n = os.write(fd, block[:left])
            left -= n
            if bounded:         # read the piece back, then drop it: at most 1 MiB of page cache
                os.pread(fd, n, 0)
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
        if not bounded:
            os.lseek(fd, 0, os.SEEK_SET)
            while os.read(fd, MIB):
                pass
    finally:
        os.close(fd)
        os.unlink(path)


def read_curve(path: str) -> list[tuple[float, float]]:
    with open(path) as f:
        return [(float(t) / 1000.0, float(mb) * MIB) for t, mb in (ln.split() for ln in f if ln.strip())]


class Mapped:
    """Memory held in anonymous mappings, grown and shrunk to a target in whole MiB: a rise maps one
    region of its size, a fall unmaps whole regions and gives back the tail of the last one
    (MADV_DONTNEED uncharges it), so that rises and falls cost what a real program's would."""

    def __init__(self, log):
        import mmap
        self.mmap, self.log, self.regions = mmap, log, []       # [mapping, bytes resident]
        self.held = 0

    def hold(self, nbytes: float) -> None:
        want = max(0, int((nbytes + MIB // 2) // MIB)) * MIB
        if want > self.held:
            last = self.regions[-1] if self.regions else None
            if last is None or last[1] == len(last[0]):
                last = [self.mmap.mmap(-1, want - self.held, flags=self.mmap.MAP_PRIVATE | self.mmap.MAP_ANONYMOUS), 0]
                self.regions.append(last)
            grow = min(want - self.held, len(last[0]) - last[1])
            lo, hi = last[1], last[1] + grow
            if self.log is None:
                touch_range(last[0], lo, hi)
            else:
                for a in range(lo, hi, MIB):        # timed per MiB for Experiment 5's latency
                    t = time.perf_counter()
                    touch_range(last[0], a, min(hi, a + MIB))
                    self.log.write(f"{(time.perf_counter() - t) * 1000.0:.3f}\n")
            last[1], self.held = hi, self.held + grow
            if self.held < want:
                self.hold(want)
        while self.held > want:
            region, resident = self.regions[-1]
            keep = max(0, resident - (self.held - want))
            if keep == 0:
                self.regions.pop()
                region.close()
            else:
                region.madvise(self.mmap.MADV_DONTNEED, keep, resident - keep)
                self.regions[-1][1] = keep
            self.held -= resident - keep


def touch_range(buf, lo: int, hi: int) -> None:
    buf[lo:hi:PAGE] = b"\x01" * len(range(lo, hi, PAGE))


def follow_curve(curve, cpu: Cpu, t0: float, duration_s: float, log, io_bytes: int, workdir: str,
                 workers: list[int]) -> None:
    if io_bytes > 0:
        do_io(workdir, io_bytes, bounded=True)
    base = cgroup_usage({os.getpid(), *workers})
    base = rss_bytes() if base is None else base
    mem = Mapped(log)
    for t, nbytes in curve:         # a reading holds from its time until the next one's
        pace(cpu, t0, min(t, duration_s))
        mem.hold(nbytes - base)
    pace(cpu, t0, duration_s)


def ramp_and_hold(peak: float, ramp_s: float, cpu: Cpu, t0: float, duration_s: float, log, io_bytes: int,
                  workdir: str) -> None:
    target = max(0, int(peak) - rss_bytes())
    nchunks = (target + CHUNK - 1) // CHUNK
    held = []
    for i in range(nchunks):
        size = min(CHUNK, target - i * CHUNK)
        if log is None:
            buf = bytearray(size)
            touch(buf)
            held.append(buf)
        else:
            for lo in range(0, size, MIB):          # the same in 1 MiB pieces, each timed
                t = time.perf_counter()
                piece = bytearray(min(MIB, size - lo))
                touch(piece)
                log.write(f"{(time.perf_counter() - t) * 1000.0:.3f}\n")
                held.append(piece)
        pace(cpu, t0, ramp_s * (i + 1) / nchunks)
    if io_bytes > 0:
        do_io(workdir, io_bytes, bounded=False)
    pace(cpu, t0, duration_s)


def main(argv) -> int:
    peak, ramp_ms, cpu_ms, io_bytes, duration_ms = (float(x) for x in argv[1:6])
    workdir = argv[6]
    extra = argv[7:]        # [ALLOC_LOG] [--curve=FILE], in either order (a caller may append the log)
    curves = [a[len("--curve="):] for a in extra if a.startswith("--curve=")]
    logs = [a for a in extra if not a.startswith("--curve=")]
    log = open(logs[0], "a", buffering=1) if logs else None
    curve = read_curve(curves[0]) if curves else None
    duration = duration_ms / 1000.0
    # a recorded curve's clock starts at the spawn; a derived profile's once we run (as it always did)
    t0 = time.monotonic() - (since_spawn_s() if curve is not None else 0.0)
    share, workers = start_workers(cpu_ms / 1000.0, duration, t0)
    cpu = Cpu(share, duration)
    if curve is not None:
        follow_curve(curve, cpu, t0, duration, log, int(io_bytes), workdir, workers)
    else:
        ramp = min(ramp_ms, duration_ms) / 1000.0
        ramp_and_hold(peak, ramp, cpu, t0, duration, log, int(io_bytes), workdir)
    cpu.pay(duration, None)                 # whatever is still owed: late, but not lost
    for pid in workers:
        os.waitpid(pid, 0)
    if curve is not None:       # the recorded duration ends at the exit: no interpreter teardown after it
        if log is not None:
            log.close()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
