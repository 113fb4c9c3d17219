"""Compression: structured pruning, distillation (a task of the one training loop), int8 quantization."""

from .prune import prune
from .quantize import quantize_onnx

__all__ = ["prune", "quantize_onnx"]
