"""Training batches cut from a whole split and augmented a batch at a time (no per-sample Python).

airbench's data path: decode once, keep N x 3 x H x W uint8 where the model runs, and augment whole
batches with tensor ops (mirror, translate with reflect padding). It replaces the per-sample
DataLoader + transforms path, which on a small CPU costs more than a compact model's step. A split
too large for memory is decoded once into a memory-mapped file on disk (FFCV's idea), and batches
are gathered from it through the page cache. Point clouds batch the same way (point_batches.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .. import cache
from ..cache import open_memmap
from ..errors import EffvisionError
from .timing import NO_SPLIT

CACHE_VERSION = 1


def base_and_indices(ds) -> tuple[object, list[int]]:
    """The dataset under any Subsets, and the indices into it of ds's samples."""
    if isinstance(ds, torch.utils.data.Subset):
        base, inner = base_and_indices(ds.dataset)
        return base, [inner[i] for i in ds.indices]
    return ds, list(range(len(ds)))


class ShuffledBatches:
    """(x, y, index) training batches like the DataLoader's (index: the sample's place in the split).

    A fresh permutation every epoch, full batches only; with world > 1 each rank takes its own
    equal share of every epoch's permutation (the distributed sampler's job on the DataLoader path);
    call set_epoch(e) before each epoch. Subclasses say how a batch of samples is made (`batch`)."""

    path = "batched"

    def __init__(self, targets, batch_size: int, device: torch.device, seed: int = 0, rank: int = 0, world: int = 1):
        self.targets = torch.as_tensor(targets, dtype=torch.long).to(device)
        self.batch_size, self.device, self.seed, self.rank, self.world = batch_size, device, seed, rank, world
        self.per_rank = len(self.targets) // world
        if self.per_rank < 1:
            raise EffvisionError(f"{len(self.targets)} training samples cannot be shared by {world} processes")
        self.epoch = 0

    def __len__(self) -> int:
        return max(1, self.per_rank // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        perm = torch.randperm(len(self.targets), generator=gen)[
            self.rank * self.per_rank : (self.rank + 1) * self.per_rank
        ]
        self.epoch += 1  # an epoch not announced with set_epoch still gets a fresh order
        bs = min(self.batch_size, self.per_rank)
        for b in range(len(self)):
            idx = perm[b * bs : (b + 1) * bs]  # on the CPU: the loop indexes sample weights with it
            yield self.batch(idx, gen), self.targets[idx.to(self.device)], idx

    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        raise NotImplementedError


class TensorBatches(ShuffledBatches):
    """Normalised float image batches on `device`, mirrored and translated per sample.

    `images`: N x 3 x H x W uint8, a tensor (moved to `device`) or a NumPy memory map (gathered
    batch by batch, then moved) whose row of sample i is rows[i]."""

    def __init__(
        self,
        images,
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
        rows=None,
    ):
        super().__init__(targets, batch_size, device, seed, rank, world)
        self.mapped = isinstance(images, np.ndarray)
        self.rows = np.arange(len(images)) if rows is None else np.asarray(rows, dtype=np.int64)
        self.images = images if self.mapped else images.to(device)
        self.mean = torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1) * 255
        self.hflip, self.translate = hflip, translate
        self.path = "batched, memory-mapped decoded cache" if self.mapped else "batched, in memory"
        self.split = NO_SPLIT  # a benchmark's TimeSplit

    def batch(self, idx: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        with self.split("read"):
            if self.mapped:
                x = torch.from_numpy(self.images[self.rows[idx.numpy()]]).to(self.device)
            else:
                x = self.images[idx.to(self.device)]
        with self.split("augment"):
            x = self.augment(x.float(), gen)
        with self.split("collate"):  # the per-sample path normalises in its transform
            return (x - self.mean) / self.std

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


def _fitted(size: int, interpolation: str = "bilinear"):
    from torchvision.transforms import v2

    mode = v2.InterpolationMode(interpolation)
    fit = v2.Compose([v2.Resize(size, interpolation=mode, antialias=True), v2.CenterCrop(size)])
    return lambda img: img if tuple(img.shape[-2:]) == (size, size) else fit(img)


def _image_base(ds):
    base, indices = base_and_indices(ds)
    if not hasattr(base, "image"):
        raise EffvisionError("batched training data needs an image dataset (it holds decoded images)")
    return base, indices


def stack_images(ds, size: int, interpolation: str = "bilinear") -> torch.Tensor:
    """Every image of an image dataset as one uint8 tensor, resized (short side) and centre-cropped to size."""
    base, indices = _image_base(ds)
    fit = _fitted(size, interpolation)
    return torch.stack([fit(base.image(i)) for i in indices])


def decoded_bytes(ds, size: int) -> int:
    return len(ds) * 3 * size * size


def _cache_key(base, size: int, interpolation: str = "bilinear") -> str:
    source = getattr(base, "source", None)
    if source is None:
        raise EffvisionError("this image dataset has no files to key a decoded cache on; it must fit in memory")
    st = source.path.stat()
    ident = [CACHE_VERSION, str(source.path.resolve()), st.st_size, st.st_mtime_ns, base.samples, size]
    if interpolation != "bilinear":  # the keys of existing bilinear caches stay as they were
        ident.append(interpolation)
    return hashlib.sha1(json.dumps(ident).encode()).hexdigest()[:20]


def mapped_images(
    ds, size: int, cache_dir: str | Path, progress=None, interpolation: str = "bilinear"
) -> tuple[np.ndarray, list[int]]:
    """The whole split under ds decoded once to `<cache_dir>/images/<key>.npy` (N x 3 x size x
    size uint8, written row by row, never whole in memory; renamed into place when complete, so
    the processes of a run and later runs share it), memory-mapped; and the rows of ds's samples."""
    base, indices = _image_base(ds)
    path = Path(cache_dir).expanduser() / "images" / f"{_cache_key(base, size, interpolation)}.npy"
    fit = _fitted(size, interpolation)

    def write(tmp: Path) -> None:
        out = open_memmap(tmp, np.uint8, (len(base), 3, size, size))
        for i in (progress or (lambda it, **_: it))(range(len(base)), description="decoding to the image cache"):
            out[i] = fit(base.image(i)).numpy()
        out.flush()
        del out

    cache.entry(path, write, "decoded-image")
    return np.load(path, mmap_mode="r", allow_pickle=False), indices
