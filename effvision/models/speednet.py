"""A compact residual net for fast CIFAR-scale training, after airbench (Jordan, "94% on CIFAR-10
in 3.29 seconds on a single GPU", 2024) and its ResNet-9 ancestors (Page, "How to train your
ResNet", 2018): a 2x2 stem meant for patch-whitening initialisation, then three blocks of
conv -> max-pool -> BN -> GELU -> conv -> BN -> GELU with a residual connection around the second
conv, global max-pooling and a linear head with a fixed logit scale.

Pooling right after each block's first conv runs most of the net at a quarter of the pixels,
which is what makes it cheap; widths are read from layer shapes at run time (pruning-friendly).
"""

from __future__ import annotations

import torch
from torch import nn

from ..registry import MODELS
from .contract import LinearHead


class SpeedBlock(nn.Module):
    def __init__(self, cin: int, cout: int, bn_momentum: float):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.bn1 = nn.BatchNorm2d(cout, momentum=bn_momentum)
        self.act1 = nn.GELU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout, momentum=bn_momentum)
        self.act2 = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act1(self.bn1(self.pool(self.conv1(x))))
        return self.act2(x + self.bn2(self.conv2(x)))


class SpeedNet(LinearHead, nn.Module):
    def __init__(
        self,
        num_classes: int = 10,
        widths: tuple[int, int, int] = (32, 64, 128),
        stem_width: int = 24,
        in_chans: int = 3,
        bn_momentum: float = 0.4,
        logit_scale: float = 1 / 9,
    ):
        super().__init__()
        # The stem has no padding: a 2x2 patch filter (whitened from data) on the raw image.
        self.stem = nn.Sequential(nn.Conv2d(in_chans, stem_width, 2, 1, 0, bias=True), nn.GELU())
        blocks, cin = [], stem_width
        for w in widths:
            blocks.append(SpeedBlock(cin, int(w), bn_momentum))
            cin = int(w)
        self.blocks = nn.Sequential(*blocks)
        self.pool = GlobalMaxPool()
        self.fc = nn.Linear(cin, num_classes, bias=False)
        self.logit_scale = logit_scale  # a fixed temperature (airbench: 1/9), not a parameter

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.stem(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = torch.flatten(self.pool(x), 1)
        return x if pre_logits else self.fc(x) * self.logit_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


class GlobalMaxPool(nn.Module):
    """The largest value of each channel, as (N, C, 1, 1): AdaptiveMaxPool2d(1) written as amax,
    which ExecuTorch lowers (adaptive_max_pool2d is outside its core ATen opset) and ONNX exports
    as one ReduceMax."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.amax(dim=(2, 3), keepdim=True)


@MODELS.register("speednet")
def speednet(num_classes: int = 10, **kwargs) -> SpeedNet:
    return SpeedNet(num_classes=num_classes, **kwargs)
