"""What every runtime is: one object per runtime (ONNX Runtime, OpenVINO, LiteRT, ExecuTorch, torch)
that says what file it runs, what must be installed for each purpose, where it runs (devices,
precisions, the benchmark backend's name), how a model is exported to it, how its own tool makes
int8 (and whether it can keep named nodes in float), how a file is opened (threads, device,
spinning: one way), which batch sizes one file runs, and where its metadata lives.

This module and its siblings import nothing from compression/ or deploy/: those build on it."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Literal

import numpy as np

from ..errors import EffvisionError
from ..registry import RUNTIMES, UnknownNameError, suggest

Purpose = Literal["run", "export", "int8"]
# How one file takes batches: "dynamic" any size; "fixed" the one it was exported for (a file per
# batch size); "resized" converted at batch 1 and resized to what it is given when run.
BatchRule = Literal["dynamic", "fixed", "resized"]


class RuntimeUnavailable(EffvisionError):
    """The runtime cannot run here (a package or an execution provider absent or inactive)."""


@dataclass(frozen=True)
class Target:
    """Where a runtime runs its files: a benchmark backend's name and, per device type, the
    precisions it runs there."""

    backend: str
    supports: dict[str, tuple[str, ...]]


class Session:
    """An opened file: `run(x)` takes a float32 numpy batch and gives float32 numpy logits."""

    def __init__(self, run: Callable[[np.ndarray], np.ndarray], notes: dict | None = None):
        self.run, self.notes = run, notes or {}

    def __call__(self, x) -> np.ndarray:
        return self.run(x.numpy() if hasattr(x, "numpy") else x)


class Runtime:
    name = ""  # its RUNTIMES name, which metadata and records call it by
    kind = ""  # the key of its files in a stage's artifacts (and in report.json's)
    suffix: str | None = None  # None: a torch model, not a file
    format: str | None = None  # the export format's name (effvision export --format)
    describes = ""  # "an ONNX file", for messages
    label = ""  # "ONNX", as in "fp32 ONNX"
    rank = 0  # which file of one stage ships when it has several: the lowest rank
    batch_rule: BatchRule = "dynamic"
    targets: ClassVar[tuple[Target, ...]] = ()  # where it runs, the default first
    precisions: tuple[str, ...] = ("fp32",)  # what its export writes
    packages: tuple[str, ...] = ()  # the distributions it runs on (their versions key its timings)
    int8_tool = ""  # what makes its int8 files, as reports name it
    keeps_float = False  # its int8 can keep named nodes in float (a search over them is possible)
    accuracy_control = False  # its int8 tool can put ops back in float until a floor holds
    bundle_package: str | None = None  # the one package a bundle's predict.py runs its files with
    keeps_metadata_inside = False  # else effvision's metadata is a JSON file beside it

    # -- identity and availability ------------------------------------------------------
    @property
    def takes(self) -> str:
        """What its backends take: the file suffix, or "model"."""
        return self.suffix or "model"

    @property
    def default_backend(self) -> str:
        return self.targets[0].backend

    def backends(self) -> list[str]:
        """Every benchmark backend that runs this runtime's files, the default first."""
        return [t.backend for t in self.targets]

    def missing(self, purpose: Purpose = "run", device: str = "cpu") -> str | None:
        """Why this runtime cannot serve `purpose` here (run its files on `device`, export to it,
        make its int8 files), or None when it can."""
        return None

    def require(self, purpose: Purpose = "run", device: str = "cpu") -> None:
        reason = self.missing(purpose, device)
        if reason:
            raise RuntimeUnavailable(reason)

    def check_backend(self, name: str | None) -> str:
        """`name` (None: the default) when it runs this runtime's files; else one line naming those that do."""
        if name is None:
            return self.default_backend
        if name not in self.backends():
            known = [t.backend for n in RUNTIMES.names() for t in RUNTIMES.get(n).targets]
            if name not in known:  # an unknown name is said as unknown first, with the names it is near
                raise UnknownNameError(suggest(name, known, "backend"))
            raise EffvisionError(f"--backend {name} does not run {self.describes} (use {', '.join(self.backends())})")
        return name

    def backend_for(self, device_type: str) -> str:
        """The backend a file is timed and scored on for a device: the first that runs there and is
        installed here, else the default."""
        for target in self.targets:
            if device_type in target.supports and not self.missing("run", device_type):
                return target.backend
        return self.default_backend

    # -- batches ----------------------------------------------------------------------------
    def batch_groups(self, batches: Iterable[int]) -> list[tuple[int, ...]]:
        """The batch sizes one file runs, grouped: all of them, or one per file where the batch is fixed."""
        batches = tuple(batches)
        return [(b,) for b in batches] if self.batch_rule == "fixed" else [batches]

    def file_batches(self, path, asked: Iterable[int]) -> list[int]:
        """Of the batches asked, those one file runs: all of them, or the one it was exported for."""
        return self.input_shape(path)[:1] if self.batch_rule == "fixed" else list(asked)

    def batch_label(self, batch: int) -> str:
        """What tells one file from another of the same precision: its batch, where that is fixed."""
        return f" b{batch}" if self.batch_rule == "fixed" else ""

    def file_name(self, precision: str, batch: int | None = None) -> str:
        """A work folder's name for its file in `precision` (and batch, where the batch is fixed)."""
        fixed = f".b{batch or 1}" if self.batch_rule == "fixed" else ""
        return f"model.{precision}{fixed}{self.suffix}"

    # -- making files ------------------------------------------------------------------------
    def check_precision(self, precision: str) -> None:
        if precision not in self.precisions:
            writers = (RUNTIMES.get(n) for n in RUNTIMES.names())
            supported = "; ".join(f"{r.format}: {', '.join(r.precisions)}" for r in writers if r.format)
            raise EffvisionError(f"format '{self.format}' has no precision '{precision}' (supported: {supported})")

    def export(self, model, path: Path, shape: list[int], precision: str = "fp32", calibration=(), batch: int = 1):
        """Write the model as this runtime's file (`calibration`: (x, y) batches, for int8; `batch`:
        where the batch is fixed)."""
        raise EffvisionError(f"{self.describes} is not written by effvision")

    def quantize(self, src: Path, dst: Path, calibration, keep_float: Iterable[str] = (), **options) -> Path:
        """int8 by this runtime's own tool from an fp32 file of it (`calibration`: (x, y) batches);
        `keep_float`: node names left in float, where the tool can (keeps_float)."""
        raise EffvisionError(f"{self.describes} cannot be quantized by effvision ({self.int8_tool or 'no int8 tool'})")

    def int8_variants(self, src: Path, calibration, work: Path, **options):
        """For a runtime that keeps_float: the fp32 file prepared for int8 once, whose
        `write(dst, float_nodes)` gives each variant with those nodes in float (and `nodes`,
        `layers`, `quantized_nodes`, `input_name` to choose them from)."""
        raise EffvisionError(f"{self.int8_tool or self.describes} cannot keep chosen nodes in float")

    def quantize_within(self, src: Path, dst: Path, calibration, validation, max_drop: float) -> Path:
        """int8 by the tool's accuracy control: at most `max_drop` (absolute top-1) below `src` on
        `validation` ((x, y) batches), where the tool has one (accuracy_control)."""
        raise EffvisionError(f"{self.int8_tool or self.describes} has no accuracy control")

    def export_layers(self, layers: list, folder: Path) -> list[Path]:
        """fp32 files of single layers for a latency table: each item is (module, input shape
        without the batch, its ONNX file, already written). One export each here."""
        return [self.export(m, Path(folder) / f"{onnx.stem}{self.suffix}", shape) for m, shape, onnx in layers]

    # -- reading files -----------------------------------------------------------------------
    def open(self, path, device: str = "cpu", threads: int | None = None, spinning: bool = True) -> Session:
        """The file ready to run: threads (None: the runtime's default), the device, and whether idle
        threads spin (sessions timed side by side in one process must not)."""
        raise NotImplementedError

    def input_shape(self, path) -> list[int]:
        """The file's input shape, its batch dimension first (0 where the batch is dynamic or resized)."""
        raise NotImplementedError

    def precision(self, path, said: str | None = None) -> str:
        """The file's precision, read off the file where it says; `said` (its exporter's word) where not."""
        return said or "fp32"

    def files(self, path) -> list[Path]:
        """The file and those it needs beside it (an IR's weights), as shipped."""
        return [Path(path)]

    def copy(self, src, dst) -> Path:
        """The file and those it needs beside it, copied under dst's name."""
        for a, b in zip(self.files(src), self.files(dst), strict=True):
            shutil.copyfile(a, b)
        return Path(dst)

    def file_bytes(self, path) -> int:
        """What the file weighs as shipped (with the files it needs beside it)."""
        return sum(f.stat().st_size for f in self.files(path))

    def read_metadata(self, path, key: str) -> str | None:
        """The text stored under `key` inside the file (a runtime that keeps metadata inside)."""
        return None

    def write_metadata(self, path, key: str, text: str) -> bool:
        """Store `text` under `key` inside the file; False: this runtime's files cannot hold it."""
        return False


def import_missing(modules: list[tuple[str, str]], install: str) -> str | None:
    """The first of (module, what) that does not import here, said with what to install."""
    for module, what in modules:
        try:
            __import__(module)
        except Exception as exc:  # noqa: BLE001  (ImportError, or a broken native library)
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            return f"{what} is not installed ({first}): {install}"
    return None


def as_batches(calibration) -> list[np.ndarray]:
    """Calibration given as (x, y) batches or bare x batches, as float32 numpy arrays."""
    out = []
    for item in calibration or ():
        x = item[0] if isinstance(item, (tuple, list)) else item
        out.append(np.ascontiguousarray(x.numpy() if hasattr(x, "numpy") else x, np.float32))
    return out
