"""Cgroups: detect the host's layout, build the run's hierarchy, apply arms, read counters.

May import: proc, arms (the data). Never traces/, replay/, tenants/, engines/ or anything above:
replay is handed a Placement (placement.py ArmPlacement) by the pytest side, and ArmPlacement
each step's kind (a kind_of function).
"""
from .host import CgroupHost, CgroupUnavailable, detect
from .counters import Counters
from .node import Cgroup
from .tree import RunTree

__all__ = ["CgroupHost", "CgroupUnavailable", "detect", "Cgroup", "Counters", "RunTree"]
