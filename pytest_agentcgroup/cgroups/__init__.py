"""Cgroups: detect the host's layout, build the run's hierarchy, apply arms, read counters.

May import: proc, traces/ (step kinds). Never replay/, tenants/, engines/ or anything above:
replay is handed a Placement (arms.py ArmPlacement) by the pytest side.
"""
from .host import CgroupHost, CgroupUnavailable, detect
from .node import Cgroup, Counters
from .tree import RunTree

__all__ = ["CgroupHost", "CgroupUnavailable", "detect", "Cgroup", "Counters", "RunTree"]
