"""LiteRT (TFLite) files: converted by litert-torch from the model's torch.export program (fp32, or
the LiteRT tools' static int8), run by ai-edge-litert's interpreter (XNNPACK on x86 and Arm).
effvision's metadata lives inside the file, in the flatbuffer's metadata table.

Two installs, because their pins cannot share one environment: the interpreter is the [litert]
extra (`pip install 'effvision[litert]'`: numpy and flatbuffers only); the converter, litert-torch,
pulls xdsl, which pins typing-extensions < 4.13 where effvision's pydantic needs a newer one, so it
runs as a child process in an environment of its own (`make litert-converter`, or
EFFVISION_LITERT_PYTHON naming a Python that has litert-torch). Without either, a command that
needs it says so in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn

from ..errors import EffvisionError
from ..fileio import atomic_write
from ..native_stderr import native_stderr_silenced
from ..registry import RUNTIMES
from .base import Runtime, Session, Target, as_batches

EXTRA = "pip install 'effvision[litert]'"
CONVERTER = "litert-torch==0.10.0"
PYTHON_VARIABLE = "EFFVISION_LITERT_PYTHON"
CONVERT_SCRIPT = Path(__file__).with_name("litert_convert.py")
IDENTIFIER = b"TFL3"  # a .tflite flatbuffer's file identifier, bytes 4-8


def converter_python() -> Path | None:
    """The Python that runs litert-torch: EFFVISION_LITERT_PYTHON, else the project's .venv-litert
    beside the environment effvision runs in (what `make litert-converter` creates)."""
    named = os.environ.get(PYTHON_VARIABLE)
    candidate = Path(named) if named else Path(sys.prefix).parent / ".venv-litert" / "bin" / "python"
    return candidate if candidate.is_file() else None


def litert_missing(convert: bool = False) -> str | None:
    """Why LiteRT's interpreter (and, to convert, its converter) cannot be used here, or None."""
    try:
        import ai_edge_litert.interpreter  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or a broken native library)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return f"LiteRT is not installed ({first}): {EXTRA}"
    if convert and converter_python() is None:
        named = os.environ.get(PYTHON_VARIABLE)
        where = f"{PYTHON_VARIABLE}={named} is not a file" if named else "no .venv-litert beside this environment"
        return (
            f"the LiteRT converter is not set up ({where}): it runs in an environment of its own because "
            f"{CONVERTER}'s pins clash with effvision's; run `make litert-converter` or set {PYTHON_VARIABLE} "
            "to a Python that has it"
        )
    return None


def _require(convert: bool = False) -> None:
    reason = litert_missing(convert)
    if reason:
        raise EffvisionError(reason)


def _samples(shape: list[int], calibration: Iterable[torch.Tensor], precision: str) -> np.ndarray:
    """The inputs the converter traces with (the first) and calibrates int8 on (all)."""
    batches = [x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x) for x in calibration]
    if precision == "int8" and not batches:
        raise EffvisionError("LiteRT int8 needs calibration samples")
    if not batches:
        return np.zeros((1, *shape), np.float32)
    return np.ascontiguousarray(np.concatenate(batches), np.float32)


def _program(model: nn.Module, example: np.ndarray, where: Path) -> None:
    """The model's torch.export program, saved for the converter; a refusal is one line."""
    try:
        program = torch.export.export(model.eval().cpu(), (torch.from_numpy(example),))
    except Exception as exc:  # noqa: BLE001  (an operator or control flow torch.export refuses)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise EffvisionError(f"LiteRT cannot convert the model: torch.export failed: {first}") from None
    torch.export.save(program, where)


def _run_converter(args: list[str], cwd: str, what: str) -> None:
    """litert_convert.py in the converter's environment; its refusal (last stderr line) is one line."""
    done = subprocess.run(
        [str(converter_python()), str(CONVERT_SCRIPT), *args], cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()] or ["no output"]
        raise EffvisionError(f"LiteRT cannot {what}: {lines[-1]}")


