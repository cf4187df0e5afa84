"""Live: the arms as a runtime for agents people run, one tool call at a time (docs/live.md).

session.py is the API (AgentSession, CallResult), cgroup.py the session's cgroup (one that can
outlive its process, for the command line), recorder.py the trace the session writes in the IR as it
runs, redact.py what is taken out of it first, stored.py a session kept in a directory across
`agentcgroup exec` invocations. The note an agent gets for a stopped call is notes.py's, the one
the replay's kill reasons use too. mini_swe_agent.py and inspect_sandbox.py put a framework's agent
loop on a session (mini-swe-agent's environment, Inspect's sandbox `agentcgroup`); only the
framework loads them, and only they import it.

May import: cgroups/, replay/, bpf/, traces/, profile/, config, notes, proc, errors, arms. Only cli/
and the pytest side import it.
"""
from .session import AgentSession, CallResult, SessionError

__all__ = ["AgentSession", "CallResult", "SessionError"]
