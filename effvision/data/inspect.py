"""`effvision data inspect`: decode every file under a path (folder, .zip or file), one status each."""
from __future__ import annotations

from pathlib import Path

from ..errors import EffvisionError
from .images import IMAGE_EXTS, FileSource, decode_image, is_image


def _status(path: str, kind=None, shape=None, error=None) -> dict:
    return {"path": path, "ok": error is None, "kind": kind, "shape": shape, "frames": None, "points": None, "error": error}


def inspect_one(source: FileSource, name: str) -> dict:
    where = source.where(name)
    if not is_image(name):
        return _status(where, error=f"unsupported file type (images: {', '.join(sorted(e[1:] for e in IMAGE_EXTS))})")
    try:
        img = decode_image(source.read(name))
    except Exception as exc:  # noqa: BLE001
        return _status(where, "image", error=(str(exc).splitlines() or [type(exc).__name__])[0])
    c, h, w = img.shape
    return _status(where, "image", [h, w, c])


def inspect_path(path: str | Path, progress=None) -> list[dict]:
    path = Path(path)
    if not path.exists():
        raise EffvisionError(f"path not found: {path}")
    if path.is_file() and is_image(path.name):
        return [inspect_one(FileSource(path.parent), path.name)]
    source = FileSource(path)
    names = source.names()
    return [inspect_one(source, n) for n in (progress or (lambda it, **_: it))(names, description=f"inspecting {path.name}")]
