"""Deployment: verified exports into any runtime's file (runtimes/), evaluation of exported files
and the one benchmark harness across backends, precisions, devices and batch sizes."""

import os

from ..runtimes import open_file, runtime_of_path
from ..runtimes.onnx_files import export_onnx
from . import backends  # noqa: F401  (registers BACKENDS)
from .bench import bench_model, benchmark
from .verify import export_verified, parity

export = export_verified


def evaluate(artifact, loader) -> float:
    """Top-1 of a torch model, or of a file in its runtime, over a loader."""
    from ..errors import EffvisionError
    from ..scoring import accuracy, torch_predictor

    if not isinstance(artifact, (str, os.PathLike)):
        return accuracy(torch_predictor(artifact), loader)
    if runtime_of_path(artifact).suffix is None:
        raise EffvisionError(f"cannot evaluate {artifact}: no runtime runs a file named so")
    return accuracy(open_file(artifact), loader)


__all__ = [
    "bench_model",
    "benchmark",
    "export",
    "export_verified",
    "export_onnx",
    "parity",
    "evaluate",
    "open_file",
]
