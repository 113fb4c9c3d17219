"""Point-cloud datasets: ModelNet's `<class>/<split>/<file>` tree, a class-per-folder tree
(`<split>/<class>/<file>`) or annotation lists, each file read once into a cache.

Reading a mesh means sampling its surface, and a LiDAR sweep holds 10^5 points: both are done once.
Every file is read, normalised to the unit sphere and farthest-point sampled to `cache_points`
points; the clouds of a split are saved together as one .npy under `cache_dir` (and its labels and
counts in a small .npz beside it, written last as the completion marker), keyed by the files (path,
size, mtime) and the reading options, so an epoch never re-reads a file. The .npy is memory-mapped:
a split larger than memory streams from disk through the page cache instead of being loaded whole.
The card's sampler then draws `num_points` of those per sample (fresh draws in training). The
`fps` sampler's coarse-to-fine orders are cached too, for a few start points per cloud (a second
.npy beside the clouds), so a draw is an index, not a farthest-point search.
A file that cannot be read is skipped and counted, or stops the run with its path (on_bad_sample)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ...cache import entries as entry_files
from ...cache import entry as cache_entry
from ...cache import open_memmap
from ...errors import EffvisionError
from ...registry import DATASETS
from ..generated import generated_splits
from ..layouts import ScanReport, data_root, folder_splits, label_indices, list_splits, modelnet_entries
from ..timing import NO_SPLIT
from .io import PointCloudError, guess_bin_width, is_point_file, read_points
from .samplers import (
    FarthestPointSampler,
    PointSampler,
    farthest_point_indices,
    fill_sampled,
    get_point_sampler,
    normalize_unit_sphere,
)

CACHE_VERSION = 2


def prepare_cloud(path: Path, card, seed: int = 0) -> tuple[np.ndarray, int]:
    """(cache_points, channels) float32 of one file, normalised and farthest-point sampled, and
    the number of points the file gave (a mesh: the points sampled on its surface)."""
    width = card.bin_width or (guess_bin_width(path) if path.suffix.lower() == ".bin" else 4)
    points = read_points(path, mesh_points=card.mesh_points, bin_width=width, seed=seed)
    if points.shape[1] < card.channels:
        raise PointCloudError(
            f"{path}: {points.shape[1]} values per point, the card asks for channels: {card.channels}"
        )
    points = normalize_unit_sphere(points[:, : card.channels])
    idx = (
        farthest_point_indices(points, card.cache_points) if len(points) > card.cache_points else np.arange(len(points))
    )
    return fill_sampled(points, idx, card.cache_points, np.random.default_rng(seed)).points, len(points)


class PointCloudDataset(torch.utils.data.Dataset):
    """Clouds as (num_points, channels) float32 arrays (a transform makes them tensors)."""

    def __init__(
        self,
        entries: list[tuple[Path, int]],
        classes: list[str],
        sampler: PointSampler,
        card,
        train: bool = False,
        on_bad_sample: str = "skip",
        progress: Callable | None = None,
    ):
        self.classes, self.sampler, self.train = classes, sampler, train
        self.report = ScanReport(total=len(entries))
        cache = self._cache_file(entries, card)
        entry_files(
            [cache.with_suffix(".npy"), cache],  # the clouds, and their labels and counts
            lambda tmps: self._build_cache(entries, card, on_bad_sample, progress, *tmps),
            "point-cloud",
        )
        with np.load(cache, allow_pickle=False) as z:
            self.rows, targets = z["rows"], z["targets"]
            self.source_points, self.source_bytes = z["source_points"], z["source_bytes"]
            self.report.bad = [tuple(b) for b in json.loads(str(z["bad"]))]
        self.clouds = np.load(cache.with_suffix(".npy"), mmap_mode="r", allow_pickle=False)
        self.orders = self._fps_orders(cache, progress) if isinstance(sampler, FarthestPointSampler) else None
        if on_bad_sample == "fail" and self.report.bad:
            path, why = self.report.bad[0]
            raise EffvisionError(f"{why} (set data.on_bad_sample=skip to skip such files)")
        if not len(self.rows):
            raise EffvisionError(f"every point-cloud file of the dataset is unreadable ({len(self.report.bad)} files)")
        self.targets = [int(t) for t in targets]
        self.transform = None
        self.split = NO_SPLIT  # a benchmark's TimeSplit

    @staticmethod
    def _cache_file(entries, card) -> Path:
        files = [
            (str(p.resolve()), *((p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (-1, -1)), y)
            for p, y in entries
        ]
        options = [CACHE_VERSION, card.cache_points, card.mesh_points, card.bin_width, card.channels]
        key = hashlib.sha1(json.dumps([options, files]).encode()).hexdigest()[:20]
        return Path(card.cache_dir).expanduser() / "points" / f"{key}.npz"

    def _build_cache(self, entries, card, on_bad_sample, progress, clouds: Path, meta: Path) -> None:
        """One row per file, written straight into the memory-mapped .npy (never all in memory);
        rows of unreadable files stay zero and are left out of `rows`."""
        rows, targets, counts, sizes, bad = [], [], [], [], []

        def write_clouds(tmp: Path) -> None:
            out = open_memmap(tmp, np.float32, (len(entries), card.cache_points, card.channels))
            for row, (path, label) in enumerate(
                (progress or (lambda it, **_: it))(entries, description="reading point clouds")
            ):
                try:
                    cloud, n = prepare_cloud(path, card)
                except PointCloudError as exc:
                    if on_bad_sample == "fail":
                        raise EffvisionError(f"{exc} (set data.on_bad_sample=skip to skip such files)") from None
                    bad.append((str(path), str(exc)))
                    continue
                out[row] = cloud
                rows.append(row)
                targets.append(label)
                counts.append(n)
                sizes.append(path.stat().st_size)
            out.flush()
            del out

        def write_meta(tmp: Path) -> None:
            with open(tmp, "wb") as f:
                np.savez(
                    f,
                    rows=np.array(rows, np.int64),
                    targets=np.array(targets, np.int64),
                    source_points=np.array(counts, np.int64),
                    source_bytes=np.array(sizes, np.int64),
                    bad=np.array(json.dumps(bad)),
                )

        write_clouds(clouds)
        write_meta(meta)

    def _fps_orders(self, cache: Path, progress) -> np.ndarray:
        """(files, starts, num_points) coarse-to-fine FPS orders of every cached cloud, computed
        once per (cache, num_points, starts) and memory-mapped; order 0 starts at the first point
        (what evaluation sees), the others at random points seeded by the cloud's row."""
        s = self.sampler
        path = cache.with_name(f"{cache.stem}.fps{s.num_points}x{s.starts}.npy")
        points = self.clouds.shape[1]

        def write(tmp: Path) -> None:
            dtype = np.int16 if points <= np.iinfo(np.int16).max else np.int32
            out = open_memmap(tmp, dtype, (len(self.clouds), s.starts, s.num_points))
            for row in (progress or (lambda it, **_: it))(self.rows, description="farthest-point orders"):
                cloud = np.asarray(self.clouds[row])
                for k, start in enumerate(s.start_points(points, int(row))):
                    out[row, k] = s.order(cloud, start)
            out.flush()
            del out

        cache_entry(path, write, "farthest-point-order")
        return np.load(path, mmap_mode="r", allow_pickle=False)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        # the sampler draws afresh in training and the same points per sample otherwise
        rng = np.random.default_rng(int(torch.randint(0, 2**31 - 1, ())) if self.train else i)
        row = self.rows[i]
        with self.split("read"):
            cloud = np.asarray(self.clouds[row])
        with self.split("sample"):
            if self.orders is not None:  # fps: one of the cloud's cached orders (the first one outside training)
                k = int(rng.integers(self.orders.shape[1])) if self.train else 0
                points = np.ascontiguousarray(cloud[self.orders[row, k]])
            else:
                points = self.sampler(cloud, self.train, rng).points
        return (self.transform(points) if self.transform else points), self.targets[i]

    def summary(self) -> dict:
        """Points and bytes per sample: in the files, and what the sampler keeps (every sampler
        returns exactly num_points float32 points of the cached channels)."""
        n, channels = self.sampler.num_points, self.clouds.shape[2]
        return {
            "source_points_per_sample": round(float(self.source_points.mean()), 1),
            "source_bytes_per_sample": round(float(self.source_bytes.mean()), 1),
            "points_per_sample": n,
            "bytes_per_sample": n * channels * 4,
        }


