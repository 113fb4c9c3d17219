"""When int8 must pay, and how that is timed: the batches a speed decision is measured at (the
stage's own, else the one the model ships at) and the backend it is timed on (the target's, where
it runs the file's runtime, else the runtime's default)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field, field_validator

from ..int8 import Timing
from ..recipe import Strict


class SpeedCheckSettings(Strict):
    """How an int8 stage (quantize, qat) times int8 against fp32 before it ships."""

    require_faster: bool = Field(
        True, description="ship int8 only when it is measured faster than the fp32 file at the decision's batches"
    )
    batches: Optional[list[int]] = Field(
        None,
        description="batches the speed decisions are measured at (default: the one the model ships at, the "
        "recipe's target.batch, else 1)",
    )
    warmup: int = Field(5, ge=0, description="untimed calls per file and batch before timing")
    repeats: int = Field(40, ge=4, description="timed calls per file and batch, interleaved in 8 rounds")

    @field_validator("batches")
    @classmethod
    def _positive_batches(cls, v):
        if v is not None and (not v or min(v) < 1):
            raise ValueError("batches must be a non-empty list of positive sizes")
        return v


def decision_batches(ctx, cfg: SpeedCheckSettings | None) -> tuple[list[int], str]:
    """The batches int8 must pay at, and why those: the stage's own `batches`, else the one the
    model ships at (the recipe's target.batch, else 1: a file runs one input at a time unless
    the recipe says otherwise)."""
    if cfg is not None and cfg.batches:
        return sorted(set(cfg.batches)), "the stage's batches"
    target = getattr(ctx.recipe, "target", None)
    if target is not None:
        return [target.batch], f"batch {target.batch}, where the model ships (the recipe's target.batch)"
    return [1], "batch 1, where the model ships (the recipe sets no target.batch)"


def timing_backend(ctx, runtime) -> str:
    """The target's backend where it runs this runtime's files, else the runtime's own."""
    target = getattr(ctx.recipe, "target", None)
    if target is not None and target.backend in runtime.backends():
        return target.backend
    return runtime.default_backend


def speed_timing(
    ctx, cfg: SpeedCheckSettings | None, warmup: int | None = None, repeats: int | None = None, backend=None
) -> Timing:
    """Interleaved timing at the decision's batches (decision_batches) on `backend` (default ONNX
    Runtime's CPU backend), with the stage's warm-up and repeats unless given."""
    batches, _ = decision_batches(ctx, cfg)
    warmup = cfg.warmup if warmup is None else warmup
    repeats = cfg.repeats if repeats is None else repeats
    kw = {} if backend is None else {"backend": backend}
    return Timing(ctx.input_shape, batches, warmup, repeats, rounds=min(8, repeats), **kw)
