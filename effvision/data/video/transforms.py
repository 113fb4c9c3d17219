"""Train/eval transforms on uint8 (T, 3, H, W) clips (torchvision.transforms.v2): one crop for
every frame, output in torchvision's (C, T, H, W) video layout."""

from __future__ import annotations

import torch
from torchvision.transforms import v2


def _channels_first_in_time(clip: torch.Tensor) -> torch.Tensor:
    return clip.permute(1, 0, 2, 3).contiguous()  # (T, C, H, W) -> (C, T, H, W), torchvision's video layout


def video_train_transform(size: int, mean, std, hflip: bool = False, crop: str = "pad") -> v2.Compose:
    """The same random crop (and flip) for every frame of a uint8 (T, 3, H, W) clip. `pad`: a
    size-px window of the frames as decoded (short side `resize`), so training sees objects and
    motion at the scale evaluation's centre crop does; `resized`: a random-scale crop
    (RandomResizedCrop) for data with varied scale. Flips are a card option: they turn
    left-moving into right-moving."""
    first = (
        v2.RandomResizedCrop(size, scale=(0.5, 1.0), antialias=True)
        if crop == "resized"
        else v2.RandomCrop(size, pad_if_needed=True)
    )
    ops = [first] + ([v2.RandomHorizontalFlip()] if hflip else [])
    return v2.Compose(
        [*ops, v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std), v2.Lambda(_channels_first_in_time)]
    )


def video_eval_transform(size: int, mean, std) -> v2.Compose:
    """A centre crop of frames already decoded at the card's short side (`resize`, at least
    `size`): MMAction2's Resize(-1, resize) + CenterCrop(size), the resize done by the decoder."""
    return v2.Compose(
        [
            v2.CenterCrop(size),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
            v2.Lambda(_channels_first_in_time),
        ]
    )
