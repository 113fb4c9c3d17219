"""ONNX export (single file, dynamic batch) and its parity check against PyTorch."""
from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import EffvisionError
from ..fileio import atomic_write
from ..models.profile import input_shape
from .runtime import ort_session, run_session


def export_onnx(model: nn.Module, path: str | Path, shape: list[int] | None = None, opset: int | None = None) -> Path:
    """Export with torch.onnx's dynamo exporter into one file (weights inside), batch dynamic."""
    model = model.eval().cpu()
    x = torch.zeros(2, *(shape or input_shape(model)))

    def write(tmp: Path) -> None:
        # The exporter prints progress and warnings meant for its own developers; keep ours clean.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), str(tmp), dynamo=True, external_data=False, verbose=False, opset_version=opset,
                              input_names=["input"], output_names=["logits"],
                              dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))

    try:
        atomic_write(path, write)
        return strip_debug_info(path)
    except EffvisionError:
        raise
    except Exception as exc:  # noqa: BLE001  (exporter failures name the unsupported op)
        raise EffvisionError(f"ONNX export failed: {str(exc).splitlines()[0]}") from exc


def parity(model: nn.Module, onnx_path: str | Path, loader, max_batches: int = 4) -> dict:
    """Max |torch - onnxruntime| on real validation samples, and how often top-1 agrees."""
    model = model.eval().cpu()
    session = ort_session(onnx_path)
    max_diff, agree, total = 0.0, 0, 0
    with torch.inference_mode():
        for i, (x, _) in enumerate(loader):
            if i >= max_batches:
                break
            ref = model(x).float().numpy()
            out = run_session(session, x)
            max_diff = max(max_diff, float(np.abs(ref - out).max()))
            agree += int((ref.argmax(1) == out.argmax(1)).sum())
            total += len(x)
    return {"max_abs_diff": max_diff, "top1_agreement": agree / max(total, 1), "samples": total}


def strip_debug_info(path: str | Path) -> Path:
    """Drop the exporter's per-node stack traces and doc strings: debugging aids that are a tenth
    of a small model's file and mean nothing on the device."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    return atomic_write(path, lambda tmp: onnx.save(model, str(tmp)))
