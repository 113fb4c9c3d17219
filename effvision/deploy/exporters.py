"""Export formats (the EXPORTERS registry) and the one verified-export entry point.

Every export is checked against the PyTorch model on real validation samples (max and mean
absolute logit difference, top-1 agreement); the figures are written beside the artifact as
`<artifact>.parity.json`."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch import nn

from ..errors import EffvisionError
from ..fileio import write_json
from ..registry import EXPORTERS


class Exporter:
    suffix = ""
    precisions: tuple[str, ...] = ()

    def missing(self, precision: str) -> str | None:
        """Why this format cannot be written here (an optional extra not installed), or None."""
        return None

    def export(
        self, model: nn.Module, path: Path, shape: list[int], precision: str, calibration, batch: int = 1
    ) -> Path:
        """Write the artifact; `batch` matters only to formats with a fixed batch size."""
        raise NotImplementedError

    def predictor(self, path: Path) -> Callable:
        raise NotImplementedError

    def quantize_file(self, src: Path, dst: Path, calibration) -> Path:
        """int8 by this format's own tool from an fp32 file of it (`calibration`: (x, y) batches):
        how a target on this runtime ships a pruned candidate in int8."""
        raise EffvisionError(f"{self.suffix} files are not quantized from an fp32 file by effvision")

    accuracy_control = False  # quantize_within: its own tool puts ops back in float until a floor holds

    def quantize_within(self, src: Path, dst: Path, calibration, validation, max_drop: float) -> Path:
        """int8 by this format's tool with its accuracy control: at most `max_drop` (absolute top-1)
        below `src` on `validation` ((x, y) batches)."""
        raise NotImplementedError

    def export_layers(self, layers: list[tuple[nn.Module, list[int], Path]], folder: Path) -> list[Path]:
        """fp32 files of single layers for a latency table: each item is the layer as a module, its
        input shape (without the batch) and its ONNX file, already written. One export each here."""
        return [
            self.export(module, Path(folder) / f"{onnx.stem}{self.suffix}", shape, "fp32", None)
            for module, shape, onnx in layers
        ]


@EXPORTERS.register("onnx")
class OnnxExporter(Exporter):
    """ONNX, one file, dynamic batch: fp32; fp16 (fp32 I/O); int8 QDQ U8S8 per-channel (static)."""

    suffix = ".onnx"
    precisions = ("fp32", "fp16", "int8")

    def export(self, model, path, shape, precision, calibration, batch=1):
        from ..compression.quantize import quantize_onnx
        from .onnx_export import export_onnx, onnx_to_fp16

        if precision == "fp32":
            return export_onnx(model, path, shape)
        with tempfile.TemporaryDirectory() as tmp:
            fp32 = export_onnx(model, Path(tmp) / "fp32.onnx", shape)
            if precision == "fp16":
                return onnx_to_fp16(fp32, path)
            return quantize_onnx(fp32, path, calibration)

    def predictor(self, path):
        from .runtime import onnx_predictor

        return onnx_predictor(path)

    def quantize_file(self, src, dst, calibration):
        from ..compression.quantize import quantize_onnx

        return quantize_onnx(src, dst, calibration)

    def export_layers(self, layers, folder):
        return [onnx for _, _, onnx in layers]


@EXPORTERS.register("executorch")
class ExecutorchExporter(Exporter):
    """ExecuTorch .pte lowered to XNNPACK: fp32, or int8 (PT2E, symmetric per-channel)."""

    suffix = ".pte"
    precisions = ("fp32", "int8")

    def missing(self, precision):
        from .executorch_export import executorch_missing

        return executorch_missing()

    def export(self, model, path, shape, precision, calibration, batch=1):
        from .executorch_export import export_pte

        return export_pte(model, path, shape, precision, (x for x, _ in calibration or ()), batch=batch)

    def predictor(self, path):
        from .executorch_export import pte_predictor

        return pte_predictor(path)


@EXPORTERS.register("openvino")
class OpenvinoExporter(Exporter):
    """OpenVINO IR (.xml + .bin), dynamic batch, from the ONNX export: fp32, or int8 (NNCF)."""

    suffix = ".xml"
    precisions = ("fp32", "int8")

    def missing(self, precision):
        from .openvino_export import openvino_missing

        return openvino_missing(int8=precision == "int8")

    def export(self, model, path, shape, precision, calibration, batch=1):
        from .openvino_export import export_ir

        return export_ir(model, path, shape, precision, (x for x, _ in calibration or ()), batch=batch)

    def predictor(self, path):
        from .openvino_export import ir_predictor

        return ir_predictor(path)

    def quantize_file(self, src, dst, calibration):
        from .openvino_export import quantize_ir

        return quantize_ir(src, dst, (x for x, _ in calibration or ()))

    accuracy_control = True  # NNCF's quantize_with_accuracy_control

    def quantize_within(self, src, dst, calibration, validation, max_drop):
        from .openvino_export import quantize_ir_within

        return quantize_ir_within(src, dst, (x for x, _ in calibration), validation, max_drop)

    def export_layers(self, layers, folder):
        from .openvino_export import ir_from_onnx

        # from each layer's ONNX file: milliseconds, where a torch export takes a second or two
        return [ir_from_onnx(onnx, Path(folder) / f"{onnx.stem}.xml") for _, _, onnx in layers]


@EXPORTERS.register("litert")
class LitertExporter(Exporter):
    """LiteRT .tflite by litert-torch (its own environment): fp32, or int8 (ai-edge-quantizer, static)."""

    suffix = ".tflite"
    precisions = ("fp32", "int8")

    def missing(self, precision):
        from .litert_export import litert_missing

        return litert_missing(convert=True)

    def export(self, model, path, shape, precision, calibration, batch=1):
        from .litert_export import export_tflite

        return export_tflite(model, path, shape, precision, (x for x, _ in calibration or ()))

    def predictor(self, path):
        from .litert_export import tflite_predictor

        return tflite_predictor(path)

    def quantize_file(self, src, dst, calibration):
        from .litert_export import quantize_tflite

        return quantize_tflite(src, dst, (x for x, _ in calibration or ()))

    def export_layers(self, layers, folder):
        from .litert_export import export_many_tflite

        # one converter process for them all: its start-up (about 10 s) is paid once
        items = [(module, shape, Path(folder) / f"{onnx.stem}.tflite") for module, shape, onnx in layers]
        return export_many_tflite(items)


def supported_exports() -> str:
    return "; ".join(f"{name}: {', '.join(EXPORTERS.get(name).precisions)}" for name in EXPORTERS.names())


def get_exporter(fmt: str, precision: str) -> Exporter:
    exporter = EXPORTERS.get(fmt)()
    if precision not in exporter.precisions:
        raise EffvisionError(f"format '{fmt}' has no precision '{precision}' (supported: {supported_exports()})")
    reason = exporter.missing(precision)
    if reason:
        raise EffvisionError(reason)
    return exporter


# fp32 export against PyTorch: max |diff| as a share of the largest |logit|. Rounding alone stays
# near 1e-7..1e-5 of it (docs/compat.md); a wrong translation shows at 1e-2 and more.
FP32_RELATIVE_TOLERANCE = 1e-4


def parity(model: nn.Module, predict: Callable, loader: Iterable, max_batches: int = 4) -> dict:
    """Logit differences and top-1 agreement of an exported artifact against PyTorch, and the
    differences relative to the logits' scale (the largest |logit| of the reference)."""
    model = model.eval().cpu()
    max_diff, sum_diff, n_values, agree, total, scale = 0.0, 0.0, 0, 0, 0, 0.0
    with torch.inference_mode():
        for i, (x, _) in enumerate(loader):
            if i >= max_batches:
                break
            ref = model(x).float().numpy()
            out = np.asarray(predict(x.numpy()), dtype=np.float32)
            if out.shape != ref.shape:
                raise EffvisionError(f"parity check: the export gives {out.shape}, PyTorch {ref.shape}")
            diff = np.abs(ref - out)
            max_diff, sum_diff, n_values = (
                max(max_diff, float(diff.max())),
                sum_diff + float(diff.sum()),
                n_values + diff.size,
            )
            scale = max(scale, float(np.abs(ref).max()))
            agree += int((ref.argmax(1) == out.argmax(1)).sum())
            total += len(x)
    if not total:
        raise EffvisionError("parity check: the validation loader gave no samples")
    return {
        "max_abs_diff": max_diff,
        "mean_abs_diff": sum_diff / n_values,
        "logit_scale": scale,
        "relative_diff": max_diff / scale if scale > 0 else (0.0 if max_diff == 0 else float("inf")),
        "top1_agreement": agree / total,
        "samples": total,
    }


