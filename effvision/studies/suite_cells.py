"""What a benchmark suite needs so that a short lease on a machine never loses its work: the plan
as cells (model x backend x precision x batch) that each end measured, failed, skipped or
unavailable (with the reason); a prediction of each cell's time from the cells already timed;
and the guard (interrupts.py) that turns SIGTERM, SIGINT and the end of the time budget into an
orderly stop."""

from __future__ import annotations

import time

STATUSES = ("pending", "measured", "failed", "skipped", "unavailable")


def describe(cell: dict) -> str:
    mode = cell.get("compile_mode")
    return f"{cell['model']}: {cell['backend']} {cell['precision']}{' ' + mode if mode else ''} batch {cell['batch']}"


def settle(cell: dict, status: str, reason: str) -> dict:
    """A cell that ended without a measurement, with its one-line reason."""
    assert status in STATUSES and status != "measured"
    cell.update(status=status, reason=reason.strip().splitlines()[0][:300] if reason.strip() else status)
    return cell


class Predictor:
    """A cell's expected seconds from those already timed: the slowest finished cell of the same
    backend, precision, compile mode and batch; else of the same backend and compile mode (a
    compile is a compile, whatever the model); else the slowest of all. None before any."""

    def __init__(self):
        self.seen: list[tuple[dict, float]] = []

    def record(self, cell: dict, seconds: float) -> None:
        self.seen.append((cell, seconds))

    def predict(self, cell: dict) -> float | None:
        def same(*keys):
            return [s for c, s in self.seen if all(c.get(k) == cell.get(k) for k in keys)]

        for group in (
            same("backend", "precision", "compile_mode", "batch"),
            same("backend", "compile_mode"),
            [s for _, s in self.seen],
        ):
            if group:
                return max(group)
        return None


class Clock:
    """Seconds since the run began, and what is left of its budget."""

    def __init__(self, budget_s: float | None):
        self.start, self.budget_s = time.perf_counter(), budget_s

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float | None:
        return None if self.budget_s is None else self.budget_s - self.elapsed()

    def would_overrun(self, predicted: float | None) -> str | None:
        """Why a cell predicted to take `predicted` seconds must be skipped, or None."""
        left = self.left()
        if left is None:
            return None
        if left <= 0:
            return f"time budget {self.budget_s:.0f} s spent"
        if predicted is not None and predicted > left:
            return (
                f"predicted {predicted:.0f} s (from cells already timed) > {left:.0f} s left of {self.budget_s:.0f} s"
            )
        return None
