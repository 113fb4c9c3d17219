"""ONNX export (single file, dynamic batch), its fp16 conversion and export-failure messages."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import EffvisionError
from ..fileio import atomic_write
from ..models.profile import input_shape


def refuse_unexportable(model: nn.Module, fmt: str) -> None:
    """A model that knows it cannot export (an `export_blocker` property saying which operator
    and why, e.g. sampling inside the network) is refused before the exporter runs."""
    blocker = getattr(model, "export_blocker", None)
    if blocker:
        raise EffvisionError(f"cannot export {type(model).__name__} to {fmt}: {blocker}")


def export_onnx(model: nn.Module, path: str | Path, shape: list[int] | None = None, opset: int | None = None) -> Path:
    """Export with torch.onnx's dynamo exporter into one file (weights inside), batch dynamic."""
    refuse_unexportable(model, "ONNX")
    model.eval()  # not chained: a captured graph's eval() (torchao) returns None
    model = model.cpu()
    x = torch.zeros(2, *(shape or input_shape(model)))

    def write(tmp: Path) -> None:
        # The exporter prints progress and warnings meant for its own developers; keep ours clean.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                (x,),
                str(tmp),
                dynamo=True,
                external_data=False,
                verbose=False,
                opset_version=opset,
                input_names=["input"],
                output_names=["logits"],
                dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},),
            )

    try:
        atomic_write(path, write)
        return strip_debug_info(path)
    except EffvisionError:
        raise
    except Exception as exc:  # noqa: BLE001  (exporter failures name the unsupported op)
        raise EffvisionError(f"ONNX export failed: {describe_export_failure(exc)}") from exc


_OP_PATTERNS = (
    r"No ONNX function found for <OpOverload\(op='([^']+)'",
    r"target=torch\.ops\.([\w.]+?)(?:\.default)?[,\s)]",
    r"[Uu]nsupported (?:operator|op|node)[^:]*:\s*'?([\w.:]+)",
    r"Operator ([\w.:]+) is not supported",
)


def failing_operator(message: str) -> str | None:
    """The operator an exporter could not translate, read from its error message."""
    for pattern in _OP_PATTERNS:
        m = re.search(pattern, message)
        if m:
            return m.group(1)
    return None


def describe_export_failure(exc: BaseException) -> str:
    """One line: the failing operator when the message names one, else the error's first line."""
    text = str(exc)
    op = failing_operator(text)
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return f"operator '{op}' has no conversion ({type(exc).__name__})" if op else first[:300]


def strip_debug_info(path: str | Path) -> Path:
    """Drop the exporter's per-node stack traces and doc strings: debugging aids that are a tenth
    of a small model's file and mean nothing on the device."""
    import onnx

    model = onnx.load(str(path))
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    return atomic_write(path, lambda tmp: onnx.save(model, str(tmp)))


def onnx_to_fp16(src: str | Path, dst: str | Path) -> Path:
    """fp16 weights and activations with fp32 inputs/outputs (ONNX Runtime's float16 converter),
    so callers feed the same arrays as to the fp32 file."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    return atomic_write(dst, lambda tmp: onnx.save(half, str(tmp)))
