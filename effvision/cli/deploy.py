"""`effvision export` and `effvision bench`: verified exports and the one benchmark harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import EffvisionError
from .common import csv, out, table


def _bench_model(spec: str):
    """What bench times: a checkpoint, or the card's model with its weights when it has them;
    otherwise the architecture with random weights (the same speed), said in one line (an unknown
    name is said as unknown, not timed)."""
    from ..models import is_checkpoint_path, load_model
    from ..models.factory import missing_weights

    why = None if is_checkpoint_path(spec) else missing_weights(spec)
    if why is not None:
        out.print(f"timing {spec} with random weights (the same speed): {why}")
    return load_model(spec, random_weights=why is not None)


def _export_data(net, data: Optional[str], data_root: Optional[str]):
    """The dataset that verifies (and calibrates) an export: --data, else the one the checkpoint
    was trained on or the zoo card names, else digits (said in one line); it must fit the model."""
    from ..data import load_dataset
    from ..models.zoo import get_card
    from ..recipe import DataConfig

    spec = net.effvision_spec
    card = get_card(spec.get("name", ""))
    trained_on = spec.get("data") or ({"name": card.dataset, "root": None, "image_size": None} if card else None)
    if card is not None and not spec.get("data") and card.modality == "image" and len(spec["input_size"]) == 3:
        # a card fine-tuned at another size than its dataset's own (Lite0 on CIFAR-10 at 112 px) sees it at its own
        trained_on["image_size"] = spec["input_size"][-1]
    if data is None and trained_on and trained_on["name"]:
        cfg = DataConfig(
            name=trained_on["name"], root=data_root or trained_on["root"], image_size=trained_on["image_size"]
        )
    else:
        if data is None:
            out.print(f"no dataset known for {spec.get('name')}: verifying on digits (pass --data to choose)")
        cfg = DataConfig(name=data or "digits", root=data_root)
    try:  # a pretrained card's inputs are normalised its way
        bundle = load_dataset(cfg, preprocessing=card.preprocessing if card else None)
    except EffvisionError as exc:
        if data is not None:
            raise
        raise EffvisionError(
            f"the model's dataset {cfg.name} is not available ({exc}); pass --data-root (the folder holding it) "
            "or --data (another dataset the model fits)"
        ) from None
    if list(bundle.input_size) != list(spec["input_size"]) or bundle.num_classes != spec["num_classes"]:
        raise EffvisionError(
            f"--data {cfg.name} ({bundle.num_classes} classes, input {bundle.input_size}) does not fit the model "
            f"({spec['num_classes']} classes, input {spec['input_size']}); pass --data"
        )
    return bundle


def export(
    model: str = typer.Argument(..., help="An effvision checkpoint (model.pt) or a zoo card name (with its weights)."),
    format: str = typer.Option(
        "onnx",
        "--format",
        help="onnx (fp32, fp16, int8), executorch (fp32, int8; XNNPACK, needs the [edge] extra), openvino "
        "(fp32, int8 by NNCF; needs the [openvino] extra) or litert (.tflite: fp32, int8; needs the [litert] extra "
        "and `make litert-converter`).",
    ),
    precision: str = typer.Option("fp32", help="fp32, fp16 or int8 (static, calibrated on --data)."),
    out_file: Optional[Path] = typer.Option(
        None,
        "--out",
        help="Output file (default model.onnx / model.pte / model.xml, with model.bin beside it / model.tflite).",
    ),
    data: Optional[str] = typer.Option(
        None,
        help="Dataset card for the parity check and int8 calibration (default: the one the checkpoint was trained "
        "on or the zoo card names, else digits).",
    ),
    data_root: Optional[str] = typer.Option(None, help="data.root for that dataset."),
    calibration_samples: int = typer.Option(256, help="Samples for int8 calibration."),
    bundle_dir: Optional[Path] = typer.Option(
        None, "--bundle", help="Also write a deployment bundle here: the file, model.json, predict.py, README.md."
    ),
    random_weights: bool = typer.Option(
        False, "--random-weights", help="Export a name's architecture with random weights (no card weights needed)."
    ),
):
    """Export a model (dynamic batch) and verify it against PyTorch on validation samples; the
    parity figures are written beside the file as <file>.parity.json, and the file carries its
    classes, preprocessing and measured accuracy (ONNX metadata_props["effvision"]; an OpenVINO IR's
    rt_info; a .tflite file's metadata table; <file>.json beside a .pte)."""
    import torch

    from ..compression.selection import calibration_indices
    from ..data.selectors import CalibrationConfig
    from ..deploy import evaluate
    from ..deploy.metadata import for_artifact, write_metadata
    from ..deploy.verify import export_verified, parity_path, writer
    from ..fileio import write_json

    runtime = writer(format, precision)  # unknown format or precision, or not installed: one line, before any work
    if bundle_dir is not None and runtime.bundle_package is None:
        raise EffvisionError(
            "--bundle holds an ONNX file, an OpenVINO IR or a LiteRT file (its predict.py runs without torch): "
            "use --format onnx, openvino or litert"
        )
    from ..models import load_model

    net = load_model(model, random_weights)
    bundle = _export_data(net, data, data_root)
    out_file = out_file or Path("model" + runtime.suffix)
    # The quantize stage's calibration path: class-balanced training samples, eval transforms.
    calib = bundle.train_eval_loader(
        calibration_indices(bundle, CalibrationConfig(n=calibration_samples), net, torch.device("cpu")), batch_size=32
    )
    path, figures = export_verified(
        net, format, precision, out_file, net.effvision_spec["input_size"], calib, bundle.val_loader(), data=bundle.name
    )
    figures["accuracy"] = evaluate(path, bundle.val_loader())
    write_json(parity_path(path), figures)
    write_metadata(
        path, for_artifact(bundle, net, figures["accuracy"], path, {"precision": precision, "exported_from": model})
    )
    out.print(json.dumps(figures, indent=2))
    if bundle_dir is not None:
        from ..deploy.bundle import write_bundle

        out.print(f"wrote the bundle {write_bundle(path, bundle_dir)}")


def _print_bench(title: str, rows: list[dict]) -> None:
    table(
        title,
        ["backend", "precision", "batch", "p50 ms", "p90 ms", "p99 ms", "samples/s", "% peak", "peak MiB"],
        [
            [
                r["backend"] + (f" ({r['compile_mode']})" if r.get("compile_mode") not in (None, "default") else ""),
                r["precision"],
                str(r["batch"]),
                f"{r['p50']:.3f}",
                f"{r['p90']:.3f}",
                f"{r['p99']:.3f}",
                f"{r['samples_per_s']:.0f}",
                f"{100 * r['fraction_of_peak']:.1f}" if r.get("fraction_of_peak") is not None else "-",
                f"{r['peak_memory']['bytes'] / (1 << 20):.0f}",
            ]
            for r in rows
        ],
    )


def bench(
    artifact: str = typer.Argument(..., help="An .onnx or .pte file, an effvision checkpoint or a model name."),
    backend: Optional[str] = typer.Option(
        None,
        help="Comma list of backends (default: torch-eager,onnxruntime-cpu for a model, each precision where it "
        "runs; by suffix for a file).",
    ),
    precision: Optional[str] = typer.Option(
        None, help="Comma list: fp32, tf32, bf16, fp16, int8, float8 (default fp32; a file runs in its own)."
    ),
    batch: str = typer.Option("1,32", help="Comma list of batch sizes (the sweep)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    channels_last: bool = typer.Option(False, "--channels-last", help="NHWC memory format for torch backends."),
    compile_mode: str = typer.Option(
        "default", help="torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune."
    ),
    input_size: Optional[str] = typer.Option(None, help="Input C,H,W for a model (default: its own), e.g. 3,224,224."),
    warmup: int = typer.Option(10, help="Untimed warm-up runs."),
    repeats: int = typer.Option(50, help="Timed runs per batch size."),
    threads: Optional[int] = typer.Option(None, help="Intra-op threads (default: all cores)."),
    roofline: bool = typer.Option(
        True, help="Measure the device's matmul peak and copy bandwidth and report each run's share."
    ),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write the results as JSON here."),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Write results.json, results.md and bench.png here."),
    runtimes: Optional[str] = typer.Option(
        None,
        "--runtimes",
        help="all, or a comma list of onnxruntime, executorch, openvino, litert: the model exported to each in "
        "each --precision (default fp32,int8), every file verified, all timed interleaved in one process per "
        "batch, with its speed-up over ONNX Runtime's fp32 file; with --data-root or --data, each file's top-1 "
        "on the whole validation split.",
    ),
    data: Optional[str] = typer.Option(None, help="With --runtimes: the dataset that verifies, calibrates, scores."),
    data_root: Optional[str] = typer.Option(None, help="With --runtimes: data.root for that dataset."),
    rounds: int = typer.Option(10, help="With --runtimes: interleaved rounds (repeats are split among them)."),
):
    """Latency p50/p90/p99, throughput, peak memory and share of the device's peak, per backend,
    precision and batch size, with warm-up and repeats. A model is exported first for backends
    that run files (int8 calibrated on random inputs: for speed, not accuracy). With --runtimes:
    which runtime ships the model fastest, side by side."""
    from ..deploy.bench import settle_shares
    from ..deploy.roofline import Roofline
    from ..device import resolve_device

    dev = resolve_device(device)
    batches = csv(batch, int)
    if not batches or min(batches) < 1:
        raise EffvisionError(f"--batch {batch}: give positive batch sizes")
    if runtimes is not None:
        return _bench_runtimes(
            artifact,
            csv(runtimes),
            csv(precision or "fp32,int8"),
            batches,
            input_size,
            data,
            data_root,
            json_file,
            out_dir,
            dict(warmup=warmup, repeats=repeats, rounds=rounds, threads=threads),
        )
    rf = Roofline(dev) if roofline else None
    kw = dict(
        batches=batches,
        device=dev,
        channels_last=channels_last,
        compile_mode=compile_mode,
        warmup=warmup,
        repeats=repeats,
        threads=threads,
        roofline=rf,
    )
    precisions = csv(precision) if precision else None
    rows, shape = _bench_artifact(artifact, csv(backend) if backend else None, precisions, input_size, kw)
    rows = settle_shares(rows, rf)
    _print_bench(f"bench: {artifact} on {dev}", rows)
    _write_bench(artifact, shape, rows, rf, json_file, out_dir)


def _bench_artifact(artifact: str, backends, precisions, input_size, kw: dict) -> tuple[list[dict], list[int]]:
    """(rows, input shape): a file on its runtime's backends in its own precision, or a model
    (exported first for the backends that run files)."""
    from ..deploy.backends import check_pair, default_pairs
    from ..deploy.bench import bench_model, benchmark
    from ..models import count_macs, input_shape
    from ..runtimes import runtime_of_path

    files = runtime_of_path(artifact)
    if files.suffix is None:
        net = _bench_model(artifact)
        shape = csv(input_size, int) if input_size else input_shape(net)
        if backends:
            pairs = [(b, p) for b in backends for p in (precisions or ["fp32"])]
        else:
            pairs, skipped = default_pairs(["torch-eager", "onnxruntime-cpu"], precisions or ["fp32"], kw["device"])
            if skipped:
                out.print(f"skipped {', '.join(skipped)}: not run on {kw['device'].type} (--backend names others)")
        return bench_model(net, shape, pairs, macs=count_macs(net, shape), **kw), shape
    if not Path(artifact).is_file():
        raise EffvisionError(f"file not found: {artifact}")
    backends = [files.check_backend(b) for b in backends] if backends else [files.default_backend]
    shape = files.input_shape(artifact)[1:]
    kw = {**kw, "batches": files.file_batches(artifact, kw["batches"])}
    rows = []
    for b in backends:
        for p in precisions or [files.precision(artifact)]:
            check_pair(b, p, kw["device"])
            rows += benchmark(artifact, shape, b, p, **kw)
    return rows, shape


def _write_bench(artifact: str, shape: list[int], rows: list[dict], roofline, json_file, out_dir) -> None:
    from ..deploy.results import write_results
    from ..env import collect_env
    from ..fileio import write_json

    meta = {
        "artifact": artifact,
        "input_shape": shape,
        "roofline": roofline.summary() if roofline else None,
        "env": collect_env(),
    }
    if json_file:
        write_json(json_file, {**meta, "results": rows})
    if out_dir:
        paths = write_results(rows, out_dir, meta, f"effvision bench: {artifact}")
        out.print("wrote " + ", ".join(str(p) for p in paths.values()))


def _bench_runtimes(
    artifact, names, precisions, batches, input_size, data, data_root, json_file, out_dir, timing
) -> None:
    """bench --runtimes: the model on every runtime asked for, side by side (deploy/runtime_compare.py)."""
    import tempfile

    import torch

    from ..compression.selection import calibration_indices
    from ..data.selectors import CalibrationConfig
    from ..deploy.results import write_results
    from ..deploy.runtime_compare import compare_runtimes, runtimes_asked
    from ..env import collect_env
    from ..fileio import write_json
    from ..runtimes import runtime_of_path

    if runtime_of_path(artifact).suffix is not None:
        raise EffvisionError("--runtimes compares one model across runtimes: give a checkpoint or a model name")
    chosen, notes = runtimes_asked(names)  # unknown or missing runtimes: one line, before any work
    for note in notes:
        out.print(note)
    net = _bench_model(artifact)
    shape = csv(input_size, int) if input_size else list(net.effvision_spec["input_size"])
    calibration = val = None
    if data is not None or data_root is not None:
        bundle = _export_data(net, data, data_root)
        indices = calibration_indices(bundle, CalibrationConfig(n=256), net, torch.device("cpu"))
        calibration, val = bundle.train_eval_loader(indices, batch_size=32), bundle.val_loader()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(out_dir) / "files" if out_dir else Path(tmp)
        rows, files = compare_runtimes(net, shape, chosen, precisions, batches, work, calibration, val, **timing)
    table(
        f"bench --runtimes: {artifact} on the CPU, interleaved",
        ["runtime", "precision", "batch", "p50 ms", "x ONNX fp32", "MB", "rel. diff", "agree", "top-1"],
        [
            [
                r["runtime"],
                r["precision"],
                str(r["batch"]),
                f"{r['p50']:.3f}",
                f"{r['speedup_vs_onnxruntime_fp32']:.2f}",
                f"{f['size_bytes'] / 1e6:.2f}",
                f"{f['relative_diff']:.1e}" if "relative_diff" in f else "-",
                f"{f['top1_agreement']:.3f}" if "top1_agreement" in f else "-",
                f"{f['top1']:.4f}" if "top1" in f else "-",
            ]
            for r in rows
            for f in [next(f for f in files if f["target"] == r["target"])]
        ],
    )
    meta = {"artifact": artifact, "input_shape": shape, "files": files, "notes": notes, "env": collect_env()}
    if json_file:
        write_json(json_file, {**meta, "results": rows})
    if out_dir:
        paths = write_results(rows, out_dir, meta, f"effvision bench --runtimes: {artifact}")
        out.print("wrote " + ", ".join(str(p) for p in paths.values()))


def predict(
    artifact: str = typer.Argument(
        ..., help="An .onnx, .pte, .xml or .tflite file, an effvision checkpoint or a zoo card name."
    ),
    inputs: list[str] = typer.Argument(..., help="Image, video or point-cloud files, folders (recursive), zips."),
    topk: int = typer.Option(3, "--topk", min=1, help="Classes shown per input."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write every prediction and the summary here."),
    batch: int = typer.Option(32, "--batch", min=1, help="Inputs run together."),
    backend: Optional[str] = typer.Option(
        None,
        help="onnxruntime-cpu (default for .onnx), onnxruntime-cuda, executorch (.pte), openvino-cpu (.xml), "
        "litert-cpu (.tflite), torch-eager (models).",
    ),
    mean: Optional[str] = typer.Option(None, help="For a file without effvision metadata: mean per channel, 0..1."),
    std: Optional[str] = typer.Option(None, help="For a file without effvision metadata: std per channel."),
    size: Optional[int] = typer.Option(None, help="For a file without effvision metadata: the square side it takes."),
    quiet: bool = typer.Option(False, "--quiet", help="Only the summary (and unreadable files)."),
):
    """Run a shipped model on files with its own preprocessing: top-k classes per input, files/s
    and the median time per batch, and the top-1 against folder labels (ImageFolder layout). An
    unreadable file is one status line; the others are predicted."""
    from ..deploy.predict_files import items, run, summary
    from ..deploy.predictor import load
    from ..fileio import write_json

    vectors = {k: csv(v, float) if v else None for k, v in (("mean", mean), ("std", std))}
    for k, v in vectors.items():
        if v is not None and len(v) != 3:
            raise EffvisionError(f"--{k} {v}: give three values (R,G,B)")
    predictor = load(artifact, backend, vectors["mean"], vectors["std"], size)
    found, other = items(inputs, predictor.modality, predictor.classes)
    for name, why in other:
        out.print(f"{name}: skipped: {why}", markup=False, highlight=False)
    outcome = None
    for what, value in run(predictor, found, batch, topk):
        if what == "row":
            if not quiet:
                tops = "  ".join(f"{t['class']} {t['p']:.3f}" for t in value["top"])
                out.print(f"{value['input']}: {tops}", markup=False, highlight=False)
        elif what == "skip":
            out.print(f"{value[0]}: skipped: {value[1]}", markup=False, highlight=False)
        else:
            outcome = value
    figures = summary(outcome, batch)
    figures["skipped"] += len(other)
    line = (
        f"{figures['predicted']} predicted, {figures['skipped']} skipped in {figures['seconds']:.2f} s "
        f"({figures['files_per_s']} files/s; p50 {figures['p50_batch_ms']} ms per batch of up to {batch}; "
        f"{predictor.runtime})"
    )
    if figures["top1"] is not None:
        line += f"; top-1 against folder labels {figures['top1']:.4f} ({figures['correct']}/{figures['labelled']})"
    out.print(line, markup=False, highlight=False)
    if json_file:
        skipped = [{"input": n, "skipped": w} for n, w in other + outcome.skipped]
        write_json(
            json_file, {"artifact": artifact, "summary": figures, "predictions": outcome.rows, "skipped": skipped}
        )


COMMANDS = [export, bench, predict]  # registered on the root app, in this order
