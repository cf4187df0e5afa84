"""Cgroups: detect the host's layout, build the run's hierarchy, apply arms, read counters."""
from .host import CgroupHost, CgroupUnavailable, detect
from .node import Cgroup, Counters
from .tree import RunTree

__all__ = ["CgroupHost", "CgroupUnavailable", "detect", "Cgroup", "Counters", "RunTree"]
