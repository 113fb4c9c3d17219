"""Prepare CIFAR-10 for the `cifar10` card: torchvision's python archive to two ImageFolder JPEG zips.

The archive (cifar-10-python.tar.gz, or its extracted cifar-10-batches-py folder) holds Python
pickles. They come from a file the user hands us, so they are read with an unpickler that builds
only numpy arrays, numbers, strings and containers: a tampered batch that asks for anything else
(os.system, ...) is refused before any of it runs.
"""

from __future__ import annotations

import codecs
import io
import pickle
import shutil
import socket
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Any, Callable

import numpy as np
from numpy._core.multiarray import _reconstruct as _np_reconstruct
from PIL import Image

from ...errors import EffvisionError
from ...fileio import atomic_write
from ...progress import track
from ..archive import unsafe_name

TRAIN_ZIP = "cifar10-jpeg-train.zip"
TEST_ZIP = "cifar10-jpeg-test.zip"
BATCH_DIR = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"
HOME_PAGE = "https://www.cs.toronto.edu/~kriz/cifar.html"
SIDE = 32
ROW = 3 * SIDE * SIDE  # one image: 1024 red, then 1024 green, then 1024 blue values, row-major
MAX_MEMBER_BYTES = 256 << 20  # a real batch is 31 MB; a member claiming more would only fill memory
DOWNLOAD_TIMEOUT_S = 60  # per socket operation: a stalled connection fails instead of hanging forever
# Fixed member timestamps make the zips byte-identical across runs of the same archive.
ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def _reconstruct(subtype, shape, dtype):
    # numpy's pickles always start from an empty plain ndarray and fill it with BUILD; refusing
    # anything else keeps a crafted pickle from allocating a huge array or a foreign subclass
    if subtype is not np.ndarray or tuple(shape) != (0,):
        raise pickle.UnpicklingError(
            f"unexpected array reconstruction ({getattr(subtype, '__name__', subtype)}, {shape})"
        )
    return _np_reconstruct(subtype, shape, dtype)


def _latin1(text: str, encoding: str = "utf-8") -> bytes:
    # protocol-2 pickles written by Python 3 spell every bytes object as _codecs.encode(text, 'latin1');
    # other codecs are not needed and not offered
    if codecs.lookup(encoding).name != "iso8859-1":
        raise pickle.UnpicklingError(f"unexpected codec {encoding!r}")
    return codecs.encode(text, "latin1")


# Everything a CIFAR-10 batch needs: numpy's array reconstruction (both module names numpy has
# used; the real files were written with numpy.core), dtypes and Python 3's spelling of bytes.
_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1,
}


class _BatchUnpickler(pickle.Unpickler):
    """Builds only what _ALLOWED names; every other global is refused with the file's name."""

    def __init__(self, data: bytes, where: str):
        # latin1: the real files are Python 2 pickles, whose byte strings (keys, names, pixel
        # buffers) numpy and torchvision read as latin1 text
        super().__init__(io.BytesIO(data), encoding="latin1")
        self.where = where

    def find_class(self, module: str, name: str):
        found = _ALLOWED.get((module, name))
        if found is None:
            raise EffvisionError(
                f"{self.where}: refused to unpickle {module}.{name}: a CIFAR-10 batch holds only arrays, "
                "numbers and strings (a tampered or foreign file?)"
            )
        return found


def _unpickle(data: bytes, where: str) -> dict[str, Any]:
    try:
        obj = _BatchUnpickler(data, where).load()
    except EffvisionError:
        raise
    except Exception as exc:  # noqa: BLE001  (a damaged pickle raises many types; all are the input's fault)
        raise EffvisionError(f"{where}: not a readable CIFAR-10 batch ({_first_line(exc)})") from None
    if not isinstance(obj, dict):
        raise EffvisionError(f"{where}: not a CIFAR-10 batch (a pickled {type(obj).__name__}, expected a dict)")
    # Python 2's files read as str keys, Python 3 re-pickles often carry bytes keys: accept both
    return {_text(k): v for k, v in obj.items()}