def parity_failure(
    check: dict, precision: str, relative_tolerance: float = FP32_RELATIVE_TOLERANCE, min_agreement: float = 0.9
) -> str | None:
    """Why an export is not the model it came from, or None when it is: an fp32 file whose
    largest difference exceeds `relative_tolerance` of the logits' scale, or any file whose top-1
    agrees with PyTorch on fewer than `min_agreement` of the samples (fp16 and int8 change logits
    by design; their agreement is what is judged). The export stage and the compatibility sweep
    both judge with this."""
    if precision == "fp32" and not check["relative_diff"] <= relative_tolerance:
        return (
            f"max |export - torch| = {check['max_abs_diff']:.2e} on logits up to {check['logit_scale']:.2e} "
            f"(relative {check['relative_diff']:.1e} > {relative_tolerance:g})"
        )
    if check["top1_agreement"] < min_agreement:
        return (
            f"top-1 agrees with PyTorch on {check['top1_agreement']:.1%} of {check['samples']} samples "
            f"< {min_agreement:.0%}"
        )
    return None


def parity_path(artifact: str | Path) -> Path:
    return Path(str(artifact) + ".parity.json")


def export_verified(
    model: nn.Module,
    fmt: str,
    precision: str,
    path: str | Path,
    shape: list[int],
    calibration,
    val_loader,
    max_batches: int = 4,
    data: str | None = None,
    batch: int = 1,
) -> tuple[Path, dict]:
    """Export `model` as `fmt`/`precision` to `path`, check it against PyTorch on `val_loader`
    and save the figures beside it. `calibration` is a loader of (x, y) for int8."""
    exporter = get_exporter(fmt, precision)
    path = exporter.export(model, Path(path), list(shape), precision, calibration, batch=batch)
    check = parity(model, exporter.predictor(path), val_loader, max_batches)
    figures = {
        "artifact": Path(path).name,
        "format": fmt,
        "precision": precision,
        "size_bytes": Path(path).stat().st_size,
        "input_shape": list(shape),
        "data": data,
        **check,
    }
    write_json(parity_path(path), figures)
    return Path(path), figures


