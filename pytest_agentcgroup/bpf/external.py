"""An external BPF loader run for a policy arm's lifetime (`external_loader` in its rules): bcc
cannot attach struct_ops programs (sched_ext schedulers, memcg_bpf_ops), so a program that can is
started and stopped around the arm instead."""
from __future__ import annotations

import signal
import subprocess


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
