"""Cache entries that several runs share and can trust: decoded images, sampled point clouds,
farthest-point orders, latency tables.

An entry is a file written once (atomically: a temporary file, then a rename) and a seal beside
it, `<entry>.seal`, holding its length and CRC-32. A reader uses an entry only when its seal
matches; a missing seal, a wrong length (a truncated file) or a wrong checksum (flipped bits) is
said in one line and the entry is built again. Builders of one entry take a lock
(`<entry>.lock`, fcntl), so two processes that need it at once build it once: the second waits,
then finds it sealed."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import zlib
from pathlib import Path
from typing import Callable, Iterator

from .fileio import new_temporary_file, write_errors_said, write_text
from .progress import log

SEAL_FORMAT = "effvision-cache-seal/1"


def seal_path(path: Path) -> Path:
    return path.with_name(path.name + ".seal")


def checksum(path: Path) -> tuple[int, int]:
    """(bytes, CRC-32) of a file, read in blocks (a cache can be larger than memory)."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            crc, size = zlib.crc32(block, crc), size + len(block)
    return size, crc


def damage(path: Path) -> str | None:
    """Why the entry at `path` cannot be trusted, or None when it is whole."""
    try:
        seal = json.loads(seal_path(path).read_text())
        if seal.get("format") != SEAL_FORMAT:
            return "its seal is not one effvision wrote"
    except FileNotFoundError:
        return "it has no seal (written by an older effvision, or its writer stopped)"
    except (OSError, ValueError) as exc:
        return f"its seal is unreadable ({type(exc).__name__})"
    actual = path.stat().st_size
    if actual != seal["bytes"]:
        return f"{actual} bytes where {seal['bytes']} were written (truncated or overwritten)"
    if checksum(path)[1] != seal["crc32"]:
        return "its checksum does not match (the file's bytes changed)"
    return None


def _seal(path: Path) -> None:
    size, crc = checksum(path)
    write_text(seal_path(path), json.dumps({"format": SEAL_FORMAT, "bytes": size, "crc32": crc}) + "\n")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock = path.with_name(path.name + ".lock")
    with write_errors_said(lock):
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(lock, "a")  # noqa: SIM115  (closed below, after the lock is released)
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _trusted(path: Path, what: str) -> bool:
    """Under the entry's lock: True when it exists and its seal holds; a damaged one is said (it
    is then written anew by the caller). Without the lock a reader could catch a writer between
    its rename and its seal, so only the lock holder judges damage."""
    if not path.is_file():
        return False
    why = damage(path)
    if why is not None:
        log(f"[yellow]{what} cache {path} is damaged: {why}; building it again[/]")
    return why is None


def entry(path: str | Path, write: Callable[[Path], None], what: str) -> Path:
    """The sealed entry at `path`, built by write(tmp) when it is missing or damaged (under the
    entry's lock, so concurrent builders build it once)."""
    return entries([Path(path)], lambda tmps: write(tmps[0]), what)[0]


def entries(paths: list[Path], write: Callable[[list[Path]], None], what: str) -> list[Path]:
    """Files that belong together (a split's clouds and their labels), built together by
    write(tmps) when any is missing or damaged, each renamed into place and sealed."""
    if all(p.is_file() and damage(p) is None for p in paths):  # the common case: no lock needed
        return paths
    with _locked(paths[0]):
        if all(_trusted(p, what) for p in paths):  # another process built them while this one waited
            return paths
        for p in paths:
            seal_path(p).unlink(missing_ok=True)  # no seal until the new bytes are in place
        with write_errors_said(paths[0]):
            tmps = [new_temporary_file(p) for p in paths]
            try:
                write(tmps)
                for tmp, p in zip(tmps, paths, strict=True):
                    os.replace(tmp, p)
            finally:
                for tmp in tmps:
                    tmp.unlink(missing_ok=True)
        for p in paths:
            _seal(p)
    return paths


def update(path: str | Path, change: Callable[[dict], dict], what: str) -> dict:
    """Read-modify-write of a sealed JSON entry under its lock: `change` gets the current value
    (empty when missing or damaged) and returns the new one, which is written and sealed."""
    path = Path(path)
    with _locked(path):
        value = change(json.loads(path.read_text()) if _trusted(path, what) else {})
        seal_path(path).unlink(missing_ok=True)
        write_text(path, json.dumps(value, indent=2) + "\n")
        _seal(path)
    return value


def read_json(path: str | Path, what: str) -> dict:
    """A sealed JSON entry's value, or {} when it is missing or damaged."""
    path = Path(path)
    with _locked(path):
        return json.loads(path.read_text()) if _trusted(path, what) else {}


def open_memmap(path: Path, dtype, shape: tuple[int, ...]):
    """A new .npy file mapped for writing, its blocks reserved first: on a full disk the
    reservation fails with ENOSPC (one line), where writing into a sparse mapping would kill the
    process with SIGBUS."""
    import numpy as np

    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=shape)
    with open(path, "r+b") as f:
        os.posix_fallocate(f.fileno(), 0, os.path.getsize(path))
    return out
