"""The egress network policy (bpf/egress_policy.bpf.c) on a step's v2 cgroup.

    with EgressPolicy(allow=["10.0.0.5"], allow_loopback=False) as pol:
        pol.attach(step_cg.unified)        # every process in that cgroup (and below) is filtered
        ...
        pol.counts(step_cg.id)             # {"allowed": n, "dropped": m, ...}

Default for replayed commands: no network at all (allow-list empty, loopback denied).
"""
from __future__ import annotations

import ctypes
import ipaddress
import os

from .loader import ProgramSide


class EgressPolicy(ProgramSide):
    program = "egress_policy"

    def __init__(self, *, allow=(), allow_loopback: bool = False):
        self.allow_loopback, self._allowed_at_load = allow_loopback, tuple(allow)
        super().__init__()

    def _set_up(self) -> None:
        cfg = self.prog["agcg_egr_config"]
        leaf = cfg.Leaf()
        leaf.allow_loopback = 1 if self.allow_loopback else 0
        cfg[ctypes.c_int(0)] = leaf
        for addr in self._allowed_at_load:
            self.allow(addr)

    def allow(self, addr: str) -> None:
        ip = ipaddress.IPv4Address(addr)        # IPv6 allow-lists are not supported
        key = int.from_bytes(ip.packed, "little")   # network byte order as the kernel's u32 sees it
        self.prog["agcg_egr_allow"][ctypes.c_uint32(key)] = ctypes.c_uint8(1)

    def attach(self, cgroup_dir: str | os.PathLike) -> None:
        self.prog.attach_cgroup("agcg_egress", cgroup_dir, "cgroup_inet_egress")

    def counts(self, cgroup_id: int) -> dict:
        v = self.prog["agcg_egr_counts"].get(ctypes.c_uint64(cgroup_id))
        if v is None:
            return {"allowed": 0, "dropped": 0, "last_drop_ns": 0, "last_drop_daddr": None}
        daddr = str(ipaddress.IPv4Address(int(v.last_drop_daddr).to_bytes(4, "little"))) if v.last_drop_daddr else None
        return {"allowed": int(v.allowed), "dropped": int(v.dropped), "last_drop_ns": int(v.last_drop_ns),
                "last_drop_daddr": daddr}
