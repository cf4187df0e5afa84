"""Per-step hard limits an arm computes before each tool call runs (arms.py limit_from "vpa",
"window", "predict"): from the agent's own earlier steps in the trace (history.py: VPA's and
Autopilot's recommenders) or from a model of command classes held out by fold (model.py, predict.py).

`step_limits(arm, trace)` gives the StepLimits object cgroups/placement.py ArmPlacement is handed
(`limits=`): `limit_mb(step)` before a step (the arm's margin_mb included), `observe(step, limit_mb,
peak_mb, oom_killed)` after it (the step's measured peak and kill, which only a history arm uses).
The placement records each step's limit (step_limit_mb), so what reservation counts is what was set.

May import: arms, traces/.
"""
from __future__ import annotations

from ..arms import Arm, ArmError
from .history import VPA, Window
from .model import Model, ModelError
from .predict import Predictor


class StepLimits:
    """One trace's per-step limits under one arm: a recommender (vpa, window) or a predictor."""

    def __init__(self, arm: Arm, source):
        self.arm, self.source = arm, source
        self.margin = float(arm.margin_mb or 0.0)

    def limit_mb(self, step) -> float:
        if isinstance(self.source, Predictor):
            return self.source.limit_mb(step) + self.margin
        return self.source.limit_mb() + self.margin

    def observe(self, step, limit_mb: float | None, peak_mb: float | None, oom_killed: bool) -> None:
        if isinstance(self.source, Predictor):
            self.source.observe(step, peak_mb)
        else:
            self.source.observe(limit_mb, peak_mb, oom_killed)

    @property
    def fold(self) -> str | None:
        """The fold a predictor's limits came from (its training traces: model.training)."""
        return self.source.fold if isinstance(self.source, Predictor) else None


def step_limits(arm: Arm, trace) -> StepLimits | None:
    """The StepLimits of `arm` for replaying `trace` (None for an arm without limits of this kind);
    ArmError naming the arm for a model file that cannot be used."""
    if arm.limit_from == "vpa":
        return StepLimits(arm, VPA(arm.knobs))
    if arm.limit_from == "window":
        return StepLimits(arm, Window(arm.knobs))
    if arm.limit_from == "predict":
        k = arm.knobs
        try:
            model = Model.load(k["model"])
            return StepLimits(arm, Predictor(model, trace, quantile=k["quantile"], folds=k["folds"],
                                             min_class_steps=k["min_class_steps"], history=k["history"]))
        except (ModelError, ValueError) as exc:
            raise ArmError(f"arms.{arm.name}.model: {exc}") from None
    return None
