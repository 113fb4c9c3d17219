"""Patch-whitening initialisation of a network's first convolution (airbench, Jordan 2024; after
Coates & Ng 2011): its filters become the principal directions of the training images' patches,
each scaled to unit variance, paired with its negative so a ReLU after it keeps both signs. The
first layer then starts out decorrelating its input, which shortens training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EffvisionError


def first_conv(model: nn.Module) -> nn.Conv2d:
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    if conv is None or conv.groups != 1:
        raise EffvisionError(f"whiten: {type(model).__name__} has no plain 2-D convolution to initialise")
    return conv


def whitening_filters(images: torch.Tensor, kernel: tuple[int, int], count: int, eps: float = 5e-4) -> torch.Tensor:
    """`count` filters (count x C x kh x kw) from normalised float images N x C x H x W: the
    eigenvectors of the patch covariance scaled by 1/sqrt(eigenvalue + eps), largest first, each
    followed by its negative."""
    c = images.shape[1]
    patches = F.unfold(images.float(), kernel).transpose(1, 2).reshape(-1, c * kernel[0] * kernel[1]).double()
    patches = patches - patches.mean(0)
    cov = patches.T @ patches / len(patches)
    eigvals, eigvecs = torch.linalg.eigh(cov)  # ascending
    scaled = (eigvecs / (eigvals.clamp(min=0) + eps).sqrt()).T.flip(0)  # rows: directions, largest variance first
    paired = torch.stack([scaled, -scaled], 1).reshape(-1, scaled.shape[1])
    return paired[:count].float().reshape(-1, c, *kernel)


@torch.no_grad()
def whiten_first_conv(model: nn.Module, images: torch.Tensor) -> int:
    """Set the first conv's filters from images (normalised, as the model sees them); filters
    beyond twice the patch size keep their initialisation. Returns how many were set."""
    conv = first_conv(model)
    if images.shape[1] != conv.in_channels:
        raise EffvisionError(
            f"whiten: the first conv takes {conv.in_channels} channels, the images have {images.shape[1]}"
        )
    filters = whitening_filters(images, conv.kernel_size, conv.out_channels)
    conv.weight[: len(filters)] = filters.to(conv.weight)
    return len(filters)
