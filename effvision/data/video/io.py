"""Video decoding: decord first (decode-time resize, key-frame index, random access), PyAV when
decord is missing or cannot read a file (raw MPEG-4 streams without a container, for one).

Frames come out as uint8 arrays (T, H, W, 3), already at the size the model wants: decord resizes
while decoding and PyAV converts each frame straight to the target size, so a full-resolution RGB
frame is never materialised."""

from __future__ import annotations

import bisect
import functools
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import EffvisionError
from ...native_stderr import native_stderr_silenced  # decord's C++ logger prints every failure it raises

VIDEO_EXTS = {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ogv", ".3gp", ".flv", ".wmv", ".ts"}


class VideoError(EffvisionError):
    """A video that cannot be opened or decoded (the message names the file)."""


def is_video(name: str) -> bool:
    return Path(name).suffix.lower() in VIDEO_EXTS


def _first_line(exc: BaseException) -> str:
    """decord prefixes C++ errors with a timestamp and a source path; keep what a person needs."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[-1 if "video_reader.cc" in str(exc) else 0]
    return text.split("] ")[-1].strip()[:200] or type(exc).__name__


@functools.cache
def _decord():
    """decord, with its FFmpeg's own log lines ("moov atom not found") off: every failure they
    describe reaches the user as a VideoError that names the file."""
    import decord

    decord.logging.set_level(decord.logging.QUIET)
    return decord


def probe_size(path: str | Path) -> tuple[int, int]:
    """(width, height) from the container's stream header, without decoding a frame."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise VideoError(f"{path}: no video stream")
            ctx = container.streams.video[0].codec_context
            if not ctx.width or not ctx.height:
                raise VideoError(f"{path}: the video stream has no frame size")
            return ctx.width, ctx.height
    except VideoError:
        raise
    except Exception as exc:  # noqa: BLE001  (PyAV raises many error types for bad files)
        raise VideoError(f"{path}: not a readable video ({_first_line(exc)})") from None


def target_size(width: int, height: int, short_side: int | None) -> tuple[int, int]:
    """Scale so the shorter side is exactly `short_side`, the longer one keeping the aspect."""
    if not short_side:
        return width, height
    if width <= height:
        return short_side, max(short_side, round(height * short_side / width))
    return max(short_side, round(width * short_side / height)), short_side


@dataclass(frozen=True)
class VideoInfo:
    """What a dataset's scan learns of a file once (VideoDataset), so that reading a clip opens the
    file once and never probes its size or counts its frames again."""

    backend: str  # the backend that opened it
    width: int
    height: int
    frames: int
    fps: float = 0.0
    keys: tuple[int, ...] | None = None  # key-frame indices, where the scan learnt them for free
    in_order: bool = False  # PyAV: every packet decodes to its own frame at once (PyAVVideo)


class Video:
    """One opened video: len() frames, fps, key-frame indices, frames(indices). `decoded` counts
    the frames the decoder handed back so far (what a sampler reports per clip)."""

    backend = ""
    info: VideoInfo | None = None  # set when opened with a dataset scan's VideoInfo

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.decoded = 0

    def __len__(self) -> int:
        raise NotImplementedError

    @property
    def fps(self) -> float:
        raise NotImplementedError

    def key_indices(self) -> list[int]:
        raise NotImplementedError

    def frames(self, indices: list[int]) -> np.ndarray:
        raise NotImplementedError


class DecordVideo(Video):
    backend = "decord"

    def __init__(self, path, size: tuple[int, int] | None = None):
        decord = _decord()
        super().__init__(path)
        self.size = size
        self._pyav: Video | None = None
        width, height = size or (-1, -1)
        try:
            with native_stderr_silenced():
                self.reader = decord.VideoReader(
                    str(path), ctx=decord.cpu(0), width=width, height=height, num_threads=1
                )
        except Exception as exc:  # noqa: BLE001  (decord raises its own DECORDError and RuntimeError)
            raise VideoError(f"{path}: decord cannot open it ({_first_line(exc)})") from None
        if len(self.reader) == 0:
            raise VideoError(f"{path}: the video has no frames")

    def __len__(self) -> int:
        return len(self.reader)

    @property
    def fps(self) -> float:
        return float(self.reader.get_avg_fps())

    def key_indices(self) -> list[int]:
        return [int(i) for i in self.reader.get_key_indices()]

    def frames(self, indices: list[int]) -> np.ndarray:
        if self._pyav is not None:
            return self._frames_with_pyav(indices)
        wanted = sorted(set(indices))
        try:
            batch = self.reader.get_batch(wanted).asnumpy()
        except Exception as exc:  # noqa: BLE001
            if "DECORDArrayCopyFromTo" in str(exc):
                # decord 0.6 cannot copy out frames of some widths (16, 24, 48 px here) that
                # PyAV decodes fine: this video is read with PyAV from now on.
                self._pyav = PyAVVideo(self.path, self.size)
                return self._frames_with_pyav(indices)
            raise VideoError(f"{self.path}: decoding failed ({_first_line(exc)})") from None
        self.decoded += len(wanted)
        row = {i: k for k, i in enumerate(wanted)}
        return batch[[row[i] for i in indices]]

    def _frames_with_pyav(self, indices: list[int]) -> np.ndarray:
        before = self._pyav.decoded
        out = self._pyav.frames(indices)
        self.decoded += self._pyav.decoded - before
        return out


@contextmanager
def _demuxed(container):
    """container.demux(video=0), closed on exit. PyAV 18.1's demux frees its read packet and
    stream mask in a `finally` that does not run when the generator is left early (a clip stops
    at its last frame): about 170 bytes of native memory stayed per clip read, and RSS grew about
    0.3 kB per read, linearly, over 50,000 reads (BENCHMARKS.md). Closing demux ourselves runs
    that `finally`."""
    packets = container.demux(video=0)
    try:
        yield packets
    finally:
        packets.close()


@contextmanager
def _decoded(container):
    """The frames of container.decode(video=0), with the demux under it closed on exit (_demuxed)."""
    with _demuxed(container) as packets:
        yield (frame for packet in packets for frame in packet.decode())


PICTURE_TYPE_B = 3  # FFmpeg's AV_PICTURE_TYPE_B (PyAV 18 gives pict_type as its int)


class PyAVVideo(Video):
    """Decodes sequentially (streams without an index cannot seek reliably), converting to RGB
    at the target size only the frames asked for; the frame count and key frames come from one
    pass over the stream when the header does not carry them. Where that pass found every packet
    decoding to its own frame at once (no B-frames, no decoder delay: `in_order`), a read feeds
    the decoder only the groups of pictures holding a frame it wants: seeking without an index."""

    backend = "pyav"

    def __init__(self, path, size: tuple[int, int] | None = None, info: VideoInfo | None = None):
        super().__init__(path)
        self.size = size
        self._count: int | None = None
        self._keys: list[int] | None = None
        self._fps = 0.0
        self.in_order = False
        if info is None:
            self._header()
        else:  # the dataset's scan counted the frames: no header read, no counting pass
            self._count, self._fps, self.in_order = info.frames, info.fps, info.in_order
            self._keys = None if info.keys is None else list(info.keys)

    def _open(self):
        import av

        try:
            container = av.open(str(self.path))
        except Exception as exc:  # noqa: BLE001
            raise VideoError(f"{self.path}: not a readable video ({_first_line(exc)})") from None
        if not container.streams.video:
            container.close()
            raise VideoError(f"{self.path}: no video stream")
        return container

    def _header(self) -> None:
        with self._open() as container:
            stream = container.streams.video[0]
            self._fps = float(stream.average_rate or stream.guessed_rate or 0)
            self._count = stream.frames or None

    def _scan(self) -> None:
        """Count frames and find key frames by decoding once (no RGB conversion), noting whether
        each packet gave exactly its own frame."""
        count, keys, packets_seen, in_order = 0, [], 0, True
        with self._open() as container, _demuxed(container) as packets:
            try:
                for packet in packets:
                    packets_seen += bool(packet.size)  # the empty one at the end flushes a decoder's delay
                    for frame in packet.decode():
                        if frame.key_frame:
                            keys.append(count)
                        in_order &= int(frame.pict_type) != PICTURE_TYPE_B
                        count += 1
                    in_order &= count == packets_seen
            except Exception as exc:  # noqa: BLE001
                if not count:
                    raise VideoError(f"{self.path}: decoding failed ({_first_line(exc)})") from None
                in_order = False
        if not count:
            raise VideoError(f"{self.path}: the video has no frames")
        self.decoded += count  # this pass decoded every frame too: it counts
        self._count, self._keys = count, keys or [0]
        self.in_order = in_order and bool(keys) and keys[0] == 0

    def __len__(self) -> int:
        if self._count is None:
            self._scan()
        return self._count

    @property
    def fps(self) -> float:
        return self._fps

    def key_indices(self) -> list[int]:
        if self._keys is None:
            self._scan()
        return self._keys

    def frames(self, indices: list[int]) -> np.ndarray:
        wanted, got = set(indices), {}
        width, height = self.size or (None, None)
        with self._open() as container:
            try:
                for i, frame in self._frames_up_to(container, wanted, max(indices)):
                    if i in wanted:
                        got[i] = frame.to_ndarray(format="rgb24", width=width, height=height)
            except Exception as exc:  # noqa: BLE001
                raise VideoError(f"{self.path}: decoding failed at frame {len(got)} ({_first_line(exc)})") from None
        if not got:
            raise VideoError(f"{self.path}: no frame could be decoded")
        # A stream shorter than its header said: reuse the last decoded frame for the missing tail.
        tail = got[max(got)]
        return np.stack([got.get(i, tail) for i in indices])

    def _frames_up_to(self, container, wanted: set[int], last: int):
        """(index, frame) of the decoded frames up to `last`: every one, or in an `in_order`
        stream only those from the key frame before each wanted frame up to it."""
        if not self.in_order:
            with _decoded(container) as decoded:
                for i, frame in enumerate(decoded):
                    self.decoded += 1
                    yield i, frame
                    if i >= last:
                        return
            return

        def group(i: int) -> int:
            return bisect.bisect_right(self._keys, i) - 1

        until: dict[int, int] = {}  # each needed group, decoded from its key frame to its last wanted frame
        for i in wanted:
            until[group(i)] = max(i, until.get(group(i), i))
        with _demuxed(container) as packets:
            # in order: packet i is frame i, and no decoder delay leaves frames for the final flush
            for i, packet in enumerate(p for p in packets if p.size):
                if i > last:
                    return
                if i <= until.get(group(i), -1):  # the rest is never decoded: a needed group starts at a key frame
                    for frame in packet.decode():
                        self.decoded += 1
                        yield i, frame


def decord_missing() -> str | None:
    try:
        import decord  # noqa: F401
    except ImportError:
        return "decord is not installed"
    return None


def scan_video(path: str | Path, backend: str = "auto") -> VideoInfo:
    """Open a file as a dataset scan does (header, frame count; for a stream without an index,
    one decoding pass) and keep what later reads need."""
    width, height = probe_size(path)
    video = open_video(path, None, backend)
    frames = len(video)  # first: a stream without an index counts its frames and key frames in one pass
    if isinstance(video, DecordVideo):
        return VideoInfo(video.backend, width, height, frames, video.fps, tuple(video.key_indices()))
    keys = None if video._keys is None else tuple(video._keys)
    return VideoInfo(video.backend, width, height, frames, video.fps, keys, video.in_order)


def open_video(
    path: str | Path, short_side: int | None = None, backend: str = "auto", info: VideoInfo | None = None
) -> Video:
    """Open a video for decoding at `short_side` (None: the stored size). `auto` tries decord,
    then PyAV; the error of the last backend tried is raised, naming the file. With the file's
    `info` from a dataset scan, the backend that opened it then is used and nothing is probed."""
    path = Path(path)
    if info is not None and backend in ("auto", info.backend):
        size = target_size(info.width, info.height, short_side) if short_side else None
        video = DecordVideo(path, size) if info.backend == "decord" else PyAVVideo(path, size, info)
        video.info = info
        return video
    if not path.is_file():
        raise VideoError(f"video not found: {path}")
    size = target_size(*probe_size(path), short_side) if short_side else None
    order = {"auto": ("decord", "pyav"), "decord": ("decord",), "pyav": ("pyav",)}.get(backend)
    if order is None:
        raise EffvisionError(f"unknown video backend '{backend}' (choices: auto, decord, pyav)")
    error: VideoError | None = None
    for name in order:
        if name == "decord" and decord_missing():
            if backend == "decord":
                raise VideoError(f"{path}: {decord_missing()}")
            continue
        try:
            return DecordVideo(path, size) if name == "decord" else PyAVVideo(path, size)
        except VideoError as exc:
            error = exc
    raise error
