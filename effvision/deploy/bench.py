"""The one benchmark harness: any backend, precision, device and batch size, with warm-up and
repeats; latency p50/p90/p99, throughput, peak memory, model FLOPs and the achieved FLOP/s as a
fraction of the device's peak (see roofline.py)."""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn

from ..device import PeakMemory, Timer, resolve_device, synchronize
from ..errors import EffvisionError
from .backends import BenchOptions, Loaded, check_pair
from .roofline import Roofline


def _first_and_warm(loaded: Loaded, batch: int, device: torch.device, warmup: int):
    """The input batch, and the first call's milliseconds (compilation, if any), then warm-up."""
    x = loaded.make_input(batch)
    t = time.perf_counter()
    loaded.run(x)
    synchronize(device)
    first_ms = (time.perf_counter() - t) * 1e3
    for _ in range(warmup):
        loaded.run(x)
    synchronize(device)
    return x, first_ms


def _summary(times, batch: int, warmup: int, first_ms: float, timer: Timer) -> dict:
    """Percentiles in ms and throughput from the median."""
    times = np.asarray(times)
    p50 = float(np.percentile(times, 50))
    return {
        "batch": batch,
        "p50": round(p50, 4),
        "p90": round(float(np.percentile(times, 90)), 4),
        "p99": round(float(np.percentile(times, 99)), 4),
        "samples_per_s": round(batch / (p50 / 1e3), 2),
        "repeats": len(times),
        "warmup": warmup,
        "first_call_ms": round(first_ms, 2),
        "timer": timer.kind,
    }


def measure(loaded: Loaded, batch: int, device: torch.device, warmup: int = 10, repeats: int = 50) -> dict:
    """Time loaded.run on one fixed batch: the first call (compilation, if any) apart, then
    warm-up, then `repeats` timed calls; percentiles in ms, throughput from the median."""
    x, first_ms = _first_and_warm(loaded, batch, device, warmup)
    timer = Timer(device)
    with PeakMemory(device) as mem:
        times = [timer.time(lambda: loaded.run(x)) for _ in range(repeats)]
    return {**_summary(times, batch, warmup, first_ms, timer), "peak_memory": mem.result()}


def measure_interleaved(
    loaded: dict[str, Loaded], batch: int, device: torch.device, warmup: int = 10, repeats: int = 50, rounds: int = 10
) -> dict[str, dict]:
    """Time several targets side by side, so that a slow spell of a shared machine hits them all:
    `rounds` rounds, each one block of repeats/rounds timed calls per target, the order reversed
    every other round (A B, B A, ...), one untimed call opening each block (what ran before it,
    such as the other runtime's threads, stays out of the timing). Rows as measure() gives, by
    name, without peak memory (the targets share one process)."""
    if rounds < 1 or repeats < rounds:
        raise EffvisionError(f"interleaved timing needs 1 <= rounds <= repeats, got rounds={rounds}, repeats={repeats}")
    names = list(loaded)
    prepared = {n: _first_and_warm(loaded[n], batch, device, warmup) for n in names}
    timer, times = Timer(device), {n: [] for n in names}
    per_block = repeats // rounds
    for r in range(rounds):
        for n in names if r % 2 == 0 else reversed(names):
            run, x = loaded[n].run, prepared[n][0]
            run(x)
            synchronize(device)
            times[n] += [timer.time(lambda run=run, x=x: run(x)) for _ in range(per_block)]
    return {
        n: {
            **_summary(times[n], batch, warmup, prepared[n][1], timer),
            "interleaved": {"rounds": rounds, "per_block": per_block, "with": [m for m in names if m != n]},
        }
        for n in names
    }


def add_roofline(row: dict, macs: int | None, roofline: Roofline | None) -> dict:
    """FLOPs per sample (2 x MACs), achieved FLOP/s at the median, and its share of the peak."""
    if not macs:
        return row
    flops = 2 * macs
    achieved = flops * row["batch"] / (row["p50"] / 1e3)
    row.update(flops_per_sample=flops, achieved_flops_per_s=achieved)
    peak = roofline.peak(row["precision"], at_least=achieved) if roofline else None
    if peak and not _divide_by_peak(row, peak):
        # A probe can be beaten (a theoretical peak cannot): no share above 100%, one line on why
        print(
            f"effvision: {row['backend']} {row['precision']} batch {row['batch']} achieved "
            f"{achieved / 1e9:.1f} GFLOP/s, above the {peak['precision']} ceiling of "
            f"{peak['flops_per_s'] / 1e9:.1f} GFLOP/s ({peak.get('how') or peak['probe'] + ' probe'}); "
            "its share of peak is not reported",
            file=sys.stderr,
        )
    return row


def _divide_by_peak(row: dict, peak: dict) -> bool:
    """The row's share of `peak`, never above 100% (None and peak_exceeded instead); False there."""
    within = (share := row["achieved_flops_per_s"] / peak["flops_per_s"]) <= 1.0
    row.update(peak_flops_per_s=peak["flops_per_s"], peak_precision=peak["precision"], peak_probe=peak["probe"])
    row.update(fraction_of_peak=share if within else None)
    if within:
        row.pop("peak_exceeded", None)  # (settled again against a higher peak)
    else:
        row["peak_exceeded"] = True
    return within


