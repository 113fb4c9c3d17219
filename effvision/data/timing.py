"""Where a loader's time goes: seconds per part of making a batch (read, decode, sample, augment,
collate), accumulated by the loaders when a benchmark hands them a TimeSplit, so the next
bottleneck is visible. Loaders hold NO_SPLIT otherwise, which costs a no-op context per call."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict

PARTS = ("read", "decode", "sample", "augment", "collate")


class TimeSplit:
    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, part: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - start

    def shares(self) -> dict[str, float]:
        """Each part's fraction of the time accounted for, in PARTS order (parts not timed left out)."""
        total = sum(self.seconds.values()) or 1.0
        return {p: self.seconds[p] / total for p in PARTS if p in self.seconds}


def format_shares(shares: dict[str, float]) -> str:
    """'read 12%, augment 80%, ...' of TimeSplit.shares()."""
    return ", ".join(f"{p} {share:.0%}" for p, share in shares.items()) or "nothing timed"


def timed_pass(loader, split: TimeSplit) -> tuple[float, int]:
    """Seconds and samples of one pass over a training loader whose parts are timed into `split`.
    A batched loader (one with a `split` of its own) times every part itself; under the per-sample
    DataLoader the dataset times what it does, and what the parts leave over is its collation."""
    start, n = time.perf_counter(), 0
    before = sum(split.seconds.values())
    for x, *_ in loader:
        n += len(x)
    seconds = time.perf_counter() - start
    if not hasattr(loader, "split"):
        split.seconds["collate"] += seconds - (sum(split.seconds.values()) - before)
    return seconds, n


class _NoSplit:
    def __call__(self, part: str):
        return contextlib.nullcontext()


NO_SPLIT = _NoSplit()
