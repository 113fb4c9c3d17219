"""The one verified-export entry point: a model written as a runtime's file (runtimes/) and checked
against the PyTorch model on real validation samples (max and mean absolute logit difference,
top-1 agreement); the figures are written beside the artifact as `<artifact>.parity.json`."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
from torch import nn

from ..errors import EffvisionError
from ..fileio import write_json
from ..runtimes import Runtime, open_file, runtime_of_format

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
    runtime = writer(fmt, precision)
    path = runtime.export(model, Path(path), list(shape), precision, calibration, batch=batch)
    check = parity(model, open_file(path), val_loader, max_batches)
    figures = {
        "artifact": Path(path).name,
        "format": fmt,
        "precision": precision,
        "size_bytes": runtime.file_bytes(path),
        "input_shape": list(shape),
        "data": data,
        **check,
    }
    write_json(parity_path(path), figures)
    return Path(path), figures


def export_for_runtime(
    model: nn.Module,
    runtime: Runtime,
    precision: str,
    work: Path,
    shape: list[int],
    calibration=None,
    val_loader=None,
    batch: int = 1,
    parity_batches: int = 10_000,
    data: str = "real images",
) -> tuple[Path, dict | None]:
    """The runtime's file of the model in `precision`, exported once per (precision[, batch where the
    runtime's batch is fixed]) into `work`; verified on up to `parity_batches` batches when a
    validation loader is given. Without calibration data int8 is calibrated on random inputs:
    fine for speed, not for accuracy."""
    writer(runtime.format, precision)
    path = Path(work) / runtime.file_name(precision, batch)
    if path.exists():
        return path, None
    calibration = calibration if calibration is not None else [(torch.randn(8, *shape), None) for _ in range(4)]
    if val_loader is not None:
        return export_verified(
            model,
            runtime.format,
            precision,
            path,
            shape,
            calibration,
            val_loader,
            max_batches=parity_batches,
            data=data,
            batch=batch,
        )
    return runtime.export(model, path, list(shape), precision, calibration, batch=batch), None


def writer(fmt: str, precision: str) -> Runtime:
    """The runtime that writes `fmt` in `precision` here; else one line (unknown, no such
    precision, or what to install)."""
    runtime = runtime_of_format(fmt)
    runtime.check_precision(precision)
    runtime.require("int8" if precision == "int8" else "export")
    return runtime
