"""Test-time views for video (MMAction2's multi-clip, multi-crop testing): each validation video
is seen as `clips` clips at evenly spaced positions times `crops` spatial crops, and the class
scores are averaged. Accuracy rises with views and so does the cost, clips x crops forward passes
per video: the efficient setting and the accurate one differ, so both are measured."""

from __future__ import annotations

import numpy as np
import torch

from ...errors import EffvisionError


def crop_offsets(length: int, size: int, crops: int) -> list[int]:
    """Start offsets of `crops` windows of `size` along a side of `length`: the centre for one,
    start/centre/end for three."""
    room = max(0, length - size)
    return [room // 2] if crops == 1 else [round(room * k / (crops - 1)) for k in range(crops)]


class ViewsDataset(torch.utils.data.Dataset):
    """(views, C, T, size, size) float tensors of a VideoDataset (or a Subset of one), normalised
    like evaluation clips. Crops are cut from the frames as decoded (short side = the card's
    `resize`): with one clip and one crop this is exactly the evaluation transform."""

    def __init__(self, videos, clips: int, crops: int, size: int, mean, std):
        if clips < 1 or crops not in (1, 3):
            raise EffvisionError(f"views: clips must be >= 1 and crops 1 or 3, got clips={clips}, crops={crops}")
        self.indices = list(videos.indices) if isinstance(videos, torch.utils.data.Subset) else list(range(len(videos)))
        self.videos = videos.dataset if isinstance(videos, torch.utils.data.Subset) else videos
        if not hasattr(self.videos, "read"):
            raise EffvisionError("test-time views (clips, crops) apply to video datasets")
        self.clips, self.crops, self.size = clips, crops, size
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int):
        from torchvision.transforms.v2 import functional as TF

        i, views, decoded = self.indices[k], [], 0
        for j in range(self.clips):
            clip, n = self.videos.read(
                i, position=(j + 0.5) / self.clips
            )  # uint8 (T, 3, H, W) at the decoded short side
            decoded += n
            clip = TF.resize(clip, self.size, antialias=True) if min(clip.shape[-2:]) < self.size else clip
            clip = (clip.float() / 255 - self.mean) / self.std
            h, w = clip.shape[-2:]
            tall = h > w
            for off in crop_offsets(h if tall else w, self.size, self.crops):
                top, left = (off, (w - self.size) // 2) if tall else ((h - self.size) // 2, off)
                views.append(clip[..., top : top + self.size, left : left + self.size].transpose(0, 1))
        return torch.stack(views), self.videos.targets[i], decoded


def views_accuracy(predict, loader) -> tuple[float, float]:
    """Top-1 of the class probabilities averaged over every view of a video, and the frames
    decoded per video to get them."""
    correct = total = decoded = 0
    for x, y, frames in loader:
        b, v = x.shape[:2]
        logits = predict(x.flatten(0, 1))
        logits = torch.as_tensor(np.asarray(logits.detach().cpu() if isinstance(logits, torch.Tensor) else logits))
        probs = logits.float().softmax(-1).reshape(b, v, -1).mean(1)
        correct += int((probs.argmax(1) == torch.as_tensor(y)).sum())
        total += b
        decoded += int(torch.as_tensor(frames).sum())
    return correct / max(total, 1), decoded / max(total, 1)