def _sampler(card, config) -> PointSampler:
    n = config.num_points or card.num_points
    if n > card.cache_points:
        raise EffvisionError(
            f"dataset {card.name}: num_points ({n}) exceeds cache_points ({card.cache_points}); raise cache_points"
        )
    return get_point_sampler(card.sampler_name(config), n, **card.sampler_options)


def _build(card, config, train_pairs, val_pairs, classes, progress):
    sampler = _sampler(card, config)
    return tuple(
        PointCloudDataset(label_indices(pairs, classes), classes, sampler, card, train, config.on_bad_sample, progress)
        for pairs, train in ((train_pairs, True), (val_pairs, False))
    )


@DATASETS.register("pointfolder")
def pointfolder(card, config, progress=None):
    """ModelNet's <root>/<class>/train|test/<file>, or <root>/<train>/<class>/<file> and the val
    split alike (card train/val name the split folders; defaults train and val or test)."""
    root = data_root(card, config)
    if any((root / s).is_dir() for s in ("train", "val", "test", card.train or "train")):
        classes, train, val = folder_splits(card, config, is_point_file, "point clouds")
    else:
        classes, train = modelnet_entries(root, card.train or "train", is_point_file, "point clouds")
        _, val = modelnet_entries(root, card.val or "test", is_point_file, "point clouds")
    return _build(card, config, train, val, classes, progress)


@DATASETS.register("pointlist")
def pointlist(card, config, progress=None):
    """Annotation lists (card train/val, relative to root) whose entries are relative to root."""
    classes, train, val = list_splits(card, config, is_point_file)
    return _build(card, config, train, val, classes, progress)


@DATASETS.register("synthetic-shapes")
def synthetic_shapes(card, config, progress=None):
    """The generated shapes (synthetic_shapes.py), written once under data.root (default
    runs/data/synthetic-shapes) and reused; their cache lives beside them (<root>/.cache)."""
    from .synthetic_shapes import CLASSES, generate

    root, train, val = generated_splits(card, config, generate, is_point_file, "point clouds", progress)
    card = card.model_copy(update={"cache_dir": str(root / ".cache")})
    return _build(card, config, train, val, list(CLASSES), progress)
