"""Point-cloud transforms: (N, C) float32 arrays in, (C, N) tensors out (Conv1d layout).

Training augmentations follow PointNet/PointNet++: rotation about the up axis, anisotropic
scale, clipped Gaussian jitter and random point dropout (dropped points repeat the first point,
so the count stays fixed and max pooling is unaffected). They draw from torch's RNG, which the
training loop seeds and DataLoader workers reseed."""

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


class PointTrainTransform:
    def __init__(self, augment, up_axis: str = "z"):
        self.augment, self.up = augment, AXES[up_axis]

    def __call__(self, points: np.ndarray) -> torch.Tensor:
        a = self.augment
        p = torch.from_numpy(np.array(points, dtype=np.float32))
        xyz = p[:, :3]
        if a.rotate:
            xyz = xyz @ torch.from_numpy(rotation_about(self.up, float(torch.rand(()) * 2 * math.pi))).float().T
        lo, hi = a.scale
        if hi > lo or lo != 1.0:
            xyz = xyz * (lo + (hi - lo) * torch.rand(3))
        if a.jitter > 0:
            xyz = xyz + (torch.randn_like(xyz) * a.jitter).clamp(-5 * a.jitter, 5 * a.jitter)
        p[:, :3] = xyz
        if a.dropout > 0:
            drop = torch.rand(len(p)) < float(torch.rand(())) * a.dropout
            p[drop] = p[0].clone()
        return p.T.contiguous()


def point_eval_transform(points: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(points.T, dtype=np.float32))
