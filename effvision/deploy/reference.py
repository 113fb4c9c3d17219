"""The run's reference: the uncompressed model (the one entering the first compression stage),
exported like the final artifact, scored on the same validation data and timed interleaved with
the final artifact in one process. The report's headline is final against it, so a change of
runtime is never counted as compression."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..progress import log
from ..runtimes import runtime_of_kind, shipped_artifact

COMPRESSING = ("prune", "distill", "quantize", "qat")
NAME = "reference"  # its rows in the bench stage's measurements


@dataclass
class Reference:
    kind: str  # what ships, and so how the reference is exported: onnx, pte or model
    backend: str
    model: torch.nn.Module
    entering: str  # the first compression stage
    final: dict  # the shipped stage's record
    accuracy: float | None = None
    size_bytes: int | None = None
    onnx: Path | None = None  # the reference file when an ONNX file ships (the bench stage times it with the others)
    file: Path | None = None  # the reference exported like a shipped file that runs any batch size


def reference_record(records: list[dict]) -> dict | None:
    """The first compression stage's record (its input_model is the reference), if any."""
    return next((r for r in records if r["type"] in COMPRESSING and r.get("input_model")), None)


def reference_model(ctx) -> torch.nn.Module | None:
    """The uncompressed model as the run has it so far: the input of its first compression stage,
    or None while no compression stage has run (the current model is then the reference)."""
    from ..models import load_checkpoint

    first = reference_record(ctx.records)
    return load_checkpoint(ctx.run_dir / first["input_model"]) if first is not None else None


def prepare_reference(ctx, device) -> Reference | None:
    """Export the reference like the shipped artifact (fp32 in the shipped file's format, beside
    the bench stage) and score it on the validation split in that runtime; None when nothing
    compressed."""
    from ..models import load_checkpoint
    from . import evaluate

    first = reference_record(ctx.records)
    if first is None:
        return None
    final = ctx.shipped_record()
    arts = final["artifacts"]
    kind = shipped_artifact(arts)[0]
    runtime = runtime_of_kind(kind)
    path = ctx.run_dir / first["input_model"]
    ref = Reference(kind, runtime.backend_for(device.type), load_checkpoint(path), first["name"], final)
    log(f"  reference: the model entering '{first['name']}', fp32 {runtime.label} on {ref.backend}")
    if runtime.suffix and runtime.batch_rule != "fixed":
        # at the data's own input size, where a plan stage lowered the compressed model's
        where = ctx.stage_dir / f"reference{runtime.suffix}"
        ref.file = runtime.export(ref.model, where, list(ctx.full_input_shape))
        ref.onnx = ref.file if kind == "onnx" else None
        ref.accuracy, ref.size_bytes = evaluate(ref.file, ctx.full_data.val_loader()), runtime.file_bytes(ref.file)
    else:  # a program of one batch size (.pte): its accuracy is the PyTorch model's, as its export was verified
        ref.accuracy, ref.size_bytes = evaluate(ref.model, ctx.full_data.val_loader()), path.stat().st_size
        # (for a .pte, time_against_final replaces the size with the program's, at the latency batch)
    return ref


def time_against_final(ctx, ref: Reference, batches: list[int], device, warmup: int, repeats: int) -> list[dict]:
    """Rows for a reference that the bench stage's own interleaved ONNX timing does not cover
    (another runtime's file or a torch model ships): reference and final side by side on the
    final's backend."""
    from ..models import load_checkpoint
    from .bench import compare
    from .verify import export_for_runtime

    arts, rows, runtime = ref.final["artifacts"], [], runtime_of_kind(ref.kind)
    for group in runtime.batch_groups(batches):
        if runtime.batch_rule == "fixed":  # one program per batch size
            target = export_for_runtime(
                ref.model, runtime, "fp32", ctx.stage_dir, ctx.full_input_shape, batch=group[0]
            )[0]
            if group[0] == min(batches):
                ref.size_bytes = runtime.file_bytes(target)  # the program at the latency batch, as the headline's
        elif runtime.suffix:
            target = ref.file
        else:
            target = ref.model
        if runtime.suffix:
            final = (ctx.run_dir / arts[ref.kind], ref.final.get("precision", "fp32"))
        else:
            final = (load_checkpoint(ctx.run_dir / arts["model"]), "fp32")
        # the reference at the data's own input size, where a plan stage lowered the final's
        targets = {NAME: (target, "fp32", ctx.full_input_shape), ref.final["name"]: (*final, ctx.input_shape)}
        rows += compare(targets, ctx.input_shape, ref.backend, group, device, warmup, repeats, min(10, repeats))
    return [{"stage": r.pop("target"), **r} for r in rows]


def headline(ref: Reference, rows: list[dict], batches: list[int]) -> dict:
    """{'reference', 'headline'} for the report, from interleaved rows of the reference and the
    shipped stage on the reference's backend."""
    final = ref.final
    pick = {(r["stage"], r["batch"]): r for r in rows if r["backend"] == ref.backend and "interleaved" in r}
    lat_batch, tp_batch = min(batches), max(batches)
    ref_row = pick[(NAME, lat_batch)]
    reference = {
        "what": f"uncompressed model, fp32 {runtime_of_kind(ref.kind).label}",
        "stage": f"input of {ref.entering}",
        "backend": ref.backend,
        "accuracy": ref.accuracy,
        "size_bytes": ref.size_bytes,
        "latency_ms": {"backend": ref.backend, **{k: ref_row[k] for k in ("batch", "p50", "p90", "p99")}},
        "throughput": {
            "backend": ref.backend,
            "batch": tp_batch,
            "samples_per_s": pick[(NAME, tp_batch)]["samples_per_s"],
        },
        "timed": f"interleaved with the final artifact, {ref_row['interleaved']['rounds']} rounds",
    }
    speedups = {b: round(pick[(NAME, b)]["p50"] / pick[(final["name"], b)]["p50"], 3) for b in batches}
    size = final.get("size_bytes")
    summary = {
        "speedup": speedups[lat_batch],
        "size_ratio": round(size / ref.size_bytes, 4) if size and ref.size_bytes else None,
        "accuracy_delta": (
            round(final["accuracy"] - ref.accuracy, 6) if None not in (final.get("accuracy"), ref.accuracy) else None
        ),
        "backend": ref.backend,
        "batch": lat_batch,
        "speedups": speedups,
        "final": final["name"],
        "final_p50_ms": {b: pick[(final["name"], b)]["p50"] for b in batches},
        "reference_p50_ms": {b: pick[(NAME, b)]["p50"] for b in batches},
    }
    log("  headline: " + ", ".join(f"{s:.2f}x at b={b}" for b, s in speedups.items()) + f" on {ref.backend}")
    return {"reference": reference, "headline": summary}
