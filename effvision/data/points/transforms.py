"""Point-cloud transforms: (N, C) float32 arrays in, (C, N) tensors out (Conv1d layout).

Training augmentations follow PointNet/PointNet++: rotation about the up axis, anisotropic
scale, clipped Gaussian jitter and random point dropout (dropped points repeat the first point,
so the count stays fixed and max pooling is unaffected). `augment_points` does them for a whole
batch at once with tensor ops; the per-sample transform is that on a batch of one. They draw from
the generator given, else torch's RNG, which the training loop seeds and DataLoader workers reseed."""

from __future__ import annotations

import math

import numpy as np
import torch

AXES = {"x": 0, "y": 1, "z": 2}


def rotation_about(axis: int, angle: float) -> np.ndarray:
    """The 3x3 rotation by `angle` radians about axis 0, 1 or 2 (x, y, z)."""
    c, s = math.cos(angle), math.sin(angle)
    i, j = [a for a in range(3) if a != axis]
    r = np.eye(3)
    r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


def rotations_about(axis: int, angles: torch.Tensor) -> torch.Tensor:
    """(B, 3, 3) rotations by `angles` (B,) radians about axis 0, 1 or 2."""
    c, s = angles.cos(), angles.sin()
    i, j = [a for a in range(3) if a != axis]
    r = torch.eye(3, dtype=angles.dtype).repeat(len(angles), 1, 1)
    r[:, i, i], r[:, i, j], r[:, j, i], r[:, j, j] = c, -s, s, c
    return r


def augment_points(p: torch.Tensor, augment, up: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """A (B, N, C) float batch augmented per cloud (each its own angle, scale, noise and dropout);
    returns a new tensor, p is not changed."""
    a = augment
    b, n, _ = p.shape
    xyz = p[..., :3]
    if a.rotate:
        xyz = xyz @ rotations_about(up, torch.rand(b, generator=gen) * 2 * math.pi).transpose(1, 2)
    lo, hi = a.scale
    if hi > lo or lo != 1.0:
        xyz = xyz * (lo + (hi - lo) * torch.rand(b, 1, 3, generator=gen))
    if a.jitter > 0:
        noise = torch.randn(xyz.shape, generator=gen) * a.jitter
        xyz = xyz + noise.clamp(-5 * a.jitter, 5 * a.jitter)
    p = torch.cat([xyz, p[..., 3:]], dim=-1)
    if a.dropout > 0:
        drop = torch.rand(b, n, generator=gen) < torch.rand(b, 1, generator=gen) * a.dropout
        p = torch.where(drop[..., None], p[:, :1], p)
    return p


class PointTrainTransform:
    def __init__(self, augment, up_axis: str = "z"):
        self.augment, self.up = augment, AXES[up_axis]

    def __call__(self, points: np.ndarray) -> torch.Tensor:
        p = torch.from_numpy(np.array(points, dtype=np.float32))[None]
        return augment_points(p, self.augment, self.up)[0].T.contiguous()


def point_eval_transform(points: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(points.T, dtype=np.float32))
