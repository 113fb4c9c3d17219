"""Deployment stages: export (ONNX with a parity check) and bench (latency/throughput)."""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from ..errors import EffvisionError
from ..recipe import StageConfig
from ..registry import BACKENDS
from ..stage import StageResult, register_stage
from .bench import benchmark
from .onnx_export import export_onnx, parity


class ExportConfig(StageConfig):
    type: Literal["export"] = "export"
    format: Literal["onnx"] = "onnx"
    opset: Optional[int] = Field(None, ge=13)
    parity_batches: int = Field(4, ge=1, description="validation batches compared against PyTorch")
    tolerance: float = Field(1e-3, gt=0, description="largest max-abs logit difference accepted")


@register_stage("export", ExportConfig)
def run_export(ctx, cfg: ExportConfig) -> StageResult:
    """Export the current model to ONNX (one file, dynamic batch) and verify it against PyTorch."""
    model = ctx.model
    path = export_onnx(model, ctx.stage_dir / "model.onnx", opset=cfg.opset)
    check = parity(model, path, ctx.data.val_loader(), cfg.parity_batches)
    if check["max_abs_diff"] > cfg.tolerance:
        raise EffvisionError(f"exported ONNX differs from PyTorch by {check['max_abs_diff']:.2e} > tolerance {cfg.tolerance:g} ({path})")
    return ctx.onnx_result(path, extra={"parity": check})


class BenchConfig(StageConfig):
    type: Literal["bench"] = "bench"
    backends: list[str] = Field(default_factory=lambda: ["onnxruntime-cpu", "torch-eager"])
    batch: int = Field(1, ge=1, description="batch for latency")
    throughput_batch: int = Field(32, ge=1, description="batch for throughput")
    warmup: int = Field(10, ge=0)
    repeats: int = Field(50, ge=3)
    threads: Optional[int] = Field(None, ge=1, description="intra-op threads (default: all cores)")
    targets: Literal["all", "final"] = Field("all", description="every stage's artifact, or only the last of each kind")


@register_stage("bench", BenchConfig)
def run_bench(ctx, cfg: BenchConfig) -> StageResult:
    """Latency p50/p90/p99 and throughput of the stages' artifacts, warm-up and repeats."""
    for b in cfg.backends:
        BACKENDS.get(b)
    if cfg.threads:
        import torch

        torch.set_num_threads(cfg.threads)
    measurements = []
    for stage, kind, artifact in ctx.artifacts_to_bench(cfg.targets):
        backend = "torch-eager" if kind == "model" else "onnxruntime-cpu"
        if backend not in cfg.backends:
            continue
        for m in benchmark(artifact, ctx.input_shape, backend, (cfg.batch, cfg.throughput_batch), cfg.warmup, cfg.repeats, cfg.threads):
            measurements.append({"stage": stage, **m})
    if not measurements:
        raise EffvisionError(f"bench: nothing to measure with backends {cfg.backends}")
    return ctx.bench_result(measurements, cfg.batch, cfg.throughput_batch)
