"""Measuring traces on this host, each step in a cgroup of its own.

Profiling real commands (`agentcgroup traces profile`): run each executing step of a trace once,
in order, under a real executor (sandbox or docker), each step in a fresh cgroup of its own, and
write the trace back with profiles whose numbers are `recorded` (only a peak read off the curve,
where the kernel keeps none, is `derived`) (meter.py measures one step, run.py walks traces and
resumes, output.py decides and writes the files; the command line is cli/profile.py).

The emulator's fidelity run (`agentcgroup traces fidelity`, fidelity.py; the command line is
cli/fidelity.py): every recorded step emulated in a cgroup of its own and compared with its
recording (metrics/fidelity.py).

Above cgroups/, replay/ and metrics/ in the data flow (it hands the replayer a Placement that
measures, and compares by metrics/fidelity.py): may import traces/, proc, errors, arms, engines/,
replay/, cgroups/, metrics/. Nothing imports it but the command line (cli/).
"""


class ProfileError(RuntimeError):
    """Profiling cannot go on: one message naming the file, directory or capability."""
