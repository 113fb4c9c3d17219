"""Who writes a run folder: one process at a time (an exclusive lock held while a pipeline writes
it), and in a multi-process job rank 0 alone (the other ranks work in private copies).

flock() belongs to the open file, so the operating system drops it when the process ends in any
way, SIGKILL included: a killed run never leaves a stale lock for its resume to trip over."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Iterator

from .errors import EffvisionError

LOCK_NAME = ".lock"


class RunFolderBusy(EffvisionError):
    """Another process is writing the run folder."""


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold run_dir's lock, or refuse at once (naming the holder) when another process has it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise RunFolderBusy(
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


@contextlib.contextmanager
def private_run_dir(run_dir: Path) -> Iterator[Path]:
    """Rank 0 works in run_dir; every other rank works in a private copy taken before rank 0
    writes anything (so all ranks resume the same stages) and thrown away afterwards."""
    import torch.distributed as dist  # only a multi-process (torchrun) job has a process group

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        yield run_dir
        return
    if dist.get_rank() == 0:
        dist.barrier()
        yield run_dir
        return
    shadow = Path(tempfile.mkdtemp(prefix=f"effvision-rank{dist.get_rank()}-"))
    try:
        if run_dir.is_dir():
            shutil.copytree(run_dir, shadow, dirs_exist_ok=True)
        dist.barrier()
        yield shadow
    finally:
        shutil.rmtree(shadow, ignore_errors=True)
