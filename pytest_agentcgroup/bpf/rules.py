"""The dynamic arm's rules: data from an arm's `rules` table (bpf/controller.py shows the table and
what each rule does), checked at load so a bad value is one ArmError naming its key."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cgroups.arms import Arm, ArmError, check_cpu_weight
from ..cgroups.node import MB

PRIORITIES = ("low", "normal", "high")


@dataclass(frozen=True)
class Rules:
    ebpf: bool = True
    memory_high_mb: float | None = None
    memory_max_mb: float | None = None
    hold_ms: float = 200
    freeze_after: int = 3
    freeze_hold_ms: float = 1000
    kill_after: int = 2
    window_ms: float = 5000
    raise_step_mb: float = 0
    raise_max_mb: float = 0
    priorities: dict = field(default_factory=lambda: {"default": "normal"})
    cpu_weight: dict = field(default_factory=dict)     # priority -> cpu weight (1..10000), where given
    external_loader: tuple = ()

    @classmethod
    def from_dict(cls, raw: dict, *, where: str = "agentcgroup rules") -> "Rules":
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise ArmError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; expected "
                           f"{', '.join(cls.__dataclass_fields__)}")
        for key, val in raw.items():
            if key == "ebpf" and not isinstance(val, bool):
                raise ArmError(f"{where}.ebpf: expected true or false, got {val!r}")
            if key in ("priorities", "external_loader", "ebpf", "cpu_weight") or val is None and key.startswith("memory_"):
                continue
            least = 1 if key == "freeze_after" else 0
            if isinstance(val, bool) or not isinstance(val, (int, float)) or val < least:
                raise ArmError(f"{where}.{key}: expected a number >= {least}, got {val!r}")
        pri = raw.get("priorities", {"default": "normal"})
        if not isinstance(pri, dict):
            raise ArmError(f"{where}.priorities: expected a table (step kind -> low|normal|high)")
        bad = {k: v for k, v in pri.items() if v not in PRIORITIES}
        if bad:
            raise ArmError(f"{where}.priorities: expected one of {', '.join(PRIORITIES)}, got {bad}")
        cpu = raw.get("cpu_weight", {})
        if not isinstance(cpu, dict) or set(cpu) - set(PRIORITIES):
            raise ArmError(f"{where}.cpu_weight: expected a table priority ({', '.join(PRIORITIES)}) -> "
                           f"weight, got {cpu!r}")
        for level, w in cpu.items():
            check_cpu_weight(w, f"{where}.cpu_weight.{level}")
        loader = raw.get("external_loader", ())
        if not isinstance(loader, (list, tuple)) or not all(isinstance(a, str) for a in loader):
            raise ArmError(f"{where}.external_loader: expected an argv list of strings")
        return cls(**{**raw, "priorities": dict(pri), "cpu_weight": dict(cpu), "external_loader": tuple(loader)})

    @classmethod
    def from_arm(cls, arm: Arm) -> "Rules":
        """The rules of a policy arm: its `rules` table plus the arm's own limits."""
        where = f"arms.{arm.name}.rules"
        if arm.policy != "agentcgroup":
            raise ArmError(f"arms.{arm.name}.policy: unknown policy {arm.policy!r}; expected \"agentcgroup\"")
        for key in ("memory_high_mb", "memory_max_mb"):
            if key in arm.rules:
                raise ArmError(f"{where}.{key}: set the limits on the arm itself (arms.{arm.name}.{key})")
        return cls.from_dict({**arm.rules, "memory_high_mb": arm.memory_high_mb,
                              "memory_max_mb": arm.memory_max_mb}, where=where)

    def priority(self, kind: str | None) -> str:
        return self.priorities.get(kind or "", self.priorities.get("default", "normal"))

    @property
    def soft_bytes(self) -> int | None:
        return int(self.memory_high_mb * MB) if self.memory_high_mb is not None else None

    @property
    def ceiling_bytes(self) -> int | None:
        return int(self.memory_max_mb * MB) if self.memory_max_mb is not None else None
