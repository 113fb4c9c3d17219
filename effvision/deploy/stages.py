"""Deployment stages: export (ONNX or ExecuTorch, any precision, verified against PyTorch) and
bench (the harness over every artifact of the run, with the device's roofline and plots)."""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field, field_validator

from ..data.selectors import CalibrationConfig
from ..errors import EffvisionError
from ..recipe import StageConfig
from ..registry import BACKENDS
from ..runtimes import open_file, runtime_of_backend, runtime_of_format, runtime_of_kind
from ..stage import StageResult, register_stage
from .bench import add_roofline, benchmark, compare, settle_shares
from .verify import FP32_RELATIVE_TOLERANCE, export_verified, parity_failure


class ExportConfig(StageConfig):
    type: Literal["export"] = "export"
    format: Optional[str] = Field(
        None,
        description="export format: onnx, executorch, openvino or litert (default: the format of the files the "
        "recipe's target.backend runs, else onnx)",
    )
    precision: Literal["fp32", "fp16", "int8"] = Field("fp32", description="the exported file's precision")
    calibration: CalibrationConfig = Field(
        default_factory=CalibrationConfig, description="{selector, n}: samples that calibrate int8 activations"
    )
    parity_batches: int = Field(4, ge=1, description="validation batches compared against PyTorch")
    tolerance: Optional[float] = Field(
        None,
        gt=0,
        description="largest fp32 logit difference accepted, as a share of the largest |logit| "
        f"(default {FP32_RELATIVE_TOLERANCE:g}, or the model's parity_tolerance when it picks neighbours)",
    )
    min_agreement: float = Field(0.9, ge=0, le=1, description="smallest top-1 agreement with PyTorch accepted")

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str | None) -> str | None:
        if v is not None:
            runtime_of_format(v)
        return v


def export_format(ctx, cfg: ExportConfig) -> str:
    """The stage's format: its own, else that of the files the target's backend runs (a target on
    openvino-cpu ships an IR), else ONNX."""
    if cfg.format is not None:
        return cfg.format
    target = getattr(ctx.recipe, "target", None)
    if target is None:
        return "onnx"
    return runtime_of_backend(target.backend).format or "onnx"


@register_stage("export", ExportConfig)
def run_export(ctx, cfg: ExportConfig) -> StageResult:
    """Export the current model, verify it on validation samples, keep the figures beside it."""
    fmt = export_format(ctx, cfg)
    suffix = runtime_of_format(fmt).suffix
    path, check = export_verified(
        ctx.model,
        fmt,
        cfg.precision,
        ctx.stage_dir / f"model{suffix}",
        ctx.input_shape,
        ctx.calibration_loader(cfg.calibration),
        ctx.data.val_loader(),
        cfg.parity_batches,
        data=ctx.data.name,
    )
    tolerance = cfg.tolerance or getattr(ctx.model, "parity_tolerance", FP32_RELATIVE_TOLERANCE)
    failure = parity_failure(check, cfg.precision, tolerance, cfg.min_agreement)
    if failure:
        raise EffvisionError(f"exported {fmt} {cfg.precision} is not the model: {failure} ({path})")
    return ctx.artifact_result(path, extra={"format": fmt, "precision": cfg.precision, "parity": check})


class EvaluateConfig(StageConfig):
    type: Literal["evaluate"] = "evaluate"
    clips: int = Field(1, ge=1, description="video: clips per video, at evenly spaced positions")
    crops: Literal[1, 3] = Field(1, description="video: crops per clip (1: centre; 3: along the longer side)")