def _text(value: Any) -> Any:
    return value.decode("latin1") if isinstance(value, bytes) else value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _read_members(archive: Path) -> dict[str, tuple[str, bytes]]:
    """base name -> (where it was, bytes) of the batch files in a tar.gz or an extracted folder."""
    wanted = {*TRAIN_BATCHES, TEST_BATCH, META}
    found: dict[str, tuple[str, bytes]] = {}
    if archive.is_dir():
        folder = archive / BATCH_DIR if (archive / BATCH_DIR).is_dir() else archive
        for name in sorted(wanted):
            path = folder / name
            if path.is_file():
                if path.stat().st_size > MAX_MEMBER_BYTES:
                    raise EffvisionError(f"{path}: {path.stat().st_size >> 20} MiB, too large for a CIFAR-10 batch")
                found[name] = (str(path), path.read_bytes())
        return found
    try:
        # one pass in archive order: a .gz cannot seek back without decompressing again
        with tarfile.open(archive, "r:gz") as tf:
            for member in tf:
                name = PurePosixPath(member.name).name
                if not member.isfile() or name not in wanted or name in found:
                    continue
                if member.size > MAX_MEMBER_BYTES:
                    raise EffvisionError(
                        f"{archive}: member {member.name} is {member.size >> 20} MiB, too large for a CIFAR-10 batch"
                    )
                src = tf.extractfile(member)
                found[name] = (f"{archive}!{member.name}", src.read() if src else b"")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise EffvisionError(
            f"{archive}: not a readable cifar-10-python.tar.gz ({_first_line(exc)}); get it from {HOME_PAGE}"
        ) from None
    return found


