"""ONNX files: the export (single file, dynamic batch), its fp16 conversion, export-failure messages,
reading a file (its shape and precision) and ONNX Runtime sessions."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path

import numpy as np
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


def ort_session(
    path: str | Path, threads: int | None = None, providers: list[str] | None = None, spinning: bool = True
):
    """spinning=False: the session's threads sleep between runs instead of spinning. Sessions
    timed side by side in one process need it: another session's spinning threads take cores
    from the one being timed (three sessions of one file, interleaved, measured 26-36 ms with
    spinning and 18-21 ms without on a 2-core CPU)."""
    import onnxruntime as ort

    if not Path(path).is_file():
        raise EffvisionError(f"ONNX file not found: {path}")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), opts, providers=providers or ["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001
        raise EffvisionError(f"cannot load {path} in ONNX Runtime: {str(exc).splitlines()[0]}") from None


def run_session(session, x: torch.Tensor | np.ndarray) -> np.ndarray:
    arr = x.numpy() if isinstance(x, torch.Tensor) else x
    name = session.get_inputs()[0].name
    return np.asarray(session.run(None, {name: np.ascontiguousarray(arr)})[0], dtype=np.float32)


def onnx_predictor(path: str | Path):
    session = ort_session(path)
    return lambda x: run_session(session, x)


def load_onnx(path: str | Path, external: bool = True):
    """The ModelProto of a file a user gave; a file that is missing or not ONNX is one line."""
    import onnx

    if not Path(path).is_file():
        raise EffvisionError(f"ONNX file not found: {path}")
    try:
        return onnx.load(str(path), load_external_data=external)
    except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError and friends: the file is not ONNX)
        why = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise EffvisionError(f"cannot read {path} as ONNX: {why}") from None


def onnx_input_shape(path: str | Path) -> list[int]:
    """The per-sample input shape of an ONNX model (batch dimension dropped)."""
    graph = load_onnx(path, external=False).graph
    if not graph.input:
        raise EffvisionError(f"{path} has no inputs")
    inp = graph.input[0]
    return [d.dim_value for d in inp.type.tensor_type.shape.dim][1:]


def onnx_precision(path: str | Path) -> str:
    """int8 when the graph holds QDQ pairs, fp16 when its weights are half, else fp32."""
    import onnx

    graph = load_onnx(path).graph
    if any(n.op_type in ("QuantizeLinear", "DequantizeLinear", "QLinearConv", "MatMulInteger") for n in graph.node):
        return "int8"
    if any(t.data_type == onnx.TensorProto.FLOAT16 for t in graph.initializer):
        return "fp16"
    return "fp32"
