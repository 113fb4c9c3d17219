"""Video datasets: a class-per-folder tree of video files, or an annotation list (`relative/path
label` lines as UCF101/Kinetics lists use, or CSV), decoded clip by clip through a frame sampler.

Each file is opened once when the dataset is built (container header, frame count and key frames;
a stream without an index is decoded once to count them) and what was learnt is kept, so a clip
read opens its file once and decodes only what the sampler asks for. A file that is not a video is
skipped and counted, or stops the run with its path (on_bad_sample). A file that opens but fails
to decode later is handled the same way when it is read."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ...errors import EffvisionError
from ...registry import DATASETS
from ..generated import generated_splits
from ..layouts import ScanReport, folder_splits, label_indices, list_splits
from .frame_samplers import FrameSampler, get_sampler
from .io import VideoError, VideoInfo, is_video, scan_video


class VideoDataset(torch.utils.data.Dataset):
    """Clips of num_frames frames as uint8 (T, 3, H, W) tensors, frames resized while decoding so
    the short side is `short_side`. In training the sampler draws random positions; otherwise each
    of `clips` views sits at its own fixed position (several views for test-time averaging)."""

    def __init__(
        self,
        entries: list[tuple[Path, int]],
        classes: list[str],
        sampler: FrameSampler,
        short_side: int,
        train: bool = False,
        on_bad_sample: str = "skip",
        progress: Callable | None = None,
        backend: str = "auto",
    ):
        self.classes, self.sampler, self.short_side, self.train, self.backend = (
            classes,
            sampler,
            short_side,
            train,
            backend,
        )
        self.on_bad_sample = on_bad_sample
        self.report = ScanReport(total=len(entries))
        self.samples: list[tuple[Path, int]] = []
        self.info: list[VideoInfo] = []
        for path, label in (progress or (lambda it, **_: it))(entries, description="opening videos"):
            try:
                info = scan_video(path, backend)
            except VideoError as exc:
                self._bad(path, exc)
                continue
            self.samples.append((path, label))
            self.info.append(info)
        if not self.samples:
            raise EffvisionError(f"every video of the dataset is unreadable ({len(self.report.bad)} files)")
        self.targets = [label for _, label in self.samples]
        self.transform = None

    def _bad(self, path: Path, exc: Exception, decoding: bool = False) -> None:
        if self.on_bad_sample == "fail":
            raise EffvisionError(f"{exc} (set data.on_bad_sample=skip to skip such files)") from None
        self.report.bad.append((str(path), str(exc)))
        if decoding:  # said at once: a loader worker's own count never reaches the run's report
            print(f"skipped a video that failed to decode: {exc}", file=sys.stderr)

    def __len__(self) -> int:
        return len(self.samples)

    def clip(self, i: int, position: float = 0.5) -> torch.Tensor:
        """The clip of sample i as uint8 (T, 3, H, W); a file that fails to decode is recorded and
        the next sample stands in (skip), or the error names it (fail)."""
        return self.read(i, position)[0]

    def read(self, i: int, position: float = 0.5) -> tuple[torch.Tensor, int]:
        """clip(i, position) and the frames decoded to make it (what the sampler cost)."""
        for k in range(len(self.samples)):
            j = (i + k) % len(self.samples)
            path, _ = self.samples[j]
            rng = np.random.default_rng(int(torch.randint(0, 2**31 - 1, ())) if self.train else i)
            try:
                c = self.sampler.clip(path, self.short_side, self.train, rng, self.backend, position, self.info[j])
            except VideoError as exc:
                self._bad(path, exc, decoding=True)
                continue
            return torch.from_numpy(np.ascontiguousarray(c.frames)).permute(0, 3, 1, 2), c.decoded
        raise EffvisionError("no video of the dataset could be decoded")

    def __getitem__(self, i: int):
        clip = self.clip(i)
        return (self.transform(clip) if self.transform else clip), self.targets[i]


def video_dataset(
    pairs: list[tuple[Path, str]],
    classes: list[str],
    sampler: FrameSampler,
    short_side: int,
    train: bool,
    on_bad_sample: str,
    progress=None,
) -> VideoDataset:
    return VideoDataset(label_indices(pairs, classes), classes, sampler, short_side, train, on_bad_sample, progress)


def _samplers(card, config) -> tuple[FrameSampler, int]:
    sampler = get_sampler(card.sampler_name(config), config.num_frames or card.num_frames, **card.sampler_options)
    short = card.resize or card.image_size
    if short < card.image_size:
        raise EffvisionError(
            f"dataset {card.name}: resize ({short}) must be at least image_size ({card.image_size}): crops are cut "
            "from the decoded frames"
        )
    return sampler, short


def _build(card, config, train_pairs, val_pairs, classes, progress):
    sampler, short = _samplers(card, config)
    return (
        video_dataset(train_pairs, classes, sampler, short, True, config.on_bad_sample, progress),
        video_dataset(val_pairs, classes, sampler, short, False, config.on_bad_sample, progress),
    )


@DATASETS.register("videofolder")
def videofolder(card, config, progress=None):
    """<root>/<train>/<class>/<video> and the val split alike (default folders train, val or test)."""
    classes, train, val = folder_splits(card, config, is_video, "videos")
    return _build(card, config, train, val, classes, progress)


@DATASETS.register("videolist")
def videolist(card, config, progress=None):
    """Annotation lists (card train/val, relative to root) whose entries are relative to root."""
    classes, train, val = list_splits(card, config, is_video)
    return _build(card, config, train, val, classes, progress)


@DATASETS.register("synthetic-motion")
def synthetic_motion(card, config, progress=None):
    """The generated motion videos (synthetic_motion.py), written once under data.root
    (default runs/data/synthetic-motion) and reused."""
    from .synthetic_motion import CLASSES, generate

    _, train, val = generated_splits(card, config, generate, is_video, "videos", progress)
    return _build(card, config, train, val, list(CLASSES), progress)
