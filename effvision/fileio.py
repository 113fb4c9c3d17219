"""Atomic writes: a run folder never holds a half-written file, even when a run is killed.

Every file and folder written here gets the mode the user's umask gives a new one (0644 and 0755
under umask 0022), like any other program's output: a teammate, a web server showing the report or
a deploy job under another account can read them. tempfile.mkstemp and mkdtemp would create them
owner-only (0600, 0700), and a rename keeps that mode."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

from .errors import EffvisionError

# Write errors that are the machine's, not the program's: said in one line naming the file.
WRITE_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EIO: "an input/output error (the disk failed)",
    errno.EROFS: "the file system is read-only",
    errno.EFBIG: "the file would be too large for the file system",
}


class WriteFailed(EffvisionError):
    """A file could not be written; nothing half-written was left in its place."""

    def __init__(self, path: str | Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"cannot write {path}: {reason}")


def write_failure(exc: BaseException, path: str | Path) -> WriteFailed | None:
    """The WriteFailed an exception raised while writing `path` amounts to, or None when it is
    not a write error (a bug, a bad input). torch's zip writer reports a full disk as a
    RuntimeError ("unexpected pos ..."), not as ENOSPC: the free space tells them apart."""
    if isinstance(exc, WriteFailed):
        return exc
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRORS:
        return WriteFailed(exc.filename or path, WRITE_ERRORS[exc.errno])
    text = str(exc)
    if isinstance(exc, RuntimeError) and any(s in text for s in ("unexpected pos", "file write failed")):
        try:
            free = shutil.disk_usage(Path(path).parent).free
        except OSError:
            free = None
        full = free is not None and free < (1 << 20)
        return WriteFailed(path, WRITE_ERRORS[errno.ENOSPC] if full else f"the write stopped ({text.splitlines()[0]})")
    return None


def new_temporary_file(path: Path) -> Path:
    """An empty, new file beside path (hidden, ending .tmp), created with the umask's mode."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the kernel applies the umask
            return tmp
        except FileExistsError:
            continue


def new_temporary_dir(path: Path) -> Path:
    """A new, empty folder beside path, to be renamed onto it once complete (umask's mode); named
    .<name>.<pid>.<random>, so a writer that died can be told from a live one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def write_errors_said(path: str | Path) -> Iterator[None]:
    """Write errors inside the block (a full disk, a read-only or failing one) become one
    WriteFailed naming `path`; anything else passes unchanged."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001  (a full disk shows as OSError, or as torch's RuntimeError)
        failure = write_failure(exc, path)
        if failure is None or failure is exc:
            raise
        raise failure from None


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call write(tmp_path) then rename tmp onto path, so readers see old or new, never partial."""
    path = Path(path)
    with write_errors_said(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = new_temporary_file(path)
        try:
            write(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return path


def atomic_dir(path: str | Path, fill: Callable[[Path], None]) -> Path:
    """Call fill(tmp_folder) then put the folder in place of path (an older one is replaced
    whole), so readers see the old folder or the new, never a mix or a half."""
    path = Path(path)
    with write_errors_said(path):
        tmp = new_temporary_dir(path)
        try:
            fill(tmp)
            old = None
            if path.exists():
                old = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.old"
                os.rename(path, old)
            os.rename(tmp, path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return path


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text))


def write_json(path: str | Path, data: Any) -> Path:
    return write_text(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())
