"""One writer per run folder: an exclusive lock held while a pipeline writes the folder.

flock() belongs to the open file, so the operating system drops it when the process ends in any
way, SIGKILL included: a killed run never leaves a stale lock for its resume to trip over."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path
from typing import Iterator

from .errors import EffvisionError

LOCK_NAME = ".lock"


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold run_dir's lock, or refuse at once (naming the holder) when another process has it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise EffvisionError(
                f"run folder {run_dir} is in use by another effvision run ({holder}); "
                "wait for it to finish, or give this run its own --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(
            fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0
        )
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a waiting run)
