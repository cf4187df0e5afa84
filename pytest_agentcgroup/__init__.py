"""pytest-agentcgroup: trace-driven resource-control experiments for AI-agent workloads.

The pytest side (options, markers, fixtures) lives in `pytest_agentcgroup.plugin`, loaded through
the `pytest11` entry point. What is importable from here is the small data API: traces and arms.
"""
from .arms import Arm
from .traces.corpus import Corpus
from .traces.ir import Measure, Profile, Step, Trace, TraceError, read_traces, write_trace

__all__ = ["Arm", "Corpus", "Measure", "Profile", "Step", "Trace", "TraceError", "read_traces", "write_trace"]
