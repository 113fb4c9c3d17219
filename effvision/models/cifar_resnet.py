"""A compact CIFAR-style residual network (He et al., "Deep Residual Learning for Image
Recognition", CVPR 2016, section 4.2), sized to a few hundred thousand parameters for fast CPU work.

Every width is read from layer shapes at run time, so a structurally pruned copy runs unpatched.
"""

from __future__ import annotations

import torch
from torch import nn

from ..registry import MODELS
from .contract import LinearHead


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.act = nn.ReLU(inplace=True)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.act(out + self.shortcut(x))


class CifarResNet(LinearHead, nn.Module):
    """Stem + three stages (strides 1, 2, 2) of basic blocks + global pool + linear head."""

    def __init__(
        self, num_classes: int = 10, width: float = 1.0, depth: int = 8, in_chans: int = 3, drop_rate: float = 0.0
    ):
        super().__init__()
        if (depth - 2) % 6:
            raise ValueError("depth must be 6n+2 (8, 14, 20, ...)")
        blocks = (depth - 2) // 6
        widths = [max(8, int(round(c * width))) for c in (32, 64, 128)]
        self.stem = nn.Sequential(
            nn.Conv2d(in_chans, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)
        )
        layers, cin = [], widths[0]
        for i, cout in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if (b == 0 and i > 0) else 1))
                cin = cout
        self.stages = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(cin, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(torch.flatten(self.pool(x), 1))
        return x if pre_logits else self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


@MODELS.register("cifar_resnet8")
def cifar_resnet8(num_classes: int = 10, **kwargs) -> CifarResNet:
    return CifarResNet(num_classes=num_classes, depth=8, **kwargs)


@MODELS.register("cifar_resnet20")
def cifar_resnet20(num_classes: int = 10, **kwargs) -> CifarResNet:
    return CifarResNet(num_classes=num_classes, depth=20, **kwargs)