def settle_shares(rows: list[dict], roofline: Roofline | None) -> list[dict]:
    """Every row divided by the roofline's final peaks. A row that beat the peak has the probes run
    again (add_roofline), and the rows measured before it would otherwise keep the lower ceiling of
    a busy moment (under a concurrent test run: one row at 219 GFLOP/s of peak, the next at 239)."""
    if roofline:
        for r in rows:
            if "achieved_flops_per_s" in r and (peak := roofline.peak(r["precision"], retries=0)):
                _divide_by_peak(r, peak)
    return rows


def benchmark(
    target,
    shape: list[int],
    backend: str | None = None,
    precision: str = "fp32",
    batches: Iterable[int] = (1, 32),
    device: str | torch.device = "auto",
    channels_last: bool = False,
    compile_mode: str = "default",
    warmup: int = 10,
    repeats: int = 50,
    threads: int | None = None,
    macs: int | None = None,
    roofline: Roofline | None = None,
    calibration: Iterable[torch.Tensor] = (),
) -> list[dict]:
    """Benchmark one model or artifact file on one backend and precision over several batch sizes."""
    device = resolve_device(device) if isinstance(device, str) else device
    backend = backend or default_backend(target)
    inst = check_pair(backend, precision, device)
    if inst.takes != "model" and isinstance(target, nn.Module):
        raise EffvisionError(f"backend '{backend}' runs a {inst.takes} file; use bench_model() to export one first")
    opts = BenchOptions(
        device=device,
        precision=precision,
        channels_last=channels_last,
        compile_mode=compile_mode,
        threads=threads,
        calibration=list(calibration),
    )
    loaded = inst.load(target, shape, opts)
    rows = []
    for b in batches:
        row = {
            "backend": backend,
            "precision": precision,
            "device": str(device),
            **measure(loaded, b, device, warmup, repeats),
        }
        if inst.takes == "model":
            row.update(
                channels_last=channels_last, **({"compile_mode": compile_mode} if backend == "torch-compile" else {})
            )
        row.update(loaded.notes)
        rows.append(add_roofline(row, macs, roofline))
    return rows


def compare(
    targets: dict[str, tuple],
    shape: list[int],
    backend: str | None,
    batches: Iterable[int] = (1, 32),
    device: str | torch.device = "auto",
    warmup: int = 10,
    repeats: int = 50,
    rounds: int = 10,
    threads: int | None = None,
) -> list[dict]:
    """Targets side by side: each (file or model, precision[, its own input shape]) loaded once on
    `backend` (None: each on its runtime's default backend, as runtimes are compared), then timed
    interleaved (measure_interleaved) per batch. One row per target and batch, with `target`;
    e.g. {"reference": ("fp32.onnx", "fp32"), "final": ("int8.onnx", "int8")}."""
    device = resolve_device(device) if isinstance(device, str) else device
    backends = {name: backend or default_backend(spec[0]) for name, spec in targets.items()}
    loaded = {
        name: check_pair(backends[name], spec[1], device).load(
            spec[0],
            list(spec[2]) if len(spec) > 2 else shape,
            BenchOptions(device=device, precision=spec[1], threads=threads, side_by_side=True),
        )
        for name, spec in targets.items()
    }
    rows = []
    for b in batches:
        timed = measure_interleaved(loaded, b, device, warmup, repeats, rounds)
        rows += [
            {"target": n, "backend": backends[n], "precision": targets[n][1], "device": str(device), **row}
            for n, row in timed.items()
        ]
    return rows


def default_backend(target) -> str:
    """The backend that times `target` (a torch model, or a file named by its suffix)."""
    from ..runtimes import file_runtimes, runtime_named, runtime_of_path

    if isinstance(target, nn.Module):
        return runtime_named("torch").default_backend
    runtime = runtime_of_path(target)
    if runtime.suffix is None:
        suffixes = ", ".join(r.suffix for r in file_runtimes())
        raise EffvisionError(
            f"cannot benchmark {target}: expected a file ({suffixes}), an effvision checkpoint or a model name"
        )
    return runtime.default_backend


def bench_model(
    model: nn.Module,
    shape: list[int],
    pairs: list[tuple[str, str]],
    batches: Iterable[int] = (1, 32),
    device: str | torch.device = "auto",
    calibration=None,
    workdir: str | Path | None = None,
    **kw,
) -> list[dict]:
    """Benchmark a torch model on (backend, precision) pairs, exporting it first for backends that
    run files (ONNX, ExecuTorch). `calibration` is a loader of (x, y) for int8 (random inputs
    when None: fine for speed, not for accuracy)."""
    from ..runtimes import runtime_of_backend
    from .verify import export_for_runtime

    device = resolve_device(device) if isinstance(device, str) else device
    for name, precision in pairs:  # fail on a bad pair before any slow work
        check_pair(name, precision, device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(workdir or tmp)
        for name, precision in pairs:
            runtime = runtime_of_backend(name)
            for group in runtime.batch_groups(batches):
                target = (
                    model
                    if runtime.suffix is None
                    else export_for_runtime(model, runtime, precision, work, shape, calibration, batch=group[0])[0]
                )
                calib = (x for x, _ in calibration) if calibration is not None else ()
                rows += benchmark(target, shape, name, precision, group, device, calibration=calib, **kw)
    return settle_shares(rows, kw.get("roofline"))
