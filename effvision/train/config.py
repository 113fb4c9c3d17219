"""Training settings shared by every stage that trains (train, distill), and the distillation
settings of every stage that learns from a teacher (distill, prune's fine-tuning, qat)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator

from ..recipe import Strict

Optimizer = Literal["sgd", "nesterov", "momentum", "adamw", "lamb", "lars"]


class TrainSettings(Strict):
    epochs: int = Field(10, ge=0, description="passes over the training split")
    batch_size: Optional[int] = Field(
        None, gt=0, description="default: data.batch_size; the global batch, split over --nproc processes"
    )
    optimizer: Optimizer = Field(
        "sgd",
        description="sgd and nesterov: Nesterov SGD; momentum: plain SGD momentum; lars, lamb: layer-wise trust ratio",
    )
    lookahead: bool = Field(False, description="wrap the optimizer in Lookahead (Zhang et al. 2019)")
    lr: float = Field(0.05, gt=0, description="peak learning rate")
    weight_decay: float = Field(5e-4, ge=0, description="L2 weight decay (decoupled for adamw and lamb)")
    momentum: float = Field(0.9, ge=0, lt=1, description="SGD momentum (the first beta of adamw and lamb)")
    schedule: Literal["onecycle", "cosine", "constant", "step"] = Field(
        "onecycle",
        description="onecycle: linear up over warmup_epochs then linear down (triangular); step: x0.1 at 1/2 and 3/4 "
        "of the epochs",
    )
    warmup_epochs: float = Field(1.0, ge=0, description="epochs of linear learning-rate warm-up")
    # Fine-tuning a pretrained body.
    head_lr_scale: float = Field(
        1.0,
        gt=0,
        description="learning rate of the classifier over the body's (e.g. 10 for a new head on a pretrained body; "
        "measured on Lite0 to CIFAR-10 it did not pay, BENCHMARKS.md)",
    )
    freeze: list[str] = Field(
        default_factory=list,
        description="module names (or name prefixes, e.g. conv_stem, blocks.0) kept as they are for this stage: "
        "no gradient, batch norm statistics fixed; the early layers of a pretrained body, which transfer as they are "
        "and cost the most backward time at high resolution",
    )
    label_smoothing: float = Field(0.0, ge=0, lt=1, description="share of the label mass spread over the other classes")
    ema: bool = Field(False, description="evaluate and keep an exponential moving average of the weights")
    ema_decay: float = Field(0.998, gt=0, lt=1, description="the moving average's decay per step")
    channels_last: bool = Field(False, description="train in NHWC memory format")
    amp: Literal["auto", "off", "bf16", "fp16"] = Field(
        "auto", description="mixed precision; auto: bf16 or fp16 on a GPU that has it, off on the CPU"
    )
    compile: bool = Field(
        False, description="torch.compile the training forward; compilation is timed apart from training"
    )
    grad_clip: Optional[float] = Field(None, gt=0, description="clip the gradients' global norm to this")
    hard_fraction: Optional[float] = Field(
        None, gt=0, le=1, description="selective backprop: train on this highest-loss fraction of each batch"
    )
    # Data-path and image tricks (airbench's craft); the image ones are errors for other modalities.
    tensor_data: Optional[bool] = Field(
        None,
        description="batched training data: the split held as one tensor (images; a memory-mapped decoded cache "
        "when it does not fit memory) or read from the point cache, augmented whole batches at a time. Default: "
        "wherever the data allows (images cropped `pad`, points not voxel-sampled); false: the per-sample "
        "DataLoader path",
    )
    translate: Optional[int] = Field(
        None,
        ge=0,
        description="tensor_data: random translation in pixels (default: image size / 8, like the per-sample crop)",
    )
    whiten: bool = Field(
        False, description="initialise the first conv from the data: whitened patch directions (airbench)"
    )
    progressive_sizes: Optional[list[int]] = Field(
        None, description="train the epochs in equal parts at these image sizes, e.g. [24, 28, 32]"
    )
    tta_flip: bool = Field(False, description="evaluate on the average of each image and its mirror")
    # Time-to-accuracy.
    target_accuracy: Optional[float] = Field(None, gt=0, le=1, description="records time-to-accuracy")
    stop_at_target: bool = Field(False, description="stop training once target_accuracy is reached")
    max_train_s: Optional[float] = Field(
        None, gt=0, description="stop training after this many seconds (evaluation excluded)"
    )
    # Long runs.
    checkpoint_every: int = Field(
        1,
        ge=0,
        description="save the whole training state every this many epochs (and after the last), so a killed "
        "stage resumes after its last saved epoch; 0: off",
    )

    @field_validator("progressive_sizes")
    @classmethod
    def _sizes(cls, v: Optional[list[int]]) -> Optional[list[int]]:
        if v is not None and (not v or min(v) < 8):
            raise ValueError("progressive_sizes must list image sizes of at least 8 px")
        return v


class LogitDistillSettings(Strict):
    """Hinton et al.'s soft-target loss, mixed with the label loss."""

    temperature: float = Field(4.0, gt=0, description="softens both models' logits in the soft-target loss")
    alpha: float = Field(0.9, ge=0, le=1, description="weight of the soft (teacher) loss")


class FeatureDistillSettings(Strict):
    """Intermediate features matched beside the logits (features.py)."""

    method: Literal["fitnet", "attention", "both"] = Field(
        "fitnet",
        description="fitnet: features through learned 1x1 adapters, mean squared error; attention: spatial "
        "attention maps (attention transfer); both",
    )
    layers: Optional[list[str]] = Field(
        None, description="module names to match (default: timm's feature_info, else the end of every stage)"
    )
    weight: float = Field(1.0, gt=0, description="weight of the FitNets loss, per layer")
    # The paper's beta, 1000, wrecked a pruned speednet's fine-tune on CIFAR-10 (top-1 0.19-0.43
    # against 0.76-0.78 without; its maps differ more than the paper's ResNets'); 100 trained normally.
    attention_weight: float = Field(100.0, gt=0, description="attention transfer's beta, per layer")


class DistillSettings(LogitDistillSettings):
    features: Optional[FeatureDistillSettings] = Field(
        None, description="also match intermediate features: {method: fitnet|attention|both, layers, weight}"
    )
