"""The `train` stage: fine-tune the current model with the one training loop."""

from __future__ import annotations

from typing import Literal

from ..progress import log
from ..recipe import StageConfig
from ..stage import StageResult, register_stage
from .config import TrainSettings
from .loop import fit

# Batch-norm statistics from fewer images than this per process are noisier than pretrained ones.
SMALL_BATCH = 16
NEW_HEAD_LR_SCALE = 10.0
WARMUP_SHARE = 0.3


class TrainStageConfig(TrainSettings, StageConfig):
    type: Literal["train"] = "train"


def transfer_settings(cfg: TrainStageConfig, model, per_process_batch: int) -> tuple[TrainStageConfig, dict]:
    """The stage's settings with transfer learning's defaults where the recipe left them unset,
    when the model starts from pretrained weights (create_model marks it `transfer`; a caller's
    module through effvision.compress counts as pretrained): the new head learns 10x faster than
    the body, small batches keep the batch norms' statistics, and warm-up takes at most 30% of
    the stage. Returns them and what applied."""
    transfer = getattr(model, "effvision_spec", {}).get("transfer")
    if transfer is None:
        return cfg, {}
    chosen = {}
    if cfg.head_lr_scale is None and transfer.get("new_head"):
        chosen["head_lr_scale"] = NEW_HEAD_LR_SCALE
    if cfg.freeze_bn is None and per_process_batch < SMALL_BATCH:
        chosen["freeze_bn"] = True
    # a short fine-tune warms up over at most 30% of its steps (one epoch of a one-epoch run
    # would end at the peak rate)
    warmup = round(WARMUP_SHARE * cfg.epochs, 3)
    if "warmup_epochs" not in cfg.model_fields_set and warmup < cfg.warmup_epochs:
        chosen["warmup_epochs"] = warmup
    return cfg.model_copy(update=chosen), {"pretrained": True, **transfer, "defaults": chosen}


@register_stage("train", TrainStageConfig)
def run_train(ctx, cfg: TrainStageConfig) -> StageResult:
    """Train the current model on the recipe's data (classification)."""
    from .distributed import world

    model = ctx.model
    batch = cfg.batch_size or ctx.data.config.batch_size
    cfg, transfer = transfer_settings(cfg, model, max(1, batch // world()))
    if transfer.get("defaults"):
        said = ", ".join(f"{k}={v}" for k, v in transfer["defaults"].items())
        log(f"  {cfg.name}: fine-tuning a pretrained body: {said} (set them in the recipe to choose otherwise)")
    checkpoint = ctx.epoch_checkpoint(cfg.name, cfg.checkpoint_every)
    res = fit(model, ctx.data, cfg, ctx.device, seed=ctx.seed, label=cfg.name, checkpoint=checkpoint)
    model.effvision_spec.pop("transfer", None)  # trained here: later train stages start from this model
    extra = res.metrics(cfg) | ({"transfer": transfer} if transfer else {})
    return ctx.torch_result(model, accuracy=res.accuracy, time_to_accuracy_s=res.time_to_accuracy_s, extra=extra)