@register_stage("evaluate", EvaluateConfig)
def run_evaluate(ctx, cfg: EvaluateConfig) -> StageResult:
    """Accuracy of what ships (the latest ONNX file, else the current model) with test-time
    views (MMAction2's multi-clip, multi-crop testing), and their cost: clips x crops forward
    passes per video."""
    import time

    from torch.utils.data import DataLoader

    from ..data.video.views import ViewsDataset, views_accuracy
    from ..scoring import torch_predictor

    card, views = ctx.data.card, cfg.clips * cfg.crops
    dataset = ViewsDataset(ctx.data.val, cfg.clips, cfg.crops, card.image_size, card.mean, card.std)
    loader = DataLoader(
        dataset, batch_size=max(1, ctx.data.config.eval_batch_size // views), num_workers=ctx.data.config.num_workers
    )
    predict, runtime = (
        (open_file(ctx.onnx), "onnxruntime") if ctx.onnx else (torch_predictor(ctx.model, ctx.device), "torch")
    )
    start = time.perf_counter()
    acc, frames_per_video = views_accuracy(predict, loader)
    seconds = time.perf_counter() - start
    shipped = next(r for r in reversed(ctx.records) if {"onnx", "model"} & set(r["artifacts"]))
    metrics = {k: shipped.get(k) for k in ("params", "macs", "size_bytes")}
    metrics.update(
        accuracy=acc,
        evaluated_with=runtime,
        artifact_of=shipped["name"],
        time_to_accuracy_s=None,
        clips=cfg.clips,
        crops=cfg.crops,
        views=views,
        macs_per_video=(shipped.get("macs") or 0) * views,
        frames_decoded_per_video=round(frames_per_video, 2),
        frames_decoded_per_clip=round(frames_per_video / cfg.clips, 2),
        ms_per_video=round(1000 * seconds / max(1, len(dataset)), 2),
    )
    return StageResult(metrics, {})


class BenchConfig(StageConfig):
    type: Literal["bench"] = "bench"
    backends: list[str] = Field(
        default_factory=lambda: ["onnxruntime-cpu", "torch-eager"], description="backends every artifact is timed on"
    )
    precisions: list[str] = Field(
        default_factory=lambda: ["fp32"], description="for torch models; exported files run in their own precision"
    )
    batches: list[int] = Field(
        default_factory=lambda: [1, 32],
        description="batch sweep; the smallest is the latency batch, the largest the throughput one",
    )
    device: str = Field("auto", description="auto, cpu or cuda")
    channels_last: bool = Field(False, description="NHWC memory format for torch backends")
    compile_mode: str = Field(
        "default", description="torch.compile mode for torch-compile (reduce-overhead: CUDA graphs)"
    )
    warmup: int = Field(10, ge=0, description="untimed calls before timing")
    repeats: int = Field(50, ge=3, description="timed calls per artifact, backend and batch")
    threads: int | None = Field(None, ge=1, description="intra-op threads (default: all cores)")
    roofline: bool = Field(True, description="measure the device's matmul peak and copy bandwidth in the same run")
    targets: Literal["all", "final"] = Field("all", description="every stage's artifact, or only the last of each kind")
    reference: bool = Field(
        True,
        description="time the uncompressed model, exported like the final artifact, interleaved with it: "
        "the report's headline",
    )

    @field_validator("backends")
    @classmethod
    def _known_backends(cls, v: list[str]) -> list[str]:
        for b in v:
            BACKENDS.get(b)
        return v

    @field_validator("batches")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if not v or min(v) < 1:
            raise ValueError("batches must be a non-empty list of positive sizes")
        return sorted(set(v))


@register_stage("bench", BenchConfig)
def run_bench(ctx, cfg: BenchConfig) -> StageResult:
    """Latency p50/p90/p99, throughput, memory and share of the device's peak for the stages'
    artifacts, with a plot of the batch sweep. ONNX files (and the reference) are timed side by
    side, interleaved, on each ONNX Runtime backend; the headline comes from those rows."""
    from ..device import resolve_device
    from .reference import headline, prepare_reference, time_against_final
    from .results import plot_sweep
    from .roofline import Roofline

    device = resolve_device(cfg.device)
    roofline = Roofline(device) if cfg.roofline else None
    ref = prepare_reference(ctx, device) if cfg.reference else None
    measurements, files = _bench_each(ctx, cfg, device, roofline)
    measurements += _bench_side_by_side(ctx, cfg, device, roofline, files, ref)
    if ref is not None and ref.kind != "onnx":
        measurements += time_against_final(ctx, ref, cfg.batches, device, cfg.warmup, cfg.repeats)
    if not measurements:
        raise EffvisionError(f"bench: nothing to measure with backends {cfg.backends} on {device.type}")
    settle_shares(measurements, roofline)
    plot = plot_sweep(measurements, ctx.stage_dir / "bench.png", f"{ctx.recipe.name}: latency and throughput")
    extra = {"roofline": roofline.summary() if roofline else None, "plots": [plot.name] if plot else []}
    extra.update(headline(ref, measurements, cfg.batches) if ref else {"reference": None, "headline": None})
    return ctx.bench_result(measurements, extra)


def _shape_of(ctx, stage: str) -> list[int]:
    """A stage's input shape (after a plan that lowered the input size, that size)."""
    return ctx.records_by_name.get(stage, {}).get("input_size") or ctx.full_input_shape


def _bench_each(ctx, cfg: BenchConfig, device, roofline) -> tuple[list[dict], dict]:
    """Every artifact but the ONNX files timed on each backend asked for that runs it; and the ONNX
    files by backend ({backend: {stage: (path, precision, macs)}}), to be timed side by side."""
    from ..models import count_macs

    measurements, files = [], {}
    for stage, kind, artifact in ctx.artifacts_to_bench(cfg.targets):
        runtime = runtime_of_kind(kind)
        shape = _shape_of(ctx, stage)
        macs = count_macs(artifact, shape) if kind == "model" else ctx.records_by_name[stage].get("macs")
        for backend in (b for b in cfg.backends if b in runtime.backends()):
            if BACKENDS.get(backend).missing() or device.type not in BACKENDS.get(backend).supports:
                continue
            if kind == "onnx":
                files.setdefault(backend, {})[stage] = (artifact, runtime.precision(artifact), macs)
                continue
            precisions = cfg.precisions if kind == "model" else [ctx.records_by_name[stage].get("precision", "fp32")]
            batches = runtime.file_batches(artifact, cfg.batches)
            options = (device, cfg.channels_last, cfg.compile_mode, cfg.warmup, cfg.repeats, cfg.threads)
            for precision in precisions:
                rows = benchmark(artifact, shape, backend, precision, batches, *options, macs=macs, roofline=roofline)
                measurements += [{"stage": stage, **r} for r in rows]
    return measurements, files


def _bench_side_by_side(ctx, cfg: BenchConfig, device, roofline, files: dict, ref) -> list[dict]:
    """The ONNX files of each backend, and the reference with the shipped file where an ONNX file
    ships (whatever `backends` says), timed interleaved in one process."""
    from ..models import count_macs
    from .reference import NAME

    if ref is not None and ref.kind == "onnx":
        shipped = ref.final["name"]
        timed = files.setdefault(ref.backend, {})
        timed.setdefault(shipped, (ctx.run_dir / ref.final["artifacts"]["onnx"], None, ref.final.get("macs")))
        timed[NAME] = (ref.onnx, "fp32", count_macs(ref.model, ctx.full_input_shape))
    onnx, measurements = runtime_of_kind("onnx"), []
    for backend, targets in files.items():
        on = device if device.type in BACKENDS.get(backend).supports else torch.device("cpu")
        named = {
            n: (path, precision or onnx.precision(path), ctx.full_input_shape if n == NAME else _shape_of(ctx, n))
            for n, (path, precision, _) in targets.items()
        }
        timing = (cfg.batches, on, cfg.warmup, cfg.repeats, min(10, cfg.repeats), cfg.threads)
        rows = compare(named, ctx.input_shape, backend, *timing)
        order = list(targets)
        for r in sorted(rows, key=lambda r: (order.index(r["target"]), r["batch"])):
            name = r.pop("target")
            measurements.append({"stage": name, **add_roofline(r, targets[name][2], roofline)})
    return measurements
