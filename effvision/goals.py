"""What a target asks of speed, as objects: a speed-up over the uncompressed reference, an absolute
latency, or the fastest file within the floor (no speed asked). Each says the latency it aims at,
whether a measurement meets it and how it reads; the plan, the prune stage, its aim and the report
ask the goal instead of branching on which kind it is (Optuna's samplers as objects, not flags)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


class Goal:
    extra_steps = 3  # pruning steps after the planned ones while the measured model still misses it

    def speedup(self, reference_ms: float) -> Optional[float]:
        """The speed-up over a reference measured at `reference_ms` that meets it (None: the fastest
        within the floor, however fast that is)."""
        raise NotImplementedError

    def goal_ms(self, reference_ms: float, fastest_ms: Optional[float], margin: float = 0.0) -> float:
        """The latency aimed at, on the scale of `reference_ms` (the first reference measurement),
        `margin` faster than asked; `fastest_ms`: the narrowest network's, where no speed is asked."""
        return self.speedup_ms(reference_ms) / (1 + margin)

    def speedup_ms(self, reference_ms: float) -> float:
        return reference_ms / self.speedup(reference_ms)

    def met(self, ms: float, speedup: float) -> bool:
        """Whether a file measured at `ms`, `speedup` times faster than its reference, meets it."""
        raise NotImplementedError

    def may_be_met_on_entry(self) -> bool:
        """Whether a model entering the prune stage can already meet it (then nothing is pruned)."""
        return True

    def prune_problem(self, has_plan: bool, step_epochs: int, steps: int) -> Optional[str]:
        """What a prune stage aiming at it lacks in its recipe (None: nothing)."""
        return None

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Speedup(Goal):
    times: float

    def speedup(self, reference_ms):
        return self.times

    def met(self, ms, speedup):
        return speedup >= self.times

    def describe(self):
        return f"{self.times}x"


@dataclass(frozen=True)
class Latency(Goal):
    ms: float

    def speedup(self, reference_ms):
        return reference_ms / self.ms

    def goal_ms(self, reference_ms, fastest_ms, margin=0.0):
        return self.ms / (1 + margin)  # absolute: not on the reference's scale

    def met(self, ms, speedup):
        return ms <= self.ms

    def describe(self):
        return f"{self.ms} ms"


@dataclass(frozen=True)
class FastestWithinFloor(Goal):
    """No speed asked: prune step by step toward the narrowest widths while the floor holds."""

    extra_steps = 0

    def speedup(self, reference_ms):
        return None

    def goal_ms(self, reference_ms, fastest_ms, margin=0.0):
        return fastest_ms if fastest_ms is not None else reference_ms

    def met(self, ms, speedup):
        return True  # whatever speed the floor allowed

    def may_be_met_on_entry(self):
        return False

    def prune_problem(self, has_plan, step_epochs, steps):
        if not has_plan:
            return "target: max_drop alone (the fastest file within it) needs a plan stage before prune"
        if step_epochs < 1 or steps < 2:
            return (
                "target: max_drop alone prunes step by step while the floor holds: give aim.steps >= 2 and "
                "finetune.step_epochs >= 1 (each step's recovered accuracy is held against the floor)"
            )
        return None

    def describe(self):
        return "the fastest file within max_drop"


def goal_of(target) -> Goal:
    """The goal of a target block (a TargetConfig, or its dict in a report)."""
    get = target.get if isinstance(target, dict) else lambda k: getattr(target, k)
    if get("latency_ms") is not None:
        return Latency(float(get("latency_ms")))
    if get("speedup") is not None:
        return Speedup(float(get("speedup")))
    return FastestWithinFloor()
