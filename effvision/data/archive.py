"""Zip archives from the wild, opened safely: member names that would land outside the target
folder (zip-slip: `../x`, `/etc/x`, `C:\\x`) and absurd uncompressed sizes (zip bombs) are refused
before a byte is written or read; extraction lands whole or not at all."""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path, PurePosixPath

from ..errors import EffvisionError
from ..fileio import new_temporary_dir

MAX_MEMBER_BYTES = 8 << 30  # one image, video or point cloud: 8 GiB is already absurd
MAX_RATIO = 1000  # deflate reaches ~1000:1 only on degenerate data, a bomb's signature
RATIO_FLOOR = 1 << 20  # small members may compress far (blank images), harmless
DONE = ".effvision-extracted"


class ArchiveError(EffvisionError):
    """An archive refused as unsafe or unreadable (the message names the archive and member)."""


def unsafe_name(name: str) -> str | None:
    """Why a member name may not be used as a relative path, or None when it is safe."""
    if not name or "\x00" in name:
        return "an empty or NUL-containing name"
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "an absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "a path that leaves the archive's folder"
    return None


def check_members(zf: zipfile.ZipFile, where: str | Path) -> list[zipfile.ZipInfo]:
    """The archive's file members, after refusing unsafe names and absurd sizes."""
    members = []
    for info in zf.infolist():
        why = unsafe_name(info.filename)
        if why:
            raise ArchiveError(f"{where}: refused member {info.filename!r}: {why} (zip-slip)")
        if info.is_dir():
            continue
        if info.file_size > MAX_MEMBER_BYTES:
            raise ArchiveError(
                f"{where}: refused member {info.filename!r}: {info.file_size / 2**30:.1f} GiB uncompressed "
                f"(limit {MAX_MEMBER_BYTES >> 30} GiB)"
            )
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise ArchiveError(
                f"{where}: refused member {info.filename!r}: expands {info.file_size // max(info.compress_size, 1)}x "
                f"(limit {MAX_RATIO}x; a zip bomb?)"
            )
        members.append(info)
    return members


def open_zip(path: str | Path) -> tuple[zipfile.ZipFile, list[zipfile.ZipInfo]]:
    """An opened archive and its checked file members; a damaged archive is one clear error."""
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{path}: not a readable .zip archive ({exc})") from None
    try:
        return zf, check_members(zf, path)
    except Exception:
        zf.close()
        raise


def inside(folder: Path, name: str) -> Path:
    """folder/name, refusing a name that resolves outside folder (the check behind every write
    of an archive member or a dataset file name taken from user data)."""
    why = unsafe_name(name)
    target = (folder / name).resolve()
    if why or not target.is_relative_to(folder.resolve()):
        raise ArchiveError(f"refused to write {name!r} under {folder}: {why or 'it resolves outside the folder'}")
    return target


def extract_once(archive: str | Path, cache_dir: str | Path) -> Path:
    """Extract archive under cache_dir (keyed by its path, size and mtime) unless already done;
    returns the folder. Extraction goes to a temporary folder renamed into place when complete,
    so a killed extraction is never taken for a finished one."""
    archive = Path(archive)
    stat = archive.stat()
    key = hashlib.sha1(json.dumps([str(archive.resolve()), stat.st_size, stat.st_mtime_ns]).encode()).hexdigest()[:12]
    dest = Path(cache_dir).expanduser() / "extracted" / f"{archive.stem}-{key}"
    if (dest / DONE).is_file():
        return dest
    zf, members = open_zip(archive)
    with zf:
        need = sum(i.file_size for i in members)
        dest.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(dest.parent).free
        if need > free:
            raise ArchiveError(
                f"{archive}: needs {need / 2**30:.1f} GiB to extract, {free / 2**30:.1f} GiB free under {dest.parent}"
            )
        tmp = new_temporary_dir(dest)
        try:
            for info in members:
                target = inside(tmp, info.filename)
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)
            (tmp / DONE).write_text(str(archive))
            if dest.exists():
                shutil.rmtree(dest)
            tmp.rename(dest)
        except zipfile.BadZipFile as exc:
            raise ArchiveError(f"{archive}: damaged archive ({exc})") from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return dest
