"""The `train` stage: fine-tune the current model with the one training loop."""

from __future__ import annotations

from typing import Literal

from ..recipe import StageConfig
from ..stage import StageResult, register_stage
from .config import TrainSettings
from .loop import fit


class TrainStageConfig(TrainSettings, StageConfig):
    type: Literal["train"] = "train"


@register_stage("train", TrainStageConfig)
def run_train(ctx, cfg: TrainStageConfig) -> StageResult:
    """Train the current model on the recipe's data (classification)."""
    model = ctx.model
    checkpoint = ctx.epoch_checkpoint(cfg.name, cfg.checkpoint_every)
    res = fit(model, ctx.data, cfg, ctx.device, seed=ctx.seed, label=cfg.name, checkpoint=checkpoint)
    return ctx.torch_result(
        model, accuracy=res.accuracy, time_to_accuracy_s=res.time_to_accuracy_s, extra=res.metrics(cfg)
    )
