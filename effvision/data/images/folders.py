"""Image datasets: ImageFolder trees in a folder or a .zip, and in-memory tensors (digits)."""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from ...errors import EffvisionError
from ..archive import open_zip
from ..layouts import ScanReport
from ..timing import NO_SPLIT

IMAGE_EXTS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
CACHE_BUDGET_BYTES = 1 << 30  # keep decoded images in memory while they fit in 1 GiB ...


def cache_budget() -> int:
    """... and in a quarter of the memory available now; a larger dataset streams from its files."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return CACHE_BUDGET_BYTES
    return min(CACHE_BUDGET_BYTES, available // 4)


def is_image(name: str) -> bool:
    return Path(name).suffix.lower() in IMAGE_EXTS


def decode_image(data: bytes) -> torch.Tensor:
    """Decode to a uint8 CHW RGB tensor; raises on a corrupt or truncated file, and on one whose
    header claims more pixels than Pillow's bomb limit (~89 M) before memory is spent on it."""
    if not data:
        raise ValueError("empty file")
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            img = Image.open(io.BytesIO(data))
        except UnidentifiedImageError:  # Pillow's message names its BytesIO object, not the file
            raise ValueError("not an image Pillow can read (unknown format or damaged header)") from None
        with img:
            img.load()
            arr = rgb8(img)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


def rgb8(img: Image.Image) -> np.ndarray:
    """H x W x 3 uint8. Gray, gray+alpha, palette, CMYK and RGBA convert as Pillow does; 16-bit
    and 32-bit gray are scaled down (Pillow's own conversion clips them to white)."""
    if img.mode.startswith("I;16"):
        top = 65535.0
    elif img.mode in ("I", "F"):
        arr = np.asarray(img, dtype=np.float64)
        peak = float(np.nanmax(arr)) if arr.size else 0.0
        top = 255.0 if peak <= 255 else 65535.0 if peak <= 65535 else peak
    else:
        return np.asarray(img.convert("RGB"))
    gray = np.clip(np.asarray(img, dtype=np.float64) * (255.0 / top), 0, 255).round().astype(np.uint8)
    return np.repeat(gray[..., None], 3, axis=2)


class FileSource:
    """Reads members of a folder or a .zip by relative name; zip handles are per process."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.exists():
            raise EffvisionError(f"data path not found: {self.path}")
        self.is_zip = self.path.is_file()
        if self.is_zip and not zipfile.is_zipfile(self.path):
            raise EffvisionError(f"{self.path} is neither a folder nor a .zip archive")
        self._zip: Optional[zipfile.ZipFile] = None
        self._pid = None

    def names(self) -> list[str]:
        if self.is_zip:  # members with unsafe names or absurd sizes refuse the whole archive
            zf, members = open_zip(self.path)
            with zf:
                return [i.filename for i in members]
        return [str(p.relative_to(self.path)) for p in sorted(self.path.rglob("*")) if p.is_file()]

    def read(self, name: str) -> bytes:
        if not self.is_zip:
            return (self.path / name).read_bytes()
        if self._zip is None or self._pid != os.getpid():  # DataLoader workers reopen
            self._zip, self._pid = zipfile.ZipFile(self.path), os.getpid()
        return self._zip.read(name)

    def where(self, name: str) -> str:
        return f"{self.path}!{name}" if self.is_zip else str(self.path / name)

    def __getstate__(self):
        return {**self.__dict__, "_zip": None, "_pid": None}


def imagefolder_entries(names: list[str]) -> tuple[list[str], list[tuple[str, int]]]:
    """Class folders and (file, label) pairs; leading folders shared by every file are skipped,
    so `train/<class>/x.jpg` inside a zip works like `<class>/x.jpg`."""
    files = [n for n in names if is_image(n) and not any(p.startswith((".", "__MACOSX")) for p in n.split("/"))]
    parts = [n.split("/") for n in files]
    skip = 0
    while parts and all(len(p) > skip + 2 for p in parts) and len({p[skip] for p in parts}) == 1:
        skip += 1
    labelled = [(n, p[skip]) for n, p in zip(files, parts, strict=True) if len(p) >= skip + 2]
    classes = sorted({c for _, c in labelled})
    index = {c: i for i, c in enumerate(classes)}
    return classes, [(n, index[c]) for n, c in labelled]


class ImageFolderDataset(torch.utils.data.Dataset):
    """ImageFolder layout (one folder per class) read from a folder or a .zip.

    Every file is decoded once when the dataset opens: a corrupt file is skipped and counted, or
    stops the run with its path (on_bad_sample). Decoded images stay in memory while they fit the
    cache budget (cache_budget(), or cache_bytes); a larger dataset streams from its files.
    """

    def __init__(
        self,
        path: str | Path,
        on_bad_sample: str = "skip",
        progress: Callable | None = None,
        cache_bytes: int | None = None,
    ):
        self.source = FileSource(path)
        budget = cache_budget() if cache_bytes is None else cache_bytes
        self.classes, entries = imagefolder_entries(self.source.names())
        if not entries:
            raise EffvisionError(f"no images in ImageFolder layout (<class>/<image>) under {path}")
        self.transform = None
        self.report = ScanReport(total=len(entries))
        self.samples: list[tuple[str, int]] = []
        self.cache: list[torch.Tensor] | None = []
        cached_bytes = 0
        for name, label in (progress or (lambda it, **_: it))(entries, description=f"reading {self.source.path.name}"):
            try:
                img = decode_image(self.source.read(name))
            except Exception as exc:  # noqa: BLE001  (PIL raises many types for bad files)
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if on_bad_sample == "fail":
                    raise EffvisionError(
                        f"corrupt image {self.source.where(name)}: {reason} (set data.on_bad_sample=skip to skip "
                        "such files)"
                    ) from None
                self.report.bad.append((self.source.where(name), reason))
                continue
            self.samples.append((name, label))
            if self.cache is not None:
                cached_bytes += img.numel()
                self.cache.append(img)
                if cached_bytes > budget:
                    self.cache = None  # too big to hold: every read decodes its file
        if not self.samples:
            raise EffvisionError(f"every image under {path} is unreadable ({len(self.report.bad)} files)")
        self.targets = [label for _, label in self.samples]
        self.split = NO_SPLIT  # a benchmark's TimeSplit

    def __len__(self) -> int:
        return len(self.samples)

    def image(self, i: int) -> torch.Tensor:
        return self.cache[i] if self.cache is not None else decode_image(self.source.read(self.samples[i][0]))

    def __getitem__(self, i: int):
        with self.split("read"):
            img = self.image(i)
        return (self.transform(img) if self.transform else img), self.targets[i]


class TensorImageDataset(torch.utils.data.Dataset):
    """Images already in memory as a uint8 N x 3 x H x W tensor."""

    def __init__(self, images: torch.Tensor, targets: list[int], classes: list[str]):
        self.images, self.targets, self.classes = images, list(targets), classes
        self.transform = None
        self.report = ScanReport(total=len(targets))
        self.split = NO_SPLIT  # a benchmark's TimeSplit

    def __len__(self) -> int:
        return len(self.targets)

    def image(self, i: int) -> torch.Tensor:
        return self.images[i]

    def __getitem__(self, i: int):
        with self.split("read"):
            img = self.images[i]
        return (self.transform(img) if self.transform else img), self.targets[i]
