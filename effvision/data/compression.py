"""`effvision data compress`: a compressed copy of a dataset, keeping its layout, with bytes before
and after and decode throughput of both measured side by side.

Images are re-encoded with Pillow (longest side capped, JPEG/WebP quality), videos with PyAV
(libx264 at a CRF, a temporal stride or key frames only, a smaller short side), point clouds
reduced to one point per voxel or to N farthest points and stored as float32 .npy. Files of other
kinds are copied unchanged; a file that cannot be read is counted and named, never fatal.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import tempfile
import time
import zipfile
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Callable, Iterator, Literal, Optional

import numpy as np

from ..errors import EffvisionError
from .archive import inside
from .images.folders import FileSource, decode_image, is_image
from .points.io import is_point_file, read_points
from .video.io import is_video, open_video, target_size

IMAGE_FORMATS = {"jpeg": ".jpg", "webp": ".webp", "png": ".png"}


@dataclass
class Levels:
    """What to reduce; None leaves that aspect as it is."""

    max_size: Optional[int] = None  # images: longest side in pixels
    quality: Optional[int] = None  # images: JPEG/WebP quality 1-100
    image_format: Literal["jpeg", "webp", "png"] = "jpeg"
    stride: Optional[int] = None  # videos: keep every k-th frame (the frame rate drops k times)
    keyframes: bool = False  # videos: keep key frames only
    short_side: Optional[int] = None  # videos: re-encode at this short side
    crf: int = 23  # videos: libx264 constant rate factor (higher: smaller, worse)
    voxel_size: Optional[float] = None  # points: one point per voxel of this size (file units)
    num_points: Optional[int] = None  # points: keep this many (farthest-point sampled)

    def check(self) -> None:
        if self.max_size is not None and self.max_size < 1:
            raise EffvisionError(f"--max-size {self.max_size}: give a positive number of pixels")
        if self.quality is not None and not 1 <= self.quality <= 100:
            raise EffvisionError(f"--quality {self.quality}: give 1-100")
        if self.image_format not in IMAGE_FORMATS:
            raise EffvisionError(f"--format {self.image_format}: choices are {', '.join(IMAGE_FORMATS)}")
        if self.stride is not None and self.stride < 1:
            raise EffvisionError(f"--stride {self.stride}: give a positive frame stride")
        if self.short_side is not None and (self.short_side < 2 or self.short_side % 2):
            raise EffvisionError(f"--short-side {self.short_side}: H.264 needs an even size of at least 2")
        if not 0 <= self.crf <= 51:
            raise EffvisionError(f"--crf {self.crf}: libx264 takes 0-51")
        if self.voxel_size is not None and self.voxel_size <= 0:
            raise EffvisionError(f"--voxel-size {self.voxel_size}: give a positive size")
        if self.num_points is not None and self.num_points < 1:
            raise EffvisionError(f"--points {self.num_points}: give a positive count")


# ----------------------------------------------------------------------------- per kind
def compress_image(data: bytes, lv: Levels) -> tuple[bytes, str]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        img = img.convert("RGB")
    if lv.max_size and max(img.size) > lv.max_size:
        scale = lv.max_size / max(img.size)
        img = img.resize(
            (max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.Resampling.LANCZOS
        )
    buf = io.BytesIO()
    kwargs = {"quality": lv.quality} if lv.quality and lv.image_format != "png" else {}
    img.save(buf, format=lv.image_format.upper(), **kwargs)
    return buf.getvalue(), IMAGE_FORMATS[lv.image_format]


def compress_video(path: Path, lv: Levels) -> tuple[bytes, str]:
    """Decode with PyAV (key frames only when asked: the decoder skips the rest), re-encode as
    H.264 in MP4 at the reduced frame rate and size."""
    import av

    try:
        with av.open(str(path)) as src:
            stream = src.streams.video[0]
            if lv.keyframes:
                stream.codec_context.skip_frame = "NONKEY"
            rate = stream.average_rate or stream.guessed_rate or Fraction(25)
            frames = [f for f in src.decode(stream)]
    except av.error.FFmpegError as exc:
        raise EffvisionError(f"{path}: PyAV cannot decode it ({exc})") from None
    if not frames:
        raise EffvisionError(f"{path}: the video has no frames")
    if lv.stride and lv.stride > 1:
        frames, rate = frames[:: lv.stride], rate / lv.stride
    times = [f.time for f in frames if f.time is not None]
    if lv.keyframes and len(times) > 1 and times[-1] > times[0]:
        rate = Fraction(
            max(1, round((len(times) - 1) / (times[-1] - times[0])))
        )  # key frames spread over the clip's duration
    w, h = frames[0].width, frames[0].height
    w, h = target_size(w, h, lv.short_side) if lv.short_side else (w, h)
    w, h = w - w % 2, h - h % 2
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        ostream = out.add_stream("libx264", rate=rate)
        ostream.width, ostream.height, ostream.pix_fmt = w, h, "yuv420p"
        ostream.options = {"crf": str(lv.crf), "preset": "veryfast"}
        for i, f in enumerate(frames):
            frame = f.reformat(width=w, height=h, format="yuv420p")
            frame.pts, frame.time_base = (
                i,
                1 / Fraction(rate),
            )  # renumbered: kept frames are evenly spaced at the new rate
            for packet in ostream.encode(frame):
                out.mux(packet)
        for packet in ostream.encode():
            out.mux(packet)
    return buf.getvalue(), ".mp4"


def compress_points(path: Path, lv: Levels) -> tuple[bytes, str]:
    from .points.samplers import FarthestPointSampler, VoxelPointSampler

    points = read_points(path)
    if lv.voxel_size:
        points = points[
            VoxelPointSampler(num_points=len(points), voxel_size=lv.voxel_size).indices(points, False, None)
        ]
    if lv.num_points and len(points) > lv.num_points:
        points = points[FarthestPointSampler(num_points=lv.num_points).indices(points, False, np.random.default_rng(0))]
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(points, dtype=np.float32))
    return buf.getvalue(), ".npy"


# ----------------------------------------------------------------------------- decoding speed
def decode_one(read: Callable[[], bytes], local: Callable[[], contextlib.AbstractContextManager], name: str) -> int:
    """Decode a file the way training reads it; returns the units decoded (images, frames, clouds)."""
    if is_image(name):
        decode_image(read())
        return 1
    with local() as path:
        if is_video(name):
            video = open_video(path)
            return len(video.frames(list(range(len(video)))))
        read_points(path)
        return 1


def decode_rate(items: list[tuple[Callable, Callable, str]], rounds: int = 3) -> float:
    """Units decoded per second over these files, median of `rounds` passes."""
    rates = []
    for _ in range(rounds):
        start, units = time.perf_counter(), 0
        for read, local, name in items:
            units += decode_one(read, local, name)
        rates.append(units / max(time.perf_counter() - start, 1e-9))
    return statistics.median(rates)


# ----------------------------------------------------------------------------- the copy
class _Writer:
    """Files into a folder, or into a .zip when the destination's name ends with .zip."""

    def __init__(self, dst: Path):
        self.dst = dst
        self.zip = zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) if dst.suffix == ".zip" else None

    def write(self, name: str, data: bytes) -> None:
        if self.zip:
            self.zip.writestr(name, data)
        else:  # names come from the source archive: never written outside dst (zip-slip)
            target = inside(self.dst, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)

    def close(self) -> None:
        if self.zip:
            self.zip.close()


