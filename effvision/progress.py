"""Progress bars (rich) for long work; silent when EFFVISION_QUIET is set (tests, scripts)."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Iterable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

console = Console(stderr=True)


def quiet() -> bool:
    """EFFVISION_QUIET set, or a process of a multi-process job other than rank 0 (torchrun sets RANK)."""
    return bool(os.environ.get("EFFVISION_QUIET")) or os.environ.get("RANK", "0") != "0"


def log(msg: str) -> None:
    if not quiet():
        console.print(msg, highlight=False)


@contextmanager
def progress_bar() -> Iterator[Progress | None]:
    if quiet() or not sys.stderr.isatty():
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as bar:
        yield bar


def track(items: Iterable, description: str = "", total: int | None = None) -> Iterator:
    """Iterate with a transient bar on a terminal; plain iteration elsewhere."""
    with progress_bar() as bar:
        if bar is None:
            yield from items
            return
        task = bar.add_task(
            description,
            total=total if total is not None else (len(items) if hasattr(items, "__len__") else None),
            info="",
        )
        for item in items:
            yield item
            bar.advance(task)
