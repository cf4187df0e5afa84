"""Workspaces: the working copy a trace's task needs for its real commands to replay as recorded.

A trace that names a task (traces/task.py) gets its workspace from a provider, chosen by the
harness (provide.py): a user's own directory (`--agentcgroup-workspace`), the task's container
image where the docker executor has it, or a workspace **built from PyPI** and pinned in the
corpus's lock file (lock.py): the project's sdist at the release the lock chose (choose.py: from
the trajectory's own outputs, the edits it made and the views it had (seen.py), the task's version series), unpacked at the path
the agent used, beside a virtual environment with the project's dependencies and pytest, every
file checked against its sha256. It is built once, outside the sandbox and with network
(build.py, into a cache), and each replay gets a copy (replay/executors: base.Seed) that its steps
use read-write without network.

May import: traces/, proc, errors, programs, replay/ (its Seed and cache directories). Never
cgroups/ or anything above: the harness hands the Seed to the executor.
"""
