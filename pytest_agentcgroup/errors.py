"""Errors shared by rooms that do not import each other.

`ExecutorUnavailable` is raised by whatever a step executor needs from the host (the executor
itself in replay/, the Docker engine in engines/, the browser tenant in tenants/) and caught in one
place by the pytest side, which skips naming what is missing. It lives here, below all of them, so
that no engine imports replay/ for an exception class. Imports nothing from the package.
"""


class ExecutorUnavailable(RuntimeError):
    """The executor cannot run on this host; the message names what is missing."""
