"""How int8 files are timed against each other and against their fp32 file: interleaved, side by
side in one process (bench.compare), at the batches the decision is made for."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_BACKEND = "onnxruntime-cpu"


@dataclass
class Timing:
    """Interleaved timing (bench.compare) at `batches` on `backend`."""

    shape: list[int]
    batches: list[int]
    warmup: int = 5
    repeats: int = 40
    rounds: int = 8
    backend: str = DEFAULT_BACKEND  # a backend that runs the files' runtime

    def p50s(self, files: dict[str, Path]) -> dict[str, dict[int, float]]:
        """Median milliseconds by name and batch, all files timed side by side in one process."""
        from ..deploy.bench import compare
        from ..runtimes import runtime_of_path

        targets = {name: (path, runtime_of_path(path).precision(path)) for name, path in files.items()}
        rows = compare(targets, self.shape, self.backend, self.batches, "cpu", self.warmup, self.repeats, self.rounds)
        out: dict[str, dict[int, float]] = {name: {} for name in files}
        for r in rows:
            out[r["target"]][r["batch"]] = r["p50"]
        return out


@dataclass
class SpeedCheck:
    """int8 against the fp32 file it replaces, timed side by side at every decision batch."""

    faster: bool
    why: str
    record: dict


def faster_than_fp32(fp32: Path, int8: Path, timing: Timing) -> SpeedCheck:
    """Whether int8 is faster than fp32 at every batch (require_faster)."""
    p50 = timing.p50s({"fp32": fp32, "int8": int8})
    slower = [b for b in timing.batches if p50["int8"][b] >= p50["fp32"][b]]
    record = {"backend": timing.backend, "batches": timing.batches, "p50_ms": p50, "int8_slower_at": slower}
    if slower:
        b = slower[0]
        why = (
            f"fp32: int8 is not faster than fp32 at batch {b} ({p50['int8'][b]:.3f} vs {p50['fp32'][b]:.3f} ms "
            f"p50, {timing.backend}, interleaved)"
        )
        return SpeedCheck(False, why, record)
    ratios = ", ".join(f"{p50['fp32'][b] / p50['int8'][b]:.2f}x at b={b}" for b in timing.batches)
    return SpeedCheck(True, f"faster than fp32: {ratios}", record)
