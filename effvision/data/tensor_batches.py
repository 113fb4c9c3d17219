"""Training batches cut from a whole image split held as one uint8 tensor on the training device.

airbench's data path: decode once, keep N x 3 x H x W uint8 where the model runs, and augment whole
batches with tensor ops (mirror, translate with reflect padding). It replaces the per-sample
DataLoader + transforms path, which on a small CPU costs more than a compact model's step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import EffvisionError


def _base_and_indices(ds) -> tuple[object, list[int]]:
    """The in-memory dataset under any Subsets, and the indices into it of ds's samples."""
    if isinstance(ds, torch.utils.data.Subset):
        base, inner = _base_and_indices(ds.dataset)
        return base, [inner[i] for i in ds.indices]
    return ds, list(range(len(ds)))


def stack_images(ds, size: int) -> torch.Tensor:
    """Every image of an image dataset as one uint8 tensor, resized (short side) and centre-cropped to size."""
    from torchvision.transforms import v2

    base, indices = _base_and_indices(ds)
    if not hasattr(base, "image"):
        raise EffvisionError("tensor_data needs an image dataset (it holds decoded images in memory)")
    fit = v2.Compose([v2.Resize(size, antialias=True), v2.CenterCrop(size)])
    return torch.stack([img if tuple(img.shape[-2:]) == (size, size) else fit(img) for img in map(base.image, indices)])


class TensorBatches:
    """(x, y, index) training batches like the DataLoader's, normalised float on `device`.

    With world > 1 each rank takes its own equal share of every epoch's permutation (the
    distributed sampler's job on the DataLoader path); call set_epoch(e) before each epoch."""

    def __init__(
        self,
        images: torch.Tensor,
        targets,
        mean,
        std,
        batch_size: int,
        device: torch.device,
        seed: int = 0,
        hflip: bool = True,
        translate: int = 4,
        rank: int = 0,
        world: int = 1,
    ):
        self.images = images.to(device)
        self.targets = torch.as_tensor(targets, dtype=torch.long).to(device)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1) * 255
        self.batch_size, self.device, self.seed = batch_size, device, seed
        self.hflip, self.translate, self.rank, self.world = hflip, translate, rank, world
        self.per_rank = len(images) // world
        if self.per_rank < 1:
            raise EffvisionError(f"{len(images)} training samples cannot be shared by {world} processes")
        self.epoch = 0

    def __len__(self) -> int:
        return max(1, self.per_rank // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(len(self.images), generator=gen)[
            self.rank * self.per_rank : (self.rank + 1) * self.per_rank
        ]
        self.epoch += 1  # an epoch not announced with set_epoch still gets a fresh order
        bs = min(self.batch_size, self.per_rank)
        for b in range(len(self)):
            idx = perm[b * bs : (b + 1) * bs]  # on the CPU: the loop indexes sample weights with it
            on_device = idx.to(self.device)
            x = self.augment(self.images[on_device].float(), gen)
            yield (x - self.mean) / self.std, self.targets[on_device], idx

    def augment(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n, _, h, w = x.shape
        if self.hflip:
            mirror = (torch.rand(n, generator=gen) < 0.5).to(self.device).view(-1, 1, 1, 1)
            x = torch.where(mirror, x.flip(-1), x)
        p = self.translate
        if p:
            # One gather for the whole batch: row and column indices of each sample's window.
            padded = F.pad(x, (p, p, p, p), mode="reflect")
            dy, dx = (torch.randint(0, 2 * p + 1, (2, n), generator=gen)).to(self.device)
            rows = (dy[:, None] + torch.arange(h, device=self.device))[:, None, :, None]
            cols = (dx[:, None] + torch.arange(w, device=self.device))[:, None, None, :]
            batch = torch.arange(n, device=self.device)[:, None, None, None]
            chans = torch.arange(x.shape[1], device=self.device)[None, :, None, None]
            x = padded[batch, chans, rows, cols]
        return x