def _local(source: FileSource, name: str) -> Callable[[], contextlib.AbstractContextManager]:
    """A path on disk for a member (decord, PyAV and open3d read paths): itself in a folder,
    a temporary copy for a .zip member."""

    @contextlib.contextmanager
    def path() -> Iterator[Path]:
        if not source.is_zip:
            yield source.path / name
            return
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / Path(name).name
            p.write_bytes(source.read(name))
            yield p

    return path


def compress_dataset(src: str | Path, dst: str | Path, lv: Levels, progress=None, decode_sample: int = 500) -> dict:
    """Write the compressed copy of src (folder or .zip) to dst (folder, or .zip by suffix)."""
    lv.check()
    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise EffvisionError(f"path not found: {src}")
    if dst.resolve() == src.resolve() or (dst.exists() and any(dst.iterdir() if dst.is_dir() else [dst])):
        raise EffvisionError(f"{dst} already exists; give a new folder (or .zip) for the compressed copy")
    source = FileSource(src)
    names = source.names()
    if not names:
        raise EffvisionError(f"no files under {src}")
    if dst.suffix != ".zip":
        dst.mkdir(parents=True, exist_ok=True)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
    writer, out_source = _Writer(dst), None
    stats = {
        "files": len(names),
        "compressed": 0,
        "copied": 0,
        "failed": [],
        "bytes_before": 0,
        "bytes_after": 0,
        "kinds": {},
    }
    written: list[tuple[str, str]] = []
    try:
        for name in (progress or (lambda it, **_: it))(names, description=f"compressing {src.name}"):
            data = source.read(name)
            stats["bytes_before"] += len(data)
            kind = (
                "image" if is_image(name) else "video" if is_video(name) else "points" if is_point_file(name) else None
            )
            new_name, out = name, data
            try:
                if kind == "image":
                    out, suffix = compress_image(data, lv)
                elif kind is not None:
                    with _local(source, name)() as path:
                        out, suffix = (compress_video if kind == "video" else compress_points)(path, lv)
                if kind is not None:
                    new_name = str(Path(name).with_suffix(suffix))
                    stats["compressed"] += 1
                    stats["kinds"][kind] = stats["kinds"].get(kind, 0) + 1
                    written.append((name, new_name))
                else:
                    stats["copied"] += 1
            except Exception as exc:  # noqa: BLE001  (any unreadable file is named and skipped)
                stats["failed"].append(
                    {"path": source.where(name), "error": (str(exc).splitlines() or [type(exc).__name__])[0]}
                )
                continue
            writer.write(new_name, out)
            stats["bytes_after"] += len(out)
    finally:
        writer.close()
    out_source = FileSource(dst)
    sample = written[:: max(1, len(written) // decode_sample)][:decode_sample]
    if sample:
        before = [(lambda n=n: source.read(n), _local(source, n), n) for n, _ in sample]
        after = [(lambda n=m: out_source.read(n), _local(out_source, m), m) for _, m in sample]
        decode_rate(before, 1), decode_rate(after, 1)  # warm-up: file caches, decoder libraries
        stats["decode_per_s_before"] = decode_rate(before)
        stats["decode_per_s_after"] = decode_rate(after)
        stats["decode_unit"] = "frames" if all(is_video(n) for n, _ in sample) else "files"
        stats["decode_sample"] = len(sample)
    stats["ratio"] = stats["bytes_after"] / max(stats["bytes_before"], 1)
    return stats
