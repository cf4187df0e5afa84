"""Resource emulator: reproduces one step's recorded profile in a fresh process.

Run as a script (`python -I -S emulator.py PEAK_BYTES RAMP_MS CPU_MS IO_BYTES DURATION_MS WORKDIR
[ALLOC_LOG]`) so that start-up stays near a bare interpreter's. It imports nothing from the package, and it is
deterministic: the schedule is a pure function of its arguments.

Schedule over DURATION_MS of wall time:
  1. ramp: memory grows in equal chunks to PEAK_BYTES over RAMP_MS; every page is written, so the
     kernel really charges it to the cgroup (and really OOM-kills us at a hard limit);
  2. CPU: CPU_MS of busy spinning, spread over the ramp and the hold in proportion to their length;
  3. IO: IO_BYTES written to a file in WORKDIR and read back (page cache is charged to the cgroup
     too, as for a real tool), then removed;
  4. hold: the memory stays resident until DURATION_MS has passed.
The interpreter's own resident size is subtracted from PEAK_BYTES so the cgroup's peak matches it.
With ALLOC_LOG, memory is allocated in 1 MiB pieces and the wall time of each (allocate + touch every
page: the page faults that charge it to the cgroup; not the pacing after it) is appended to that file in ms, one line per MiB, as it
happens (a kill loses nothing written before it): the allocation latency Experiment 5 reports.
"""
import os
import sys
import time

CHUNK = 8 * 1024 * 1024
PAGE = 4096
MIB = 1024 * 1024


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def work_until(deadline: float, cpu_s: float) -> None:
    """Burn cpu_s of CPU, then sleep until the monotonic deadline."""
    if cpu_s > 0:
        spin(min(cpu_s, max(0.0, deadline - time.monotonic())))
    rest = deadline - time.monotonic()
    if rest > 0:
        time.sleep(rest)


def main(argv) -> int:
    peak, ramp_ms, cpu_ms, io_bytes, duration_ms = (float(x) for x in argv[1:6])
    workdir = argv[6]
    log = open(argv[7], "a", buffering=1) if len(argv) > 7 else None
    t0 = time.monotonic()
    duration = duration_ms / 1000.0
    ramp = min(ramp_ms, duration_ms) / 1000.0
    cpu = min(cpu_ms / 1000.0, duration) if duration > 0 else cpu_ms / 1000.0
    cpu_ramp = cpu * (ramp / duration) if duration > 0 else 0.0
    target = max(0, int(peak) - rss_bytes())
    nchunks = (target + CHUNK - 1) // CHUNK
    held = []
    for i in range(nchunks):
        size = min(CHUNK, target - i * CHUNK)
        if log is None:
            buf = bytearray(size)
            buf[::PAGE] = b"\x01" * len(range(0, size, PAGE))    # touch every page
            held.append(buf)
        else:
            for lo in range(0, size, MIB):          # the same in 1 MiB pieces, each timed
                t = time.perf_counter()
                piece = bytearray(min(MIB, size - lo))
                piece[::PAGE] = b"\x01" * len(range(0, len(piece), PAGE))
                log.write(f"{(time.perf_counter() - t) * 1000.0:.3f}\n")
                held.append(piece)
        work_until(t0 + ramp * (i + 1) / nchunks, cpu_ramp / nchunks)
    if io_bytes > 0:
        path = os.path.join(workdir, f".emulator-io-{os.getpid()}")
        block = b"\x02" * (1 << 20)
        with open(path, "wb") as f:
            left = int(io_bytes)
            while left > 0:
                left -= f.write(block[:left])
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        os.unlink(path)
    work_until(t0 + duration, cpu - cpu_ramp if nchunks else cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