def export_for_backend(
    model: nn.Module,
    takes: str,
    precision: str,
    work: Path,
    shape: list[int],
    calibration=None,
    val_loader=None,
    batch: int = 1,
    parity_batches: int = 10_000,
    data: str = "real images",
) -> tuple[Path, dict | None]:
    """The file a file-running backend (`takes`: its suffix) benchmarks, exported once per
    (format, precision[, batch]) into `work`; verified on up to `parity_batches` batches when a
    validation loader is given. Without calibration data int8 is calibrated on random inputs:
    fine for speed, not for accuracy."""
    fmt = next(name for name in EXPORTERS.names() if EXPORTERS.get(name).suffix == takes)
    exporter = get_exporter(fmt, precision)
    path = Path(work) / (f"model.{precision}" + (f".b{batch}" if fmt == "executorch" else "") + exporter.suffix)
    if path.exists():
        return path, None
    calibration = calibration if calibration is not None else [(torch.randn(8, *shape), None) for _ in range(4)]
    if val_loader is not None:
        return export_verified(
            model,
            fmt,
            precision,
            path,
            shape,
            calibration,
            val_loader,
            max_batches=parity_batches,
            data=data,
            batch=batch,
        )
    return exporter.export(model, path, list(shape), precision, calibration, batch=batch), None