def _check_batch(batch: dict[str, Any], where: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(N x 3072 uint8 rows, N labels) of one batch, or one line saying what is wrong with it."""
    data, labels = batch.get("data"), batch.get("labels")
    if data is None or labels is None:
        raise EffvisionError(f"{where}: no 'data' or no 'labels' entry (keys: {', '.join(map(str, batch))})")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != ROW:
        what = f"{data.shape} {data.dtype}" if isinstance(data, np.ndarray) else type(data).__name__
        raise EffvisionError(f"{where}: 'data' is {what}, expected N x {ROW} uint8 ({SIDE}x{SIDE} RGB images)")
    if not len(data):
        raise EffvisionError(f"{where}: no images")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise EffvisionError(f"{where}: 'labels' is not a list of integers") from None
    if labels.shape != (len(data),):
        raise EffvisionError(f"{where}: {labels.size} labels for {len(data)} images")
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        raise EffvisionError(
            f"{where}: label {labels[bad[0]]} of image {bad[0]} is outside 0..{num_classes - 1} "
            f"({num_classes} classes in {META})"
        )
    return data, labels


def _class_names(meta: dict[str, Any], where: str) -> list[str]:
    names = meta.get("label_names")
    if not isinstance(names, list) or not names:
        raise EffvisionError(f"{where}: no 'label_names' list")
    names = [_text(n) for n in names]
    for n in names:
        # each name becomes a folder inside the zips
        if not isinstance(n, str) or "/" in n or "\\" in n or n.startswith(".") or unsafe_name(n):
            raise EffvisionError(f"{where}: {n!r} cannot name a class folder")
    if len(set(names)) != len(names):
        raise EffvisionError(f"{where}: class names repeat ({', '.join(names)})")
    return names


def read_cifar10(archive: str | Path) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """(class names, {"train": (images, labels), "test": (images, labels)}) of the archive, images
    as N x 32 x 32 x 3 uint8; one EffvisionError naming the archive for anything missing or wrong."""
    archive = Path(archive).expanduser()
    if not archive.exists():
        raise EffvisionError(f"CIFAR-10 archive not found: {archive} (get cifar-10-python.tar.gz from {HOME_PAGE})")
    members = _read_members(archive)
    missing = [n for n in (META, *TRAIN_BATCHES, TEST_BATCH) if n not in members]
    if missing:
        raise EffvisionError(
            f"{archive}: missing {', '.join(f'{BATCH_DIR}/{n}' for n in missing)} "
            f"(is it CIFAR-10's python version, cifar-10-python.tar.gz?)"
        )
    where, data = members.pop(META)
    classes = _class_names(_unpickle(data, where), where)
    splits = {}
    for split, names in (("train", TRAIN_BATCHES), ("test", (TEST_BATCH,))):
        parts = []
        for name in names:
            where, data = members.pop(name)
            parts.append(_check_batch(_unpickle(data, where), where, len(classes)))
        rows = np.concatenate([d for d, _ in parts])
        images = rows.reshape(-1, 3, SIDE, SIDE).transpose(0, 2, 3, 1)
        splits[split] = (np.ascontiguousarray(images), np.concatenate([y for _, y in parts]))
    return classes, splits


def _jpeg(image: np.ndarray, quality: int) -> bytes:
    buf = io.BytesIO()
    # 4:4:4: chroma subsampling would halve a 32x32 image's colour resolution to 16x16
    Image.fromarray(image, "RGB").save(buf, format="JPEG", quality=quality, subsampling=0)
    return buf.getvalue()


def _write_split(
    path: Path, split: str, images: np.ndarray, labels: np.ndarray, classes: list[str], quality: int, progress
) -> int:
    """Write <split>/<class>/<nnnn>.jpg members (grouped by class, numbered within it, in the
    archive's order) to path atomically; returns the file's size."""
    order = np.argsort(labels, kind="stable")
    width = max(4, len(str(int(np.bincount(labels, minlength=len(classes)).max()) - 1)))

    def write(tmp: Path) -> None:
        seen = [0] * len(classes)
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zf:  # JPEG does not deflate further
            for i in progress(order, description=f"writing {path.name}", total=len(order)):
                c = int(labels[i])
                info = zipfile.ZipInfo(f"{split}/{classes[c]}/{seen[c]:0{width}d}.jpg", date_time=ZIP_DATE)
                info.external_attr = 0o644 << 16
                zf.writestr(info, _jpeg(images[i], quality))
                seen[c] += 1

    atomic_write(path, write)
    return path.stat().st_size


def _download(dest_dir: Path) -> Path:
    """Fetch cifar-10-python.tar.gz with torchvision's downloader (checked against its MD5)."""
    from torchvision.datasets import CIFAR10
    from torchvision.datasets.utils import download_url

    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(DOWNLOAD_TIMEOUT_S)
    try:
        download_url(CIFAR10.url, str(dest_dir), filename=CIFAR10.filename, md5=CIFAR10.tgz_md5)
    finally:
        socket.setdefaulttimeout(previous)
    return dest_dir / CIFAR10.filename


def _no_progress(items, **_):
    return items


def prepare_cifar10(
    dest: str | Path,
    archive: str | Path | None = None,
    *,
    quality: int = 95,
    progress: bool | Callable = True,
) -> dict[str, Any]:
    """Write dest/cifar10-jpeg-train.zip (train/<class>/<n>.jpg) and dest/cifar10-jpeg-test.zip
    (test/<class>/<n>.jpg), the two zips data/cifar10.yaml reads, from torchvision's
    cifar-10-python.tar.gz (or its extracted folder); without an archive, download it first.
    Each zip is replaced atomically. Returns a summary: source, classes and per file its split,
    path, image count and size."""
    if not 1 <= quality <= 100:
        raise EffvisionError(f"JPEG quality must be 1..100, got {quality}")
    dest = Path(dest).expanduser()
    if dest.exists() and not dest.is_dir():
        raise EffvisionError(f"{dest} is a file; give the folder the CIFAR-10 zips go into")
    dest.mkdir(parents=True, exist_ok=True)
    bar = track if progress is True else (progress or _no_progress)
    if archive is not None:
        return _convert(Path(archive), dest, quality, bar, source=str(archive))
    tmp = Path(tempfile.mkdtemp(prefix=".cifar10-download.", dir=dest))
    try:
        try:
            downloaded = _download(tmp)
        except Exception as exc:  # noqa: BLE001  (offline, refused, timed out, checksum: all end the same way)
            raise EffvisionError(
                f"could not download CIFAR-10 ({_first_line(exc)}); pass --from cifar-10-python.tar.gz "
                f"(the archive from {HOME_PAGE}), or set data.root to a folder that already holds "
                f"{TRAIN_ZIP} and {TEST_ZIP}"
            ) from None
        return _convert(downloaded, dest, quality, bar, source="downloaded cifar-10-python.tar.gz")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert(archive: Path, dest: Path, quality: int, progress, source: str) -> dict[str, Any]:
    classes, splits = read_cifar10(archive)
    files = []
    for split, name in (("train", TRAIN_ZIP), ("test", TEST_ZIP)):
        images, labels = splits.pop(split)  # pop: the train pixels can go before the test zip is written
        size = _write_split(dest / name, split, images, labels, classes, quality, progress)
        files.append({"split": split, "path": str(dest / name), "images": len(labels), "bytes": size})
    return {"source": source, "dest": str(dest), "classes": classes, "quality": quality, "files": files}
