"""Device selection, timing and peak-memory probes shared by training and the benchmark harness.

Timing uses CUDA events on a GPU (they measure the device's work, not the host's launch) and
perf_counter on the CPU; peak memory is CUDA's max allocated on a GPU and the process's peak RSS
(VmHWM, reset per measurement where Linux allows it) on the CPU."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Callable

import torch

from .errors import EffvisionError


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if cuda_available() else "cpu")
    if name.startswith("cuda") and not cuda_available():
        raise EffvisionError(f"device '{name}' requested but no CUDA GPU is available (use auto or cpu)")
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise EffvisionError(f"unknown device '{name}' (choices: auto, cpu, cuda, cuda:N)")
    return torch.device(name)


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Milliseconds one call takes on `device`: CUDA events on a GPU, perf_counter otherwise."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.kind = "cuda-event" if self.device.type == "cuda" else "perf_counter"

    def time(self, fn: Callable[[], object]) -> float:
        if self.kind == "cuda-event":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3


_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _peak_rss_kib() -> int:
    """The process's peak resident set so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def resident_bytes() -> int:
    """The process's resident set now (VmRSS); without /proc, its peak so far, which never
    falls but still shows growth."""
    kib = _status_kib("VmRSS")
    return (kib if kib is not None else _peak_rss_kib()) * 1024


class PeakMemory:
    """Peak memory over a block: CUDA max allocated, or the process's peak resident set.

    On Linux writing 5 to /proc/self/clear_refs resets VmHWM, so the CPU figure is the peak of
    this block alone (`scope: block`); elsewhere it is the process's peak so far (`scope: process`)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.scope = "block"

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return self
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            self.scope = "process"
        return self

    def __exit__(self, *exc) -> None:
        self._result = self._read()

    def result(self) -> dict:
        """The peak of the block (read when it ended)."""
        return self._result

    def _read(self) -> dict:
        if self.device.type == "cuda":
            return {
                "kind": "cuda_max_allocated",
                "bytes": int(torch.cuda.max_memory_allocated(self.device)),
                "scope": "block",
            }
        kib = _status_kib("VmHWM") if self.scope == "block" else None
        if kib is None:
            kib, self.scope = _peak_rss_kib(), "process"
        return {"kind": "peak_rss", "bytes": int(kib) * 1024, "scope": self.scope}
