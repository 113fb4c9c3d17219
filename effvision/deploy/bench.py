"""The one benchmark harness: latency p50/p90/p99 and throughput of any backend, with warm-up."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from ..registry import BACKENDS


@BACKENDS.register("torch-eager")
def torch_eager(artifact, threads: int | None = None) -> Callable[[np.ndarray], object]:
    """A torch nn.Module run eagerly under inference_mode."""
    if not isinstance(artifact, nn.Module):
        raise TypeError("torch-eager benchmarks a torch model, not a file")
    model = artifact.eval().cpu()

    def run(x: np.ndarray):
        with torch.inference_mode():
            return model(torch.from_numpy(x))

    return run


@BACKENDS.register("onnxruntime-cpu")
def onnxruntime_cpu(artifact, threads: int | None = None) -> Callable[[np.ndarray], object]:
    """An ONNX file run by ONNX Runtime's CPU execution provider."""
    from .runtime import ort_session

    if not isinstance(artifact, (str, Path)):
        raise TypeError("onnxruntime-cpu benchmarks an .onnx file")
    session = ort_session(artifact, threads=threads)
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})


def backend_for(artifact) -> str:
    return "torch-eager" if isinstance(artifact, nn.Module) else "onnxruntime-cpu"


def measure(run: Callable[[np.ndarray], object], shape: list[int], batch: int, warmup: int = 10, repeats: int = 50) -> dict:
    """Time run() on a fixed random batch: warm-up first, then `repeats` timed calls; latency
    percentiles in ms and throughput from the median."""
    x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
    for _ in range(warmup):
        run(x)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run(x)
        times.append((time.perf_counter() - t) * 1e3)
    ms = np.asarray(times)
    p50 = float(np.percentile(ms, 50))
    return {"batch": batch, "p50": round(p50, 4), "p90": round(float(np.percentile(ms, 90)), 4),
            "p99": round(float(np.percentile(ms, 99)), 4), "samples_per_s": round(batch / (p50 / 1e3), 2), "repeats": len(ms)}


def benchmark(artifact, shape: list[int], backend: str | None = None, batches: tuple[int, ...] = (1, 32), warmup: int = 10,
              repeats: int = 50, threads: int | None = None) -> list[dict]:
    """Benchmark one model or ONNX file on one backend over several batch sizes."""
    backend = backend or backend_for(artifact)
    run = BACKENDS.get(backend)(artifact, threads=threads)
    return [{"backend": backend, **measure(run, shape, b, warmup=warmup, repeats=repeats)} for b in batches]
