"""Fine-tuning inside a prune stage: distillation from the model that entered it, in the one
training loop, then batch-norm statistics recomputed for the pruned widths."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ..progress import log
from ..train.config import DistillSettings, TrainSettings


class FinetuneSettings(TrainSettings, DistillSettings):
    """The distillation after each pruning step and, aiming at a target, at the end (teacher: the
    model entering the stage)."""

    epochs: int = Field(8, ge=0, description="aiming at a target: the final distillation's epochs")
    # A one-epoch fine-tune under the loop's default one-cycle warm-up would end at its peak rate.
    schedule: Literal["onecycle", "cosine", "constant", "step"] = Field("cosine", description="learning-rate schedule")
    warmup_epochs: float = Field(0.0, ge=0, description="epochs of linear learning-rate warm-up")
    step_epochs: int = Field(1, ge=0, description="epochs of distillation after each pruning step")
    lr: float = Field(0.02, gt=0, description="peak learning rate")


def training_order(n: int):
    """One fixed random order of a training split's n samples: batch norm is recalibrated on its
    head, and pruning candidates are scored on what follows (width_search.py)."""
    import numpy as np

    return np.random.default_rng(0).permutation(n)


def recalibrate_batchnorm(model, data, samples: int = 1024) -> None:
    """Batch-norm statistics recomputed on training images (torch's update_bn): a layer pruned
    upstream sees other inputs, and a short fine-tune moves the running averages only part of the
    way. Digits ResNet-8 with its stem cut from 32 to 8 channels: top-1 0.20 -> 0.75 by this alone;
    after one epoch of distillation 0.31 without it, 0.98 with it."""
    from torch.optim.swa_utils import update_bn

    # a random subset: the split's first samples can all be one class (CIFAR-10's folders, in order:
    # the first 1024 airplanes took a pruned speednet from 0.776 to 0.652)
    picked = training_order(len(data.train))[:samples]
    loader = data.train_eval_loader(sorted(picked.tolist()), batch_size=128)
    device = next(model.parameters()).device
    update_bn(loader, model, device)
    model.eval()


def finetune(ctx, model, teacher, s: FinetuneSettings, epochs: int, label: str, after_backward=None):
    """`epochs` of distillation (none: the statistics alone), then batch-norm recomputed;
    after_backward: fit's hook on each batch's gradients. Returns the feature layers distilled
    (fit's record), None without features."""
    from ..train.loop import fit

    features = None
    if epochs > 0:
        settings = s.model_copy(update={"epochs": epochs})
        features = fit(
            model,
            ctx.full_data,  # the teacher sees the data's own size; the model, the size a plan kept
            settings,
            ctx.device,
            ctx.seed,
            teacher,
            s,
            label,
            after_backward=after_backward,  # torch-pruning's group-norm regulariser keeps no state
            checkpoint=ctx.epoch_checkpoint(label, s.checkpoint_every),
            student_size=ctx.student_size,
        ).features
        statistics = better_statistics(ctx, model)
        log(
            f"  {label}: batch-norm statistics {statistics['kept']} (top-1 on {statistics['scored_on']}: "
            f"{statistics['trained']:.4f} as trained, {statistics['recomputed']:.4f} recomputed)"
        )
        ctx.notes.setdefault("batchnorm", []).append({"after": label, **statistics})
    else:
        recalibrate_batchnorm(model, ctx.data)
    return features


def better_statistics(ctx, model, samples: int = 2000) -> dict:
    """After a distillation, the batch-norm statistics it ended with or recomputed ones, whichever
    scores better on the decision split: recomputing fits the pruned widths, but after a long
    distillation the running averages already have, and recomputing them lost 0.4-0.5 points of the
    loop's last evaluation on the fine-tuned Lite0."""
    trained = ctx.decisions.score_model(model, samples, ctx.seed + 1)
    kept = {k: v.clone() for k, v in model.state_dict().items() if k.endswith(("running_mean", "running_var"))}
    recalibrate_batchnorm(model, ctx.data)
    recomputed = ctx.decisions.score_model(model, samples, ctx.seed + 1)
    where = ctx.decisions.where(samples)
    if trained > recomputed:
        model.load_state_dict(kept, strict=False)
    return {
        "kept": "as trained" if trained > recomputed else "recomputed",
        "trained": trained,
        "recomputed": recomputed,
        "scored_on": where,
    }
