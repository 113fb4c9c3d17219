"""`effvision predict`: a predictor over files, folders (recursively) and zips of images. A file
that cannot be read is one status line and the rest go on; a folder in ImageFolder layout (the
parent folder names a class) is also scored against its labels."""

from __future__ import annotations

import statistics
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch

from ..errors import EffvisionError
from .predictor import Predictor


def kind_of(name: str) -> str | None:
    """image, video or points by the file's extension; None for anything else."""
    from ..data.images.folders import is_image
    from ..data.points.io import is_point_file
    from ..data.video.io import is_video

    return "image" if is_image(name) else "video" if is_video(name) else "points" if is_point_file(name) else None


@dataclass
class Item:
    name: str  # what the user sees: a path, or archive.zip!member
    read: object  # what the predictor's preprocessing takes: a path, or a member's bytes (a callable)
    label: str | None  # the parent folder's name when it is one of the model's classes


@dataclass
class Outcome:
    rows: list[dict] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    batch_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0


def items(inputs: list[str], modality: str, classes: list[str]) -> tuple[list[Item], list[tuple[str, str]]]:
    """The inputs the model can take, and the ones it cannot (as status lines). Folders are
    walked recursively, zips read member by member (images); a named file of another modality is
    refused in one line when nothing else is given."""
    known, found, other = set(classes), [], []

    def label(parent: str) -> str | None:
        return parent if parent in known else None

    for arg in inputs:
        path = Path(arg)
        if not path.exists():
            raise EffvisionError(f"input not found: {arg}")
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            found += [Item(str(p), p, label(p.parent.name)) for p in files if kind_of(p.name) == modality]
            continue
        if path.suffix.lower() == ".zip":
            found += _zip_items(path, modality, label)
            continue
        kind = kind_of(path.name)
        if kind != modality:
            other.append(
                (str(path), f"not a {modality} file the model can take ({kind or 'unknown'} by its extension)")
            )
            continue
        found.append(Item(str(path), path, label(path.parent.name)))
    if not found:
        if other:
            raise EffvisionError(f"the model takes {_plural(modality)}; {other[0][0]}: {other[0][1]}")
        raise EffvisionError(f"no {modality} files in {', '.join(inputs)}")
    return found, other


def _plural(modality: str) -> str:
    return {"image": "images", "video": "videos", "points": "point clouds"}[modality]


def _zip_items(path: Path, modality: str, label) -> list[Item]:
    from ..data.archive import open_zip
    from ..data.images.folders import FileSource

    if not zipfile.is_zipfile(path):
        raise EffvisionError(f"{path} is not a readable .zip archive")
    if modality != "image":
        raise EffvisionError(f"{path}: zips of {_plural(modality)} are not read; unpack it and give the folder")
    zf, members = open_zip(path)
    with zf:
        names = [m.filename for m in members if not m.is_dir() and kind_of(m.filename) == "image"]

    source = FileSource(path)  # one handle for every member

    def reader(name: str):
        return lambda: source.read(name)

    return [Item(f"{path}!{n}", reader(n), label(Path(n).parent.name)) for n in names]


def run(predictor: Predictor, found: list[Item], batch: int = 32, topk: int = 5) -> Iterator[tuple[str, object]]:
    """Yields ('row', dict) per predicted input and ('skip', (name, why)) per unreadable one, then
    ('done', Outcome). Inputs are prepared one by one and run `batch` at a time."""
    outcome, pending = Outcome(), []
    start = time.perf_counter()

    def flush():
        x = torch.stack([t for _, t in pending])
        t0 = time.perf_counter()
        probs = predictor.probabilities(x)
        outcome.batch_ms.append(1000 * (time.perf_counter() - t0))
        rows = []
        for (item, _), p in zip(pending, probs, strict=True):
            top = predictor.top(p, topk)
            rows.append(
                {"input": item.name, "top": [{"class": c, "p": round(q, 6)} for c, q in top], "label": item.label}
            )
        pending.clear()
        return rows

    for item in found:
        try:
            source = item.read() if callable(item.read) else item.read
            pending.append((item, predictor.preprocess(source)))
        except Exception as exc:  # noqa: BLE001  (a bad file of any kind is a status line, never a stop)
            why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            outcome.skipped.append((item.name, why))
            yield "skip", (item.name, why)
            continue
        if len(pending) == batch:
            for row in flush():
                outcome.rows.append(row)
                yield "row", row
    if pending:
        for row in flush():
            outcome.rows.append(row)
            yield "row", row
    outcome.seconds = time.perf_counter() - start
    yield "done", outcome


def summary(outcome: Outcome, batch: int) -> dict:
    """Files per second (reading, preparing and running), the model's median time per batch,
    and the top-1 against folder labels where the inputs had them."""
    labelled = [r for r in outcome.rows if r["label"] is not None]
    correct = sum(r["top"][0]["class"] == r["label"] for r in labelled)
    return {
        "predicted": len(outcome.rows),
        "skipped": len(outcome.skipped),
        "seconds": round(outcome.seconds, 3),
        "files_per_s": round(len(outcome.rows) / outcome.seconds, 1) if outcome.seconds else None,
        "batch": batch,
        "p50_batch_ms": round(statistics.median(outcome.batch_ms), 3) if outcome.batch_ms else None,
        "labelled": len(labelled),
        "top1": correct / len(labelled) if labelled else None,
        "correct": correct,
    }
