"""The co-located probe of a timescale study, a program of its own (started by its path): sleeps
`period_us` over and over until SIGTERM, then writes [(monotonic ns at wake-up, lateness ns), ...]
as JSON to the given file.

    python sleep_probe.py <period_us> <out.json>

May import: nothing of the package (a program of its own).
"""
import json
import signal
import sys
import time


def main():
    period = int(sys.argv[1]) / 1e6
    rec = []
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    while not stop:
        t = time.monotonic_ns()
        time.sleep(period)
        t2 = time.monotonic_ns()
        rec.append((t2, t2 - t - int(period * 1e9)))
    with open(sys.argv[2], "w") as f:
        json.dump(rec, f)


if __name__ == "__main__":
    main()
