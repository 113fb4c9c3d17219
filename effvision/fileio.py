"""Atomic writes: a run folder never holds a half-written file, even when a run is killed.

Every file and folder written here gets the mode the user's umask gives a new one (0644 and 0755
under umask 0022), like any other program's output: a teammate, a web server showing the report or
a deploy job under another account can read them. tempfile.mkstemp and mkdtemp would create them
owner-only (0600, 0700), and a rename keeps that mode."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any, Callable


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


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call write(tmp_path) then rename tmp onto path, so readers see old or new, never partial."""
    path = Path(path)
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
    import shutil

    path = Path(path)
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
