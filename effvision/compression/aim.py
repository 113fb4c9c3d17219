"""Aiming at a recipe's target: the uncompressed reference and a candidate model exported for the
target backend and timed side by side there, so every speed-up a stage aims with is a measurement
on one backend, batch and machine."""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..errors import EffvisionError
from ..recipe import TargetConfig


def target_device(backend: str, device: torch.device) -> torch.device:
    """The device a backend runs on: the run's, when the backend runs there, else its own."""
    from ..runtimes import target_of

    supports = target_of(backend).supports
    if device.type in supports:
        return device
    return torch.device(next(iter(supports)))


def check_target(target: TargetConfig | None, device: torch.device) -> None:
    """Refuse, before any work, a target on a backend that is unknown or cannot run here."""
    if target is None:
        return
    from ..deploy.backends import check_pair
    from ..runtimes import runtime_of_backend

    try:
        runtime = runtime_of_backend(target.backend)
    except ValueError as exc:
        raise EffvisionError(f"target.backend: {exc}") from None
    check_pair(target.backend, "fp32", target_device(target.backend, device))
    reason = runtime.suffix and runtime.missing("export")
    if reason:  # candidates are exported there (LiteRT's converter lives in an environment of its own)
        raise EffvisionError(f"target.backend {target.backend}: {reason}")


@dataclass
class Aim:
    """Times models against the reference on the target's backend and batch, interleaved."""

    target: TargetConfig
    reference: nn.Module
    shape: list[int]
    device: torch.device
    warmup: int = 5
    repeats: int = 40
    # fp32 file -> the file that ships (the plan's int8): candidates are timed in the precision that
    # ships, against the fp32 reference; None: they ship, and are timed, in fp32
    ship: Callable[[Path], Path] | None = None
    reference_shape: list[int] | None = None  # the reference's input, where a plan lowered the candidates'
    fastest_ms: float | None = None  # a target with no speed asked aims here (the narrowest widths' latency)
    first_reference_ms: float | None = None
    _work: tempfile.TemporaryDirectory = field(default_factory=tempfile.TemporaryDirectory)
    _count: int = 0

    def __post_init__(self):
        self.device = target_device(self.target.backend, self.device)
        self.reference = copy.deepcopy(self.reference).cpu().eval()
        self.reference_shape = list(self.reference_shape or self.shape)
        self._ref = self._artifact(self.reference, "reference", self.reference_shape)

    def _artifact(self, model: nn.Module, name: str, shape: list[int] | None = None):
        from ..runtimes import runtime_of_backend

        runtime = runtime_of_backend(self.target.backend)
        if runtime.suffix is None:
            return model
        work = Path(self._work.name) / name
        work.mkdir(parents=True, exist_ok=True)
        path = runtime.export(
            model, work / runtime.file_name("fp32", self.target.batch), shape or self.shape, batch=self.target.batch
        )
        return path if self.ship is None or name == "reference" else self.ship(path)

    def prepared(self, model: nn.Module):
        """The model as the target backend runs it (its exported file, for a backend that runs
        files): for a model timed again and again, exported once."""
        self._count += 1
        return self._artifact(copy.deepcopy(model).cpu().eval(), f"candidate-{self._count}")

    def timings(self, models: dict) -> dict[str, float]:
        """Median ms of the reference and of each model (a module, or what prepared() gave) at the
        target batch, timed interleaved in one run, keyed by name ("reference" for the reference)."""
        from ..deploy.bench import compare

        targets = {"reference": (self._ref, "fp32", self.reference_shape)}
        precision = "fp32" if self.ship is None else "int8"
        for name, model in models.items():
            targets[name] = (self.prepared(model) if isinstance(model, nn.Module) else model, precision, self.shape)
        rows = compare(
            targets,
            self.shape,
            self.target.backend,
            [self.target.batch],
            self.device,
            self.warmup,
            self.repeats,
            rounds=min(8, self.repeats),
        )
        return {r["target"]: r["p50"] for r in rows}

    def scaled(self, ms: float, reference_ms: float) -> float:
        """`ms` on the scale of the first reference measurement (ms x first reference / this
        reference): a slow spell of a shared machine slows both files of one measurement, so
        their ratio holds across measurements."""
        if self.first_reference_ms is None:
            self.first_reference_ms = reference_ms
        return ms * self.first_reference_ms / reference_ms

    def measure(self, model: nn.Module) -> dict:
        """The model against the reference: both medians, the speed-up and the scaled latency."""
        p50 = self.timings({"candidate": model})
        ref_ms, ms = p50["reference"], p50["candidate"]
        scaled = self.scaled(ms, ref_ms)
        return {"reference_ms": ref_ms, "ms": ms, "scaled_ms": round(scaled, 4), "speedup": round(ref_ms / ms, 3)}

    def goal_ms(self, margin: float = 0.0) -> float:
        """The target on the first reference measurement's scale (an absolute latency_ms as is),
        `margin` faster than asked (goals.py)."""
        return self.target.goal.goal_ms(self.first_reference_ms, self.fastest_ms, margin)

    def met(self, m: dict) -> bool:
        return self.target.goal.met(m["ms"], m["speedup"])

    def close(self) -> None:
        self._work.cleanup()
