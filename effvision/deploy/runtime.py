"""ONNX Runtime sessions: one way to open and run an exported artifact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..errors import EffvisionError


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
