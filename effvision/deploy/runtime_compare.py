"""Which runtime ships a model fastest: the model exported to every installed runtime (ONNX
Runtime, ExecuTorch, OpenVINO, LiteRT) in each precision, every file verified against PyTorch,
then all of them timed interleaved in one process per batch size, and, given data, each file's
top-1 in its own runtime. `effvision bench MODEL --runtimes all` prints and writes it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import EffvisionError
from ..registry import UnknownNameError, suggest
from ..runtimes import Runtime, file_runtimes
from .bench import compare
from .verify import export_for_runtime

BASELINE = ("onnxruntime", "fp32")  # the row every speed-up is against


def runtimes_asked(names: list[str], precision: str = "int8") -> tuple[list[Runtime], list[str]]:
    """The runtimes to compare, and one note per runtime left out. "all": every runtime whose
    export in `precision` works here (the others noted: what to install); named ones must all work
    (one line)."""
    known = {r.name: r for r in file_runtimes()}
    if names == ["all"]:
        chosen, strict = list(known.values()), False
    else:
        unknown = next((n for n in names if n not in known), None)
        if unknown is not None:
            raise UnknownNameError(suggest(unknown, [*known, "all"], "runtime"))
        chosen, strict = [known[n] for n in names], True
    if not any(r.name == BASELINE[0] for r in chosen):
        raise EffvisionError("the comparison is against ONNX Runtime's fp32 file: include onnxruntime")
    kept, notes = [], []
    for runtime in chosen:
        reason = runtime.missing("int8" if precision == "int8" else "export")
        if reason is None:
            kept.append(runtime)
        elif strict:
            raise EffvisionError(f"runtime {runtime.name}: {reason}")
        else:
            notes.append(f"{runtime.name} left out: {reason}")
    return kept, notes


def compare_runtimes(
    model: nn.Module,
    shape: list[int],
    runtimes: list[Runtime],
    precisions: list[str],
    batches: list[int],
    work: Path,
    calibration=None,
    val_loader=None,
    warmup: int = 10,
    repeats: int = 50,
    rounds: int = 10,
    threads: int | None = None,
) -> tuple[list[dict], list[dict]]:
    """(timing rows, one row per file). Each runtime's file in each precision it has, verified
    against PyTorch on four batches of `val_loader` (of random inputs without one: a converter
    that drops or breaks layers shows there too) and, given data, scored on all of it (top-1 in
    its runtime); per batch, every file that runs it timed interleaved, with its speed-up over
    ONNX Runtime's fp32 file measured beside it."""
    from . import evaluate

    noise = torch.Generator().manual_seed(0)
    checks = val_loader or [(torch.randn(8, *shape, generator=noise), None) for _ in range(4)]
    files, exports = {}, []
    for runtime in runtimes:
        (work / runtime.name).mkdir(parents=True, exist_ok=True)
        for precision in (p for p in precisions if p in runtime.precisions):
            for group in runtime.batch_groups(batches):
                path, figures = export_for_runtime(  # parity on 4 batches; top-1 below on them all
                    model,
                    runtime,
                    precision,
                    work / runtime.name,
                    shape,
                    calibration,
                    checks,
                    group[0],
                    parity_batches=4,
                    data="real images" if val_loader is not None else "random inputs",
                )
                name = f"{runtime.name} {precision}{runtime.batch_label(group[0])}"
                files[name] = (str(path), precision, group)
                row = {"target": name, "runtime": runtime.name, "precision": precision, "file": str(path)}
                row["size_bytes"] = runtime.file_bytes(path)
                if figures:
                    row.update({k: figures[k] for k in ("relative_diff", "top1_agreement", "samples", "data")})
                if val_loader is not None:
                    row["top1"] = evaluate(path, val_loader)
                exports.append(row)
    baseline = f"{BASELINE[0]} {BASELINE[1]}"
    rows = []
    for b in batches:
        here = {n: (f, p) for n, (f, p, group) in files.items() if b in group}
        timed = compare(here, shape, None, [b], warmup=warmup, repeats=repeats, rounds=rounds, threads=threads)
        base = next(r["p50"] for r in timed if r["target"] == baseline)
        for r in timed:
            r["runtime"] = r["target"].split()[0]
            r["speedup_vs_onnxruntime_fp32"] = base / r["p50"]
        rows += timed
    return rows, exports