def _place(staged: Path, path: Path) -> Path:
    """Copied into a file made with the umask's mode (the quantizer writes its file 0755), whole or not at all."""
    if not staged.is_file():
        raise EffvisionError(f"LiteRT's converter wrote no {path.name}")
    atomic_write(path, lambda tmp: shutil.copyfile(staged, tmp))
    return path


def export_tflite(
    model: nn.Module, path: str | Path, shape: list[int], precision: str = "fp32", calibration=()
) -> Path:
    """The model as a .tflite file (batch 1, resized to other batches when run), converted by
    litert-torch in its own environment; the file appears whole or not at all."""
    _require(convert=True)
    path = Path(path)
    samples = _samples(shape, calibration, precision)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.stem}-") as tmp:
        _program(model, samples[:1], Path(tmp) / "program.pt2")
        np.save(Path(tmp) / "samples.npy", samples)
        _run_converter(["program.pt2", "samples.npy", "model.tflite", precision], tmp, "convert the model")
        return _place(Path(tmp) / "model.tflite", path)


def quantize_tflite(src: str | Path, dst: str | Path, calibration: Iterable[torch.Tensor]) -> Path:
    """An fp32 .tflite file in int8 by the LiteRT tools (as export_tflite's int8), calibrated on
    every sample given."""
    _require(convert=True)
    src, dst = check_tflite(src).resolve(), Path(dst)
    samples = _samples([], calibration, "int8")
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.stem}-") as tmp:
        np.save(Path(tmp) / "samples.npy", samples)
        _run_converter(["quantize", str(src), "samples.npy", "model.tflite"], tmp, f"quantize {src.name}")
        return _place(Path(tmp) / "model.tflite", dst)


def export_many_tflite(items: list[tuple[nn.Module, list[int], Path]]) -> list[Path]:
    """Many small models (module, input shape without the batch, destination) converted in fp32 by
    one converter process."""
    _require(convert=True)
    if not items:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for i, (module, shape, _) in enumerate(items):
            example = np.zeros((1, *shape), np.float32)
            _program(module, example, Path(tmp) / f"{i}.pt2")
            np.save(Path(tmp) / f"{i}.npy", example)
            jobs.append(f"{i}.pt2 {i}.npy {i}.tflite")
        (Path(tmp) / "jobs.txt").write_text("\n".join(jobs) + "\n")
        _run_converter(["many", "jobs.txt"], tmp, "convert a latency table's layers")
        return [_place(Path(tmp) / f"{i}.tflite", Path(dst)) for i, (_, _, dst) in enumerate(items)]


