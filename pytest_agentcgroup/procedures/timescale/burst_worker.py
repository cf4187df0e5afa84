"""The burst worker of a timescale study (procedures/timescale/bursts.py starts it as a program by
its path, not as a module of the package, so that nothing but this is in the process). It reads
commands on stdin, one per line, and answers each on stdout:

    prep <join files> <cushion_mb> <burst_mb>   join the burst's cgroup, build a reclaimable cushion
                                                (touched, then MADV_FREE) and map the burst -> ready <addr>
    go                                          touch the burst, page by page -> done
    free <park join files>                      unmap both, join the park cgroup -> freed

`<addr>` is the address of the counter of burst bytes touched so far, which bpf/task_stop.bpf.c
reads in the worker's own context at the onset and at the stop.

May import: nothing of the package (a program of its own).
"""
import ctypes
import mmap
import os
import sys

MB = 1 << 20
# bytes of the burst touched so far; task_stop.bpf.c reads it (at its address) at onset and at the stop
counter = bytearray(8)
progress = memoryview(counter).cast("Q")
progress_addr = ctypes.addressof(ctypes.c_char.from_buffer(counter))


def join(files):
    for f in files.split(","):
        fd = os.open(f, os.O_WRONLY)
        os.write(fd, b"0")
        os.close(fd)


def touch(m, n):
    for i in range(0, n, 4096):
        m[i] = 1


def touch_burst(m):
    for i in range(4096, len(m) + 1, 4096):
        m[i - 4096] = 1
        progress[0] = i


def main():
    maps = []
    out = sys.stdout
    for line in sys.stdin:
        cmd, *a = line.split()
        if cmd == "prep":                      # prep <join files> <cushion_mb> <burst_mb>
            join(a[0])
            c, b = int(a[1]) * MB, int(a[2]) * MB
            cushion = mmap.mmap(-1, c, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            touch(cushion, c)
            cushion.madvise(mmap.MADV_FREE)
            burst = mmap.mmap(-1, b, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            maps = [cushion, burst]
            progress[0] = 0
            out.write(f"ready {progress_addr}\n")
            out.flush()
        elif cmd == "go":
            touch_burst(maps[1])
            out.write("done\n")
            out.flush()
        elif cmd == "free":                    # free <park join files>
            for m in maps:
                m.close()
            maps = []
            join(a[0])
            out.write("freed\n")
            out.flush()


if __name__ == "__main__":
    main()
