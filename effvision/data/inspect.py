"""`effvision data inspect`: decode every file under a path (folder, .zip or file), one status each."""

from __future__ import annotations

from pathlib import Path

from ..errors import EffvisionError
from .images.folders import IMAGE_EXTS, FileSource, decode_image, is_image
from .points.io import POINT_EXTS, PointCloudError, is_point_file
from .video.io import VIDEO_EXTS, VideoError, is_video, open_video


def _status(path: str, kind=None, shape=None, error=None, **more) -> dict:
    return {
        "path": path,
        "ok": error is None,
        "kind": kind,
        "shape": shape,
        "frames": None,
        "points": None,
        "error": error,
        **more,
    }


def inspect_video(source: FileSource, name: str) -> dict:
    """Frames, fps, resolution and the backend that decoded it: the first, middle and last
    frames are decoded, so a file that opens but breaks part-way is caught."""
    where = source.where(name)
    if source.is_zip:
        return _status(where, "video", error="videos inside a .zip are not read; extract the archive")
    try:
        video = open_video(source.path / name)
        n = len(video)
        frames = video.frames(sorted({0, n // 2, n - 1}))
    except VideoError as exc:
        return _status(where, "video", error=str(exc).replace(f"{source.path / name}: ", ""))
    h, w, c = frames.shape[1:]
    return _status(where, "video", [h, w, c], frames=n, fps=round(video.fps, 3), backend=video.backend)


def inspect_points(source: FileSource, name: str, bin_width: int | None = None) -> dict:
    """Points (a mesh's vertices and faces) and channels of a point-cloud or mesh file."""
    from .points.io import describe

    where = source.where(name)
    if source.is_zip:
        return _status(where, "points", error="point clouds inside a .zip are not read; extract the archive")
    try:
        info = describe(source.path / name, bin_width)
    except PointCloudError as exc:
        return _status(where, "points", error=str(exc).replace(f"{source.path / name}: ", ""))
    return _status(where, "points", [info["points"], info["channels"]], **info)


def inspect_one(source: FileSource, name: str, bin_width: int | None = None) -> dict:
    where = source.where(name)
    if is_video(name):
        return inspect_video(source, name)
    if is_point_file(name):
        status = inspect_points(source, name, bin_width)
        if status["ok"] or not name.lower().endswith(".txt"):
            return status
        # A .txt that is not rows of numbers is a note or a list, not a broken point cloud.
    if not is_image(name):
        known = sorted(e[1:] for e in IMAGE_EXTS | VIDEO_EXTS | POINT_EXTS)
        return _status(where, error=f"unsupported file type (images, videos and point clouds: {', '.join(known)})")
    try:
        img = decode_image(source.read(name))
    except Exception as exc:  # noqa: BLE001
        return _status(where, "image", error=(str(exc).splitlines() or [type(exc).__name__])[0])
    c, h, w = img.shape
    return _status(where, "image", [h, w, c])


def inspect_path(path: str | Path, progress=None, bin_width: int | None = None) -> list[dict]:
    """One status per file; `bin_width` is the float32 values per record of raw LiDAR .bin files
    (default: a guess by convention, see point_io.guess_bin_width)."""
    path = Path(path)
    if not path.exists():
        raise EffvisionError(f"path not found: {path}")
    if path.is_file() and (is_image(path.name) or is_video(path.name) or is_point_file(path.name)):
        return [inspect_one(FileSource(path.parent), path.name, bin_width)]
    source = FileSource(path)
    names = source.names()
    return [
        inspect_one(source, n, bin_width)
        for n in (progress or (lambda it, **_: it))(names, description=f"inspecting {path.name}")
    ]
