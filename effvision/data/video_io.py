"""Video decoding: decord first (decode-time resize, key-frame index, random access), PyAV when
decord is missing or cannot read a file (raw MPEG-4 streams without a container, for one).

Frames come out as uint8 arrays (T, H, W, 3), already at the size the model wants: decord resizes
while decoding and PyAV converts each frame straight to the target size, so a full-resolution RGB
frame is never materialised."""

from __future__ import annotations

import functools
import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..errors import EffvisionError

VIDEO_EXTS = {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ogv", ".3gp", ".flv", ".wmv", ".ts"}


class VideoError(EffvisionError):
    """A video that cannot be opened or decoded (the message names the file)."""


def is_video(name: str) -> bool:
    return Path(name).suffix.lower() in VIDEO_EXTS


def _first_line(exc: BaseException) -> str:
    """decord prefixes C++ errors with a timestamp and a source path; keep what a person needs."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[-1 if "video_reader.cc" in str(exc) else 0]
    return text.split("] ")[-1].strip()[:200] or type(exc).__name__


_STDERR_LOCK = threading.Lock()


@contextmanager
def _c_stderr_silenced():
    """Point file descriptor 2 at /dev/null for a moment. decord's C++ logger prints
    "video_reader.cc:83: ERROR opening ..." for every file it cannot open, with no switch to turn
    it off; the exception we turn into a one-line VideoError carries the same reason."""
    with _STDERR_LOCK:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


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


class Video:
    """One opened video: len() frames, fps, key-frame indices, frames(indices). `decoded` counts
    the frames the decoder handed back so far (what a sampler reports per clip)."""

    backend = ""

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
            with _c_stderr_silenced():
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
def _decoded(container):
    """container.decode(video=0), with the demux generator under it closed on exit. PyAV 18.1's
    demux frees its read packet and stream mask in a `finally` that does not run when decode() is
    left early (a clip stops at its last frame): about 170 bytes of native memory stayed per
    clip read, and RSS grew about 0.3 kB per read, linearly, over 50,000 reads (BENCHMARKS.md).
    Closing demux ourselves runs that `finally`."""
    packets = container.demux(video=0)
    try:
        yield (frame for packet in packets for frame in packet.decode())
    finally:
        packets.close()


class PyAVVideo(Video):
    """Decodes sequentially (streams without an index cannot seek reliably), converting to RGB
    at the target size only the frames asked for; the frame count and key frames come from one
    pass over the stream when the header does not carry them."""

    backend = "pyav"

    def __init__(self, path, size: tuple[int, int] | None = None):
        super().__init__(path)
        self.size = size
        self._count: int | None = None
        self._keys: list[int] | None = None
        self._fps = 0.0
        self._header()

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
        """Count frames and find key frames by decoding once (no RGB conversion)."""
        count, keys = 0, []
        with self._open() as container, _decoded(container) as decoded:
            try:
                for frame in decoded:
                    if frame.key_frame:
                        keys.append(count)
                    count += 1
            except Exception as exc:  # noqa: BLE001
                if not count:
                    raise VideoError(f"{self.path}: decoding failed ({_first_line(exc)})") from None
        if not count:
            raise VideoError(f"{self.path}: the video has no frames")
        self.decoded += count  # this pass decoded every frame too: it counts
        self._count, self._keys = count, keys or [0]

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
        last = max(indices)
        width, height = self.size or (None, None)
        with self._open() as container, _decoded(container) as decoded:
            try:
                for i, frame in enumerate(decoded):
                    self.decoded += 1
                    if i in wanted:
                        got[i] = frame.to_ndarray(format="rgb24", width=width, height=height)
                    if i >= last:
                        break
            except Exception as exc:  # noqa: BLE001
                raise VideoError(f"{self.path}: decoding failed at frame {len(got)} ({_first_line(exc)})") from None
        if not got:
            raise VideoError(f"{self.path}: no frame could be decoded")
        # A stream shorter than its header said: reuse the last decoded frame for the missing tail.
        tail = got[max(got)]
        return np.stack([got.get(i, tail) for i in indices])


def decord_missing() -> str | None:
    try:
        import decord  # noqa: F401
    except ImportError:
        return "decord is not installed"
    return None


def open_video(path: str | Path, short_side: int | None = None, backend: str = "auto") -> Video:
    """Open a video for decoding at `short_side` (None: the stored size). `auto` tries decord,
    then PyAV; the error of the last backend tried is raised, naming the file."""
    path = Path(path)
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
