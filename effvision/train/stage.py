"""The `train` stage: fine-tune the current model with the one training loop."""

from __future__ import annotations

from typing import Literal

from ..progress import log
from ..recipe import StageConfig
from ..stage import StageResult, register_stage
from .config import TrainSettings
from .loop import fit

# Measured on Lite0 from ImageNet to CIFAR-10 (BENCHMARKS.md): the stage's from-scratch 0.05 moves a
# pretrained body too far in one epoch (0.34 against 0.46 at 0.01); a 10x head did not pay at either rate.
TRANSFER_LR = 0.01
WARMUP_SHARE = 0.3


class TrainStageConfig(TrainSettings, StageConfig):
    type: Literal["train"] = "train"


def transfer_settings(cfg: TrainStageConfig, model) -> tuple[TrainStageConfig, dict]:
    """The stage's settings with transfer learning's defaults where the recipe left them unset,
    when the model starts from pretrained weights (create_model marks it `transfer`; a caller's
    module through effvision.compress counts as pretrained): a learning rate of 0.01 and warm-up
    over at most 30% of the stage, the two that paid when measured (BENCHMARKS.md). Returns them
    and what applied."""
    transfer = getattr(model, "effvision_spec", {}).get("transfer")
    if transfer is None:
        return cfg, {}
    chosen = {}
    if "lr" not in cfg.model_fields_set and cfg.lr > TRANSFER_LR:
        chosen["lr"] = TRANSFER_LR
    # a short fine-tune warms up over at most 30% of its steps (one epoch of a one-epoch run
    # would end at the peak rate)
    warmup = round(WARMUP_SHARE * cfg.epochs, 3)
    if "warmup_epochs" not in cfg.model_fields_set and warmup < cfg.warmup_epochs:
        chosen["warmup_epochs"] = warmup
    return cfg.model_copy(update=chosen), {"pretrained": True, **transfer, "defaults": chosen}


@register_stage("train", TrainStageConfig)
def run_train(ctx, cfg: TrainStageConfig) -> StageResult:
    """Train the current model on the recipe's data (classification)."""
    model = ctx.model
    cfg, transfer = transfer_settings(cfg, model)
    if transfer.get("defaults"):
        said = ", ".join(f"{k}={v}" for k, v in transfer["defaults"].items())
        log(f"  {cfg.name}: fine-tuning a pretrained body: {said} (set them in the recipe to choose otherwise)")
    checkpoint = ctx.epoch_checkpoint(cfg.name, cfg.checkpoint_every)
    res = fit(model, ctx.data, cfg, ctx.device, seed=ctx.seed, label=cfg.name, checkpoint=checkpoint)
    model.effvision_spec.pop("transfer", None)  # trained here: later train stages start from this model
    extra = res.metrics(cfg) | ({"transfer": transfer} if transfer else {})
    return ctx.torch_result(model, accuracy=res.accuracy, time_to_accuracy_s=res.time_to_accuracy_s, extra=extra)
