"""OpenVINO IR files (`model.xml` and its `model.bin`) converted from the verified ONNX export, int8
by NNCF's post-training quantization (Intel's own quantizer for OpenVINO), and a runner compiled
with OpenVINO's latency hint. effvision's metadata lives in the IR's rt_info.

OpenVINO and NNCF are an optional extra (`pip install 'effvision[openvino]'`); without them a
command that needs them says so in one line."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn

from ..errors import EffvisionError
from ..registry import RUNTIMES
from .base import Runtime, Session, Target, as_batches, import_missing

EXTRA = "pip install 'effvision[openvino]'"
RT_INFO = "effvision"  # the rt_info section that holds effvision's keys


def openvino_missing(int8: bool = False) -> str | None:
    """Why OpenVINO (and, for int8, NNCF) cannot be used here, or None when it can."""
    nncf = [("nncf", "NNCF (OpenVINO's int8 quantizer)")] if int8 else []
    return import_missing([("openvino", "OpenVINO"), *nncf], EXTRA)


def _require(int8: bool = False) -> None:
    reason = openvino_missing(int8)
    if reason:
        raise EffvisionError(reason)


def _core():
    import openvino as ov

    return ov.Core()


def read_ir(path: str | Path):
    """The ov.Model of an IR file; a missing or unreadable file is one line."""
    _require()
    path = Path(path)
    if not path.is_file():
        raise EffvisionError(f"OpenVINO IR not found: {path}")
    with open(path, "rb") as f:  # OpenVINO reads other formats by their content, whatever the name says
        head = f.read(256).lstrip()
    if not (head.startswith(b"<?xml") or head.startswith(b"<net")):
        raise EffvisionError(f"cannot read {path} as an OpenVINO IR: it is not IR XML (an ONNX file is named .onnx)")
    if not path.with_suffix(".bin").is_file():
        raise EffvisionError(f"{path} has no weights file beside it ({path.with_suffix('.bin').name})")
    try:
        return _core().read_model(str(path))
    except Exception as exc:  # noqa: BLE001  (OpenVINO's parse errors)
        raise EffvisionError(f"cannot read {path} as an OpenVINO IR: {str(exc).splitlines()[0]}") from None


def save_ir(model, path: str | Path) -> Path:
    """Write the IR (.xml and .bin) through a temporary folder beside it, so that a failed write
    leaves the old files whole; the weights go first (the .xml names what is read)."""
    import openvino as ov

    path = Path(path)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.stem}-") as tmp:
        staged = Path(tmp) / "model.xml"
        ov.save_model(model, str(staged), compress_to_fp16=False)  # fp16 weights are a precision, not a default
        os.replace(staged.with_suffix(".bin"), path.with_suffix(".bin"))
        os.replace(staged, path)
    return path


def export_ir(
    model: nn.Module,
    path: str | Path,
    shape: list[int],
    precision: str = "fp32",
    calibration: Iterable[torch.Tensor] = (),
    batch: int = 1,
) -> Path:
    """The model as an OpenVINO IR with a dynamic batch: converted from its ONNX export
    (openvino.convert_model), int8 by nncf.quantize on the calibration batches."""
    _require(int8=precision == "int8")
    import openvino as ov

    from .onnx_files import export_onnx

    with tempfile.TemporaryDirectory() as tmp:
        onnx = export_onnx(model, Path(tmp) / "model.onnx", shape)
        try:
            ir = ov.convert_model(str(onnx))
        except Exception as exc:  # noqa: BLE001  (an operator OpenVINO's ONNX frontend lacks)
            raise EffvisionError(f"OpenVINO cannot convert the ONNX export: {str(exc).splitlines()[0]}") from None
    if precision == "int8":
        ir = _quantize(ir, calibration)
    return save_ir(ir, path)


def _quantize(ir, calibration: Iterable[torch.Tensor]):
    """NNCF's post-training quantization (its default preset: symmetric weights and activations,
    per-channel weights, on every sample given)."""
    import nncf

    batches = as_batches(calibration)
    if not batches:
        raise EffvisionError("OpenVINO int8 needs calibration samples")
    return nncf.quantize(ir, nncf.Dataset(batches), subset_size=len(batches))  # (its size counts items: batches)


def quantize_ir(src: str | Path, dst: str | Path, calibration: Iterable[torch.Tensor]) -> Path:
    """An fp32 IR quantized by NNCF (as export_ir's int8), written beside nothing else."""
    _require(int8=True)
    return save_ir(_quantize(read_ir(src), calibration), dst)


def quantize_ir_within(src: str | Path, dst: str | Path, calibration, validation, max_drop: float) -> Path:
    """An fp32 IR in int8 by NNCF's quantization with accuracy control: the ops whose int8 costs the
    most top-1 go back to float until the file loses at most `max_drop` (absolute) against `src` on
    `validation` ((x, y) batches, scored one sample at a time, as NNCF ranks them)."""
    _require(int8=True)
    import nncf

    batches = as_batches(calibration)
    samples = [
        (np.ascontiguousarray(x[i : i + 1].numpy(), np.float32), int(y[i]))
        for x, y in validation
        for i in range(len(y))
    ]

    def top1(compiled, items) -> tuple[float, list[float]]:
        hits = [float(np.argmax(compiled(x)[0]) == label) for x, label in items]
        return sum(hits) / max(len(hits), 1), hits

    nncf.set_log_level(logging.WARNING)  # its per-iteration INFO lines; the stage logs what it decided
    ir = nncf.quantize_with_accuracy_control(
        read_ir(src),
        nncf.Dataset(batches),
        nncf.Dataset(samples, lambda item: item[0]),
        top1,
        max_drop=max_drop,
        subset_size=len(batches),
    )
    return save_ir(ir, dst)


def ir_from_onnx(onnx: str | Path, dst: str | Path) -> Path:
    """An ONNX file converted to an fp32 IR as it is (a latency table's single layer)."""
    _require()
    import openvino as ov

    return save_ir(ov.convert_model(str(onnx)), dst)


def ir_input_shape(path: str | Path) -> list[int]:
    """The IR's input shape, its batch first (0 where the batch is dynamic)."""
    shape = read_ir(path).inputs[0].get_partial_shape()
    return [d.get_length() if d.is_static else 0 for d in shape]


def ir_precision(path: str | Path) -> str:
    """int8 when NNCF put FakeQuantize nodes in the graph, else fp32."""
    return "int8" if any(op.get_type_name() == "FakeQuantize" for op in read_ir(path).get_ops()) else "fp32"


def ir_predictor(path: str | Path, threads: int | None = None):
    """numpy batch -> numpy logits, compiled for the CPU with the latency hint (one request), in
    f32: on a CPU with bf16 (AVX-512 BF16, AMX) OpenVINO otherwise computes an fp32 file in bf16
    (logits 3.6e-3 of their scale off PyTorch here), which is a precision the file does not say."""
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    ir = read_ir(path)
    try:
        compiled = _core().compile_model(ir, "CPU", config)
    except Exception as exc:  # noqa: BLE001
        raise EffvisionError(f"OpenVINO cannot compile {path}: {str(exc).splitlines()[0]}") from None
    request = compiled.create_infer_request()

    def run(x) -> np.ndarray:
        arr = x.numpy() if isinstance(x, torch.Tensor) else x
        request.infer({0: np.ascontiguousarray(arr, np.float32)})
        return np.array(request.get_output_tensor(0).data, dtype=np.float32)

    return run


def read_rt_info(path: str | Path, key: str) -> str | None:
    ir = read_ir(path)
    if not ir.has_rt_info([RT_INFO, key]):
        return None
    return str(ir.get_rt_info([RT_INFO, key]).astype(str))


def write_rt_info(path: str | Path, key: str, text: str) -> None:
    ir = read_ir(path)
    ir.set_rt_info(text, [RT_INFO, key])
    save_ir(ir, path)


@RUNTIMES.register("openvino")
class OpenVino(Runtime):
    kind, suffix, format, describes, label = "openvino", ".xml", "openvino", "an OpenVINO IR (.xml)", "OpenVINO IR"
    rank = 2
    targets = (Target("openvino-cpu", {"cpu": ("fp32", "int8")}),)  # compiled with the latency hint
    precisions = ("fp32", "int8")
    packages = ("openvino",)
    int8_tool = "NNCF"
    accuracy_control = True  # NNCF's quantize_with_accuracy_control
    bundle_package = "openvino"
    keeps_metadata_inside = True  # the IR's rt_info

    def missing(self, purpose="run", device="cpu"):
        return openvino_missing(int8=purpose == "int8")

    def export(self, model, path, shape, precision="fp32", calibration=(), batch=1):
        self.check_precision(precision)
        return export_ir(model, path, shape, precision, as_batches(calibration), batch=batch)

    def quantize(self, src, dst, calibration, keep_float=(), **options):
        return quantize_ir(src, dst, as_batches(calibration))

    def quantize_within(self, src, dst, calibration, validation, max_drop):
        return quantize_ir_within(src, dst, calibration, validation, max_drop)

    def export_layers(self, layers, folder):
        # from each layer's ONNX file: milliseconds, where a torch export takes a second or two
        return [ir_from_onnx(onnx, Path(folder) / f"{onnx.stem}.xml") for _, _, onnx in layers]

    def open(self, path, device="cpu", threads=None, spinning=True):
        return Session(ir_predictor(path, threads))

    def input_shape(self, path):
        return ir_input_shape(path)

    def precision(self, path, said=None):
        return ir_precision(path)

    def files(self, path):
        return [Path(path), Path(path).with_suffix(".bin")]

    def read_metadata(self, path, key):
        return read_rt_info(path, key)

    def write_metadata(self, path, key, text):
        write_rt_info(path, key, text)
        return True
