"""Training settings shared by every stage that trains (train, distill)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from ..recipe import Strict


Optimizer = Literal["sgd", "nesterov", "momentum", "adamw", "lamb", "lars"]


class TrainSettings(Strict):
    epochs: int = Field(10, ge=0)
    batch_size: Optional[int] = Field(None, gt=0, description="default: data.batch_size")
    optimizer: Optimizer = "sgd"
    lr: float = Field(0.05, gt=0)
    weight_decay: float = Field(5e-4, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    schedule: Literal["onecycle", "cosine", "constant"] = "onecycle"
    warmup_epochs: float = Field(1.0, ge=0)
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    ema: bool = False
    ema_decay: float = Field(0.998, gt=0, lt=1)
    channels_last: bool = False
    amp: Literal["auto", "off", "bf16", "fp16"] = "auto"
    grad_clip: Optional[float] = Field(None, gt=0)
    hard_fraction: Optional[float] = Field(None, gt=0, le=1, description="selective backprop: train on this highest-loss fraction of each batch")
    target_accuracy: Optional[float] = Field(None, gt=0, le=1, description="records time-to-accuracy")
