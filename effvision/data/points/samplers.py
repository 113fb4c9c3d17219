"""Downsampling for point clouds (registered in SAMPLERS): which points of a cloud a model sees.
Fewer points is data compression for points; each sampler reports the points and bytes it kept.

- fps: farthest-point sampling to N points (PointNet++'s choice: even coverage of the shape), by
  open3d, ordered coarse to fine (each prefix of N/2, N/4, ... points is itself an FPS sample).
- voxel: one point per occupied voxel of `voxel_size` (open3d's voxel grid), then N of those.
- random: N points drawn uniformly without replacement.
- uniform: N points at evenly spaced indices (cheap; follows the file's point order).

Every sampler returns exactly N points (repeating points when a cloud has fewer), so clouds batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ...errors import EffvisionError
from ...registry import SAMPLERS
from ..samplers import make_sampler


@dataclass
class Sampled:
    points: np.ndarray  # (num_points, C) float32
    kept: int  # distinct input points kept
    bytes_kept: int


def farthest_point_indices(xyz: np.ndarray, k: int, start: int = 0) -> np.ndarray:
    """Indices of k points, each the farthest from those chosen before, by open3d's
    farthest_point_down_sample (15-25x faster than a NumPy loop, BENCHMARKS.md). open3d returns
    points, not indices: the indices ride along as the cloud's normals and come back exactly."""
    from .io import open3d_module

    o3d = open3d_module()
    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(xyz[:, :3], dtype=np.float64)))
    cloud.normals = o3d.utility.Vector3dVector(np.repeat(np.arange(len(xyz), dtype=np.float64)[:, None], 3, axis=1))
    picked = cloud.farthest_point_down_sample(min(k, len(xyz)), start)
    return np.asarray(picked.normals)[:, 0].astype(np.int64)


def fill_sampled(points: np.ndarray, idx: np.ndarray, n: int, rng: np.random.Generator) -> Sampled:
    """Exactly n points from the chosen indices, repeating random ones when there are fewer."""
    kept = len(idx)
    if kept < n:
        idx = np.concatenate([idx, rng.choice(idx, n - kept)])
    out = np.ascontiguousarray(points[idx[:n]], dtype=np.float32)
    return Sampled(out, min(kept, n), int(min(kept, n) * points.shape[1] * 4))


class PointSampler:
    modality = "points"

    def __init__(self, num_points: int = 1024):
        if num_points < 1:
            raise EffvisionError(f"num_points must be at least 1, got {num_points}")
        self.num_points = num_points

    def indices(self, points: np.ndarray, train: bool, rng: np.random.Generator) -> np.ndarray:
        raise NotImplementedError

    def batch_indices(self, batch: int, points: int, gen: torch.Generator) -> torch.Tensor | None:
        """(batch, num_points) indices into clouds of `points` points each, drawn for a whole
        batch at once; None where the sampler needs each cloud's own points (per-sample path)."""
        return None

    def __call__(self, points: np.ndarray, train: bool = False, rng: np.random.Generator | None = None) -> Sampled:
        rng = rng or np.random.default_rng(0)
        return fill_sampled(points, self.indices(points, train, rng), self.num_points, rng)


def coarse_to_fine(xyz: np.ndarray, idx: np.ndarray, smallest: int = 16) -> np.ndarray:
    """idx reordered so that every prefix of half, a quarter, ... of the points is itself a
    farthest-point sample of the longer prefix (nested FPS; open3d returns points in file order).
    A network may then take the first M points as its centroids (PointNet++'s prefix variant)
    with no sampling inside the network, which keeps it exportable."""
    finer, cur = [], idx
    while len(cur) >= 2 * smallest:
        half = farthest_point_indices(xyz[cur], len(cur) // 2)
        rest = np.ones(len(cur), bool)
        rest[half] = False
        finer.append(cur[rest])
        cur = cur[half]
    return np.concatenate([cur, *finer[::-1]])


@SAMPLERS.register("fps")
class FarthestPointSampler(PointSampler):
    """Farthest-point sampling, points ordered coarse to fine (coarse_to_fine); a random start
    point in training, the first point otherwise. A cached dataset computes each cloud's order
    once for `starts` start points (the first point, then random ones) and training draws among
    them, instead of sampling afresh on every draw (points.py)."""

    def __init__(self, num_points: int = 1024, starts: int = 8):
        super().__init__(num_points)
        if starts < 1:
            raise EffvisionError(f"starts must be at least 1, got {starts}")
        self.starts = starts

    def order(self, points: np.ndarray, start: int = 0) -> np.ndarray:
        xyz = points[:, :3].astype(np.float64)
        return coarse_to_fine(xyz, farthest_point_indices(xyz, self.num_points, start))

    def start_points(self, points: int, seed: int) -> list[int]:
        """The cached start points of one cloud: its first point, then random ones (seeded by the cloud)."""
        rest = np.random.default_rng(seed).integers(points, size=self.starts - 1)
        return [0, *(int(s) for s in rest)]

    def indices(self, points, train, rng):
        return self.order(points, int(rng.integers(len(points))) if train else 0)


@SAMPLERS.register("random")
class RandomPointSampler(PointSampler):
    """Uniformly random points (a fixed draw per cloud outside training)."""

    def indices(self, points, train, rng):
        return rng.choice(len(points), min(self.num_points, len(points)), replace=False)

    def batch_indices(self, batch, points, gen):
        return torch.rand(batch, points, generator=gen).argsort(1)[:, : self.num_points]


@SAMPLERS.register("uniform")
class UniformPointSampler(PointSampler):
    """Evenly spaced indices through the cloud's point order."""

    def indices(self, points, train, rng):
        n = len(points)
        return np.linspace(0, n - 1, min(self.num_points, n)).round().astype(np.int64)

    def batch_indices(self, batch, points, gen):
        return torch.from_numpy(self.indices(np.empty(points), False, None)).expand(batch, -1)


@SAMPLERS.register("voxel")
class VoxelPointSampler(PointSampler):
    """One original point per occupied voxel (the first in file order; open3d's
    voxel_down_sample would average each voxel into a new point), then num_points of those at
    random. voxel_size in the cloud's units (0.02-0.05 suits shapes in the unit sphere)."""

    def __init__(self, num_points: int = 1024, voxel_size: float = 0.03):
        super().__init__(num_points)
        if voxel_size <= 0:
            raise EffvisionError(f"voxel_size must be positive, got {voxel_size}")
        self.voxel_size = voxel_size

    def indices(self, points, train, rng):
        cells = np.floor(points[:, :3] / self.voxel_size).astype(np.int64)
        _, first = np.unique(cells, axis=0, return_index=True)
        return rng.choice(first, self.num_points, replace=False) if len(first) > self.num_points else first


def get_point_sampler(name: str, num_points: int = 1024, **options) -> PointSampler:
    """A point-cloud sampler by name; unknown names and options list the valid ones."""
    return make_sampler(name, "points", {"num_points": num_points}, options)


def normalize_unit_sphere(points: np.ndarray) -> np.ndarray:
    """Centre xyz on the centroid and scale into the unit sphere (other channels untouched)."""
    out = points.astype(np.float32, copy=True)
    out[:, :3] -= out[:, :3].mean(axis=0)
    radius = float(np.sqrt((out[:, :3] ** 2).sum(axis=1)).max())
    if radius > 0:
        out[:, :3] /= radius
    return out
