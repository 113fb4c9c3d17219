"""Deployment: verified exports (ONNX, ExecuTorch), evaluation of exported artifacts and the one
benchmark harness across backends, precisions, devices and batch sizes."""

import os

from . import backends, exporters  # noqa: F401  (register BACKENDS and EXPORTERS)
from .bench import bench_model, benchmark
from .exporters import export_verified, parity
from .onnx_export import export_onnx
from .runtime import onnx_predictor, ort_session

export = export_verified


def evaluate(artifact, loader) -> float:
    """Top-1 of a torch model, or of a file in its runtime (runtimes.py), over a loader."""
    from ..errors import EffvisionError
    from ..scoring import accuracy, torch_predictor
    from .runtimes import runtime_of_path

    if not isinstance(artifact, (str, os.PathLike)):
        return accuracy(torch_predictor(artifact), loader)
    files = runtime_of_path(artifact)
    if files.suffix is None:
        raise EffvisionError(f"cannot evaluate {artifact}: no runtime runs a file named so")
    return accuracy(files.predictor(artifact), loader)


__all__ = [
    "bench_model",
    "benchmark",
    "export",
    "export_verified",
    "export_onnx",
    "parity",
    "evaluate",
    "onnx_predictor",
    "ort_session",
]
