"""Frame selection for video (registered in SAMPLERS): which frames of a video make a clip. Fewer
decoded frames is data compression for video; each sampler reports how many it decoded.

- tsn: uniform segment sampling (Wang et al., Temporal Segment Networks, ECCV 2016): one frame
  per equal segment, at a random offset in training and at the centre in evaluation.
- dense: consecutive frames with a temporal stride (the 3D-CNN clip), random start in training.
- keyframes: only the container's key (I-) frames, spread like tsn over the key-frame list.
- motion: score frames by frame difference on a cheap low-resolution decode and keep the top-k
  in temporal order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import EffvisionError
from ...registry import SAMPLERS
from ..samplers import make_sampler
from ..timing import NO_SPLIT
from .io import Video, VideoError, VideoInfo, open_video


@dataclass
class Clip:
    frames: np.ndarray  # (T, H, W, 3) uint8
    indices: list[int]
    decoded: int  # frames the decoder returned for this clip (all passes)
    total: int  # frames in the video
    backend: str


def segment_indices(n: int, k: int, train: bool, rng: np.random.Generator, position: float = 0.5) -> list[int]:
    """One index per equal segment of range(n): a random offset in training, else the same
    `position` (0..1) in every segment (0.5: the centre; several views use several positions)."""
    edges = np.linspace(0, n, k + 1)
    offset = rng.random(k) if train else np.full(k, position)
    return [min(n - 1, int(lo + f * (hi - lo))) for lo, hi, f in zip(edges[:-1], edges[1:], offset, strict=True)]


class FrameSampler:
    """Base: `indices()` picks frames of an opened video; `clip()` opens, picks and decodes,
    falling back to PyAV when decord opens a file but fails to decode it."""

    modality = "video"
    split = NO_SPLIT  # a benchmark's TimeSplit

    def __init__(self, num_frames: int = 8):
        if num_frames < 1:
            raise EffvisionError(f"num_frames must be at least 1, got {num_frames}")
        self.num_frames = num_frames

    def indices(self, video: Video, train: bool, rng: np.random.Generator, position: float = 0.5) -> list[int]:
        """Frame indices; `position` (0..1) places an evaluation clip in the video."""
        raise NotImplementedError

    def select(
        self, video: Video, train: bool, rng: np.random.Generator, position: float = 0.5
    ) -> tuple[list[int], int]:
        """The frame indices, and the frames decoded to choose them (0 unless a sampler scans)."""
        return self.indices(video, train, rng, position), 0

    def clip(
        self,
        path: str | Path,
        short_side: int | None,
        train: bool = False,
        rng: np.random.Generator | None = None,
        backend: str = "auto",
        position: float = 0.5,
        info: VideoInfo | None = None,
    ) -> Clip:
        """The clip of one file; with the file's VideoInfo (a dataset scan's) it is opened once."""
        rng = rng or np.random.default_rng(0)
        with self.split("read"):
            video = open_video(path, short_side, backend, info)
        try:
            return self._decode(video, train, rng, position)
        except VideoError:
            if video.backend != "decord" or backend != "auto":
                raise
            return self._decode(open_video(path, short_side, "pyav"), train, rng, position)

    def _decode(self, video: Video, train: bool, rng: np.random.Generator, position: float) -> Clip:
        with self.split("sample"):
            idx, scanned = self.select(video, train, rng, position)
        with self.split("decode"):
            frames = video.frames(idx)
        return Clip(frames, idx, video.decoded + scanned, len(video), video.backend)


@SAMPLERS.register("tsn")
class SegmentSampler(FrameSampler):
    """Uniform segment sampling (TSN): num_frames segments, one frame each."""

    def indices(self, video, train, rng, position=0.5):
        return segment_indices(len(video), self.num_frames, train, rng, position)


@SAMPLERS.register("dense")
class DenseSampler(FrameSampler):
    """num_frames consecutive frames `stride` apart; a video too short for the span loops."""

    def __init__(self, num_frames: int = 8, stride: int = 2):
        super().__init__(num_frames)
        if stride < 1:
            raise EffvisionError(f"stride must be at least 1, got {stride}")
        self.stride = stride

    def indices(self, video, train, rng, position=0.5):
        n, span = len(video), (self.num_frames - 1) * self.stride + 1
        room = max(0, n - span)
        start = int(rng.integers(0, room + 1)) if train else int(round(position * room))
        return [(start + i * self.stride) % n for i in range(self.num_frames)]


@SAMPLERS.register("keyframes")
class KeyframeSampler(FrameSampler):
    """Key frames only (no inter-frame decoding); fewer key frames than num_frames repeat."""

    def indices(self, video, train, rng, position=0.5):
        # A stream whose index marks no key frame (cut mid-GOP, or a writer that sets no flags) still
        # decodes from its first frame: that one stands in as the only key frame.
        keys = video.key_indices() or [0]
        return [keys[i] for i in segment_indices(len(keys), self.num_frames, train, rng, position)]


@SAMPLERS.register("motion")
class MotionSampler(FrameSampler):
    """The num_frames frames that differ most from their predecessor, on a `scan_size`-px decode
    of at most `max_scan` frames; in training, drawn from the top 2 x num_frames. Its choice does
    not depend on `position`: several evaluation views see the same frames."""

    def __init__(self, num_frames: int = 8, scan_size: int = 32, max_scan: int = 256):
        super().__init__(num_frames)
        self.scan_size, self.max_scan = scan_size, max_scan

    def select(self, video, train, rng, position=0.5):
        n = len(video)
        step = max(1, -(-n // self.max_scan))
        scanned = list(range(0, n, step))
        low = open_video(video.path, self.scan_size, video.backend, video.info)
        small = low.frames(scanned).astype(np.int16)
        score = np.r_[0.0, np.abs(np.diff(small, axis=0)).mean(axis=(1, 2, 3))]
        order = np.argsort(-score, kind="stable")
        pool = order[: 2 * self.num_frames] if train else order[: self.num_frames]
        chosen = rng.choice(pool, size=min(self.num_frames, len(pool)), replace=False) if train else pool
        picked = sorted(scanned[i] for i in chosen)
        while len(picked) < self.num_frames:  # fewer scanned frames than asked: repeat in order
            picked = sorted(picked + picked[: self.num_frames - len(picked)])
        return picked, low.decoded


def get_sampler(name: str, num_frames: int = 8, **options) -> FrameSampler:
    """A video frame sampler by name; unknown names and options list the valid ones."""
    return make_sampler(name, "video", {"num_frames": num_frames}, options)