def check_tflite(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise EffvisionError(f"LiteRT file not found: {path}")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[4:8] != IDENTIFIER:
        raise EffvisionError(f"cannot read {path} as a LiteRT model: it is not a .tflite flatbuffer")
    return path


def interpreter(path: str | Path, threads: int | None = None):
    """ai-edge-litert's interpreter for the file, XNNPACK with `threads` (default: this process's cores)."""
    _require()
    from ai_edge_litert.interpreter import Interpreter

    path = check_tflite(path)
    threads = threads or len(os.sched_getaffinity(0))
    try:
        with native_stderr_silenced():  # its "Created TensorFlow Lite XNNPACK delegate" line
            found = Interpreter(model_path=str(path), num_threads=int(threads))
            found.allocate_tensors()
    except Exception as exc:  # noqa: BLE001  (the flatbuffer reader's and the op resolver's errors)
        raise EffvisionError(f"cannot run {path} in LiteRT: {(str(exc).splitlines() or [''])[0]}") from None
    return found


def tflite_predictor(path: str | Path, threads: int | None = None):
    """numpy batch -> numpy logits (the bundle's predict.py runs files the same way)."""
    from .standalone_predict import litert_invoke

    runner = interpreter(path, threads)
    return lambda x: litert_invoke(
        runner, np.ascontiguousarray(x.numpy() if isinstance(x, torch.Tensor) else x, np.float32)
    )


def tflite_input_shape(path: str | Path) -> list[int]:
    """The input shape, batch first as 0: the interpreter resizes the batch to what it is given."""
    return [0, *[int(d) for d in interpreter(path).get_input_details()[0]["shape"][1:]]]


def tflite_precision(path: str | Path) -> str:
    """int8 when any tensor of the file is int8 (the LiteRT tools' quantized files), else fp32."""
    return "int8" if any(t["dtype"] == np.int8 for t in interpreter(path).get_tensor_details()) else "fp32"


def _schema():
    _require()
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def read_tflite_metadata(path: str | Path, key: str) -> str | None:
    """The text stored under `key` in the file's metadata table."""
    fb = _schema()
    data = check_tflite(path).read_bytes()
    model = fb.Model.GetRootAs(data, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name().decode() == key:
            buffer = model.Buffers(entry.Buffer())
            if buffer.Offset() > 1:  # stored after the flatbuffer
                return data[buffer.Offset() : buffer.Offset() + buffer.Size()].decode()
            return buffer.DataAsNumpy().tobytes().decode()
    return None


def _text(name: str | bytes) -> str:
    return name.decode() if isinstance(name, bytes) else name


def write_tflite_metadata(path: str | Path, key: str, text: str) -> None:
    """Store `text` under `key` (replacing what was there), rewriting the file atomically."""
    import flatbuffers

    fb = _schema()
    raw = check_tflite(path).read_bytes()
    model = fb.ModelT.InitFromPackedBuf(raw, 0)
    for buffer in model.buffers:
        if buffer.offset > 1:  # kept after the flatbuffer (ai-edge-quantizer writes so): inline again
            buffer.data = np.frombuffer(raw[buffer.offset : buffer.offset + buffer.size], np.uint8)
            buffer.offset = buffer.size = 0
    model.metadata = model.metadata or []
    entry = next((m for m in model.metadata if _text(m.name) == key), None)
    if entry is None:
        entry = fb.MetadataT()
        entry.name, entry.buffer = key, len(model.buffers)
        model.buffers.append(fb.BufferT())
        model.metadata.append(entry)
    model.buffers[entry.buffer].data = np.frombuffer(text.encode(), np.uint8)
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=IDENTIFIER)
    atomic_write(Path(path), lambda tmp: Path(tmp).write_bytes(bytes(builder.Output())))


@RUNTIMES.register("litert")
class Litert(Runtime):
    kind, suffix, format, describes, label = "tflite", ".tflite", "litert", "a LiteRT file (.tflite)", "LiteRT"
    rank, batch_rule = 3, "resized"
    targets = (Target("litert-cpu", {"cpu": ("fp32", "int8")}),)  # XNNPACK
    precisions = ("fp32", "int8")
    packages = ("ai-edge-litert",)
    int8_tool = "the LiteRT tools (ai-edge-quantizer)"
    bundle_package = "ai-edge-litert"
    keeps_metadata_inside = True  # the flatbuffer's metadata table

    def missing(self, purpose="run", device="cpu"):
        return litert_missing(convert=purpose in ("export", "int8"))

    def export(self, model, path, shape, precision="fp32", calibration=(), batch=1):
        self.check_precision(precision)
        return export_tflite(model, path, shape, precision, as_batches(calibration))

    def quantize(self, src, dst, calibration, keep_float=(), **options):
        return quantize_tflite(src, dst, as_batches(calibration))

    def export_layers(self, layers, folder):
        # one converter process for them all: its start-up (about 10 s) is paid once
        return export_many_tflite([(m, shape, Path(folder) / f"{onnx.stem}.tflite") for m, shape, onnx in layers])

    def open(self, path, device="cpu", threads=None, spinning=True):
        return Session(tflite_predictor(path, threads))

    def input_shape(self, path):
        return tflite_input_shape(path)

    def precision(self, path, said=None):
        return tflite_precision(path)

    def read_metadata(self, path, key):
        return read_tflite_metadata(path, key)

    def write_metadata(self, path, key, text):
        write_tflite_metadata(path, key, text)
        return True
