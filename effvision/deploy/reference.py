"""The run's reference: the uncompressed model (the one entering the first compression stage),
exported to the backend the final artifact runs on, scored on the same validation data and timed
interleaved with the final artifact in one process. The report's headline is final against it, so
a change of runtime is never counted as compression."""

from __future__ import annotations

from pathlib import Path

import torch

from ..progress import log

COMPRESSING = ("prune", "distill", "quantize")
_WHAT = {"onnx": "fp32 ONNX", "pte": "fp32 ExecuTorch program", "model": "fp32 PyTorch model"}


def reference_record(records: list[dict]) -> dict | None:
    """The first compression stage's record (its input_model is the reference), if any."""
    return next((r for r in records if r["type"] in COMPRESSING and r.get("input_model")), None)


def deployment_backend(kind: str, device: torch.device) -> str:
    from ..registry import BACKENDS

    if kind == "onnx":
        cuda = device.type == "cuda" and not BACKENDS.get("onnxruntime-cuda").missing()
        return "onnxruntime-cuda" if cuda else "onnxruntime-cpu"
    return {"pte": "executorch", "model": "torch-eager"}[kind]


def _final_target(ctx, final: dict):
    """(kind, target, precision) of the artifact that ships."""
    from .runtime import onnx_precision

    arts = final["artifacts"]
    if "onnx" in arts:
        path = ctx.run_dir / arts["onnx"]
        return "onnx", path, onnx_precision(path)
    if "pte" in arts:
        return "pte", ctx.run_dir / arts["pte"], final.get("precision", "fp32")
    from ..models import load_checkpoint

    return "model", load_checkpoint(ctx.run_dir / arts["model"]), "fp32"


def measure_reference(ctx, final: dict, batches: list[int], device, warmup: int, repeats: int) -> dict | None:
    """{'reference', 'headline', 'reference_timing'} for the report, or None when no stage compressed."""
    from ..models import load_checkpoint
    from . import evaluate
    from .backends import backend as get_backend
    from .bench import batch_groups, compare
    from .exporters import export_for_backend
    from .onnx_export import export_onnx

    first = reference_record(ctx.records)
    if first is None:
        return None
    kind, final_target, final_precision = _final_target(ctx, final)
    backend = deployment_backend(kind, device)
    model = load_checkpoint(ctx.run_dir / first["input_model"])
    log(f"  reference: the model entering '{first['name']}', {_WHAT[kind]} on {backend}")
    rounds = min(10, repeats)
    rows, size, accuracy = [], None, None
    for group in batch_groups(get_backend(backend).takes, batches):
        if kind == "onnx":
            ref = export_onnx(model, ctx.stage_dir / "reference.onnx", ctx.input_shape)
        elif kind == "pte":
            ref = export_for_backend(model, ".pte", "fp32", ctx.stage_dir, ctx.input_shape, batch=group[0])[0]
        else:
            ref = model
        if accuracy is None:
            accuracy = evaluate(ref, ctx.data.val_loader())
            size = (
                Path(ref).stat().st_size if kind != "model" else Path(ctx.run_dir / first["input_model"]).stat().st_size
            )
        targets = {"reference": (ref, "fp32"), "final": (final_target, final_precision)}
        rows += compare(targets, ctx.input_shape, backend, group, device, warmup, repeats, rounds)
    p50 = {(r["target"], r["batch"]): r for r in rows}
    lat_batch = min(batches)
    ref_row = p50[("reference", lat_batch)]
    reference = {
        "what": f"uncompressed model, {_WHAT[kind]}",
        "stage": f"input of {first['name']}",
        "backend": backend,
        "accuracy": accuracy,
        "size_bytes": size,
        "latency_ms": {k: ref_row[k] for k in ("batch", "p50", "p90", "p99")} | {"backend": backend},
        "throughput": {
            "backend": backend,
            "batch": max(batches),
            "samples_per_s": p50[("reference", max(batches))]["samples_per_s"],
        },
        "timed": f"interleaved with the final artifact, {rounds} rounds",
    }
    speedups = {b: round(p50[("reference", b)]["p50"] / p50[("final", b)]["p50"], 3) for b in batches}
    final_size = final.get("size_bytes")
    headline = {
        "speedup": speedups[lat_batch],
        "size_ratio": round(final_size / size, 4) if final_size and size else None,
        "accuracy_delta": round(final["accuracy"] - accuracy, 6) if final.get("accuracy") is not None else None,
        "backend": backend,
        "batch": lat_batch,
        "speedups": speedups,
        "final": final["name"],
        "final_p50_ms": {b: p50[("final", b)]["p50"] for b in batches},
        "reference_p50_ms": {b: p50[("reference", b)]["p50"] for b in batches},
    }
    log(
        "  headline: "
        + ", ".join(f"{s:.2f}x at b={b}" for b, s in speedups.items())
        + f" vs the reference on {backend}"
    )
    return {"reference": reference, "headline": headline, "reference_timing": rows}
