"""Deployment: export (ONNX), evaluation of the exported artifact, the benchmark harness."""
import os
from .bench import benchmark
from .onnx_export import export_onnx, parity
from .runtime import onnx_predictor, ort_session

export = export_onnx


def evaluate(artifact, loader) -> float:
    """Top-1 of a torch model or an ONNX file over a loader."""
    from ..evaluate import accuracy, torch_predictor

    is_file = isinstance(artifact, (str, os.PathLike))
    return accuracy(onnx_predictor(artifact) if is_file else torch_predictor(artifact), loader)


__all__ = ["benchmark", "export", "export_onnx", "parity", "evaluate", "onnx_predictor", "ort_session"]
