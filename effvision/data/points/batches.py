"""Point-cloud training batches made a batch at a time from the cache (no per-sample Python).

One gather of the batch's cached clouds, one of their sampled points (a cached farthest-point
order, or random/uniform indices drawn for the whole batch), then augment_points on the batch:
the same samples the per-sample path makes, without its per-cloud calls."""

from __future__ import annotations

import numpy as np
import torch

from ..tensor_batches import ShuffledBatches, base_and_indices
from ..timing import NO_SPLIT
from .transforms import AXES, augment_points


def point_batches_possible(ds) -> bool:
    """Whether ds's sampler can draw for a whole batch (fps from its cached orders, random, uniform)."""
    base, _ = base_and_indices(ds)
    if getattr(base, "orders", None) is not None:
        return True
    return base.sampler.batch_indices(1, base.clouds.shape[1], torch.Generator()) is not None


class PointBatches(ShuffledBatches):
    """(B, C, num_points) augmented float batches of a cached point-cloud dataset (or a Subset of one)."""

    path = "batched, point cache"

    def __init__(self, ds, augment, up_axis: str, batch_size: int, device, seed=0, rank=0, world=1):
        super().__init__(ds.targets, batch_size, device, seed, rank, world)
        base, indices = base_and_indices(ds)
        self.base, self.augment, self.up = base, augment, AXES[up_axis]
        self.rows = np.asarray(base.rows, dtype=np.int64)[indices]
        self.split = NO_SPLIT  # a benchmark's TimeSplit

    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        rows = self.rows[idx.numpy()]
        with self.split("read"):
            clouds = torch.from_numpy(self.base.clouds[rows])  # (B, cache_points, C); fancy indexing copies
        b, n, c = clouds.shape
        with self.split("sample"):
            orders = self.base.orders
            if orders is not None:
                k = torch.randint(orders.shape[1], (b,), generator=gen).numpy()
                picked = torch.from_numpy(orders[rows, k].astype(np.int64))
            else:
                picked = self.base.sampler.batch_indices(b, n, gen)
            points = clouds.gather(1, picked[..., None].expand(-1, -1, c))
        with self.split("augment"):
            points = augment_points(points, self.augment, self.up, gen)
        with self.split("collate"):
            return points.transpose(1, 2).contiguous().to(self.device)
