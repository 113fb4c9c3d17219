"""Train/eval transforms on uint8 CHW images (torchvision.transforms.v2)."""

from __future__ import annotations

import torch
from torchvision.transforms import v2


def train_transform(
    size: int, mean, std, hflip: bool = True, crop: str = "pad", interpolation: str = "bilinear"
) -> v2.Compose:
    mode = v2.InterpolationMode(interpolation)
    ops = (
        [v2.RandomResizedCrop(size, scale=(0.35, 1.0), interpolation=mode, antialias=True)]
        if crop == "resized"
        else [
            v2.Resize(size, interpolation=mode, antialias=True),
            v2.CenterCrop(size),
            v2.RandomCrop(size, padding=size // 8, padding_mode="reflect"),
        ]
    )
    if hflip:
        ops.append(v2.RandomHorizontalFlip())
    return v2.Compose([*ops, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])


def eval_transform(size: int, mean, std, resize: int | None = None, interpolation: str = "bilinear") -> v2.Compose:
    """Short side to `resize` (default `size`), centre crop `size`, normalise: timm's evaluation
    pipeline when resize = size / crop fraction (a pretrained card's `preprocessing`)."""
    return v2.Compose(
        [
            v2.Resize(resize or size, interpolation=v2.InterpolationMode(interpolation), antialias=True),
            v2.CenterCrop(size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
        ]
    )
