"""The `effvision` command line: a thin typer front end over the Python API."""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from .errors import EffvisionError

app = typer.Typer(
    help="Efficient visual recognition end to end: fine-tune, compress, export and benchmark compact models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
zoo_app = typer.Typer(help="The model zoo (cards under models/).", no_args_is_help=True)
data_app = typer.Typer(help="Datasets: inspect files, write compressed copies.", no_args_is_help=True)
study_app = typer.Typer(help="Studies: sweeps that write a table (results.json, .md) and a plot.", no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")
app.add_typer(data_app, name="data")
app.add_typer(study_app, name="study")
# Piped output (CI logs, `| tee`) would otherwise wrap tables at 80 columns.
out = Console(width=None if sys.stdout.isatty() else 160)

SET_HELP = "Override a recipe key, e.g. --set stages.1.ratio=0.6 or --set data.root=../data (repeatable)."


@app.callback()
def _root(
    debug: bool = typer.Option(
        False, "--debug", help="Show full tracebacks on errors (accepted after any command too)."
    ),
):
    """Every command accepts --debug; errors otherwise print one line and exit 1."""


def _table(title: str, head: list[str], rows: list[list[str]]) -> None:
    t = Table(title=title, show_lines=False)
    for h in head:
        t.add_column(h, overflow="fold", no_wrap=h not in ("path", "error"))
    for r in rows:
        t.add_row(*r)
    out.print(t)


# ----------------------------------------------------------------------------- zoo
@zoo_app.command("list")
def zoo_list(
    modality: Optional[str] = typer.Option(None, help="image, video or points"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """List the zoo's model cards with parameters, MACs, input size and default recipe (a card
    without params/MACs is built and measured)."""
    from .models import build, count_macs, count_params, resolve
    from .models.zoo import list_cards
    from .report import fmt_num

    if modality not in (None, "image", "video", "points"):
        raise EffvisionError(f"unknown modality '{modality}' (choices: image, video, points)")
    rows = []
    for card in list_cards(modality):
        params, macs = card.params, card.macs
        if params is None or macs is None:
            model = build(resolve(card.name))
            params, macs = count_params(model), count_macs(model, card.input_size)
        rows.append(
            {
                "name": card.name,
                "arch": card.arch,
                "modality": card.modality,
                "params": params,
                "macs": macs,
                "input_size": card.input_size,
                "num_classes": card.num_classes,
                "dataset": card.dataset,
                "recipe": card.recipe,
                "accuracy": card.trained.accuracy if card.trained else None,
            }
        )
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    _table(
        "effvision zoo",
        ["name", "modality", "params", "MACs", "input size", "classes", "dataset", "recipe", "trained top-1"],
        [
            [
                r["name"],
                r["modality"],
                fmt_num(r["params"]),
                fmt_num(r["macs"]),
                "x".join(map(str, r["input_size"])),
                str(r["num_classes"]),
                r["dataset"] or "-",
                r["recipe"] or "-",
                "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}",
            ]
            for r in rows
        ],
    )


@zoo_app.command("show")
def zoo_show(name: str = typer.Argument(..., help="A card name from `effvision zoo list`.")):
    """Show one model card."""
    from .models import resolve
    from .models.zoo import get_card

    resolve(name)  # raises with suggestions for an unknown name
    card = get_card(name)
    if card is None:
        raise EffvisionError(f"'{name}' is an architecture, not a zoo card; cards: `effvision zoo list`")
    print(json.dumps(card.model_dump(mode="json"), indent=2))


@zoo_app.command("compat")
def zoo_compat(
    models: Optional[str] = typer.Option(
        None, help="Comma-separated timm model names (default: the built-in list of efficient families)."
    ),
    size: int = typer.Option(224, min=16, help="Input height and width."),
    prune_ratio: float = typer.Option(0.3, min=0.01, max=0.95, help="Channels removed from every prunable group."),
    timeout: float = typer.Option(
        300, min=10, help="Seconds per model; a model still running then is a failure saying where it was stuck."
    ),
    out: Path = typer.Option(
        Path("docs/compat.md"), help="Markdown table to write (a .json with every measurement goes beside it)."
    ),
):
    """Take timm models through create, forward, backward, prune, export, ONNX Runtime parity and int8;
    write the table."""
    from .models.compat import DEFAULT_MODELS, run_compat, write_compat
    from .progress import track

    names = _csv(models) if models else list(DEFAULT_MODELS)
    rows = run_compat(names, size=size, prune_ratio=prune_ratio, timeout_s=timeout, progress=track)
    import shlex

    command = "effvision " + shlex.join(_ARGV)  # the table says what wrote it
    path = write_compat(rows, out, size, prune_ratio, command)
    _table(
        f"{sum(r.ok for r in rows)} of {len(rows)} pass every step",
        ["model", "result", "failing step: reason"],
        [
            [
                r.name.removeprefix("timm:"),
                "pass" if r.ok else "[red]FAIL[/]",
                "" if r.ok else f"{r.failed_step}: {r.reason}",
            ]
            for r in rows
        ],
    )
    print(f"wrote {path}")


@zoo_app.command("publish")
def zoo_publish(
    run_dir: Path = typer.Argument(..., help="A finished run folder, e.g. runs/demo."),
    stage: str = typer.Option(..., help="The stage whose model to publish (unpruned, e.g. baseline)."),
    card: Optional[str] = typer.Option(None, help="The zoo card (default: the model name the run used)."),
    write: bool = typer.Option(False, "--write", help="Write the trained: block into the card file (else print it)."),
):
    """Save a run stage's weights next to its zoo card (safetensors + sha256) with the accuracy, recipe and command."""
    from . import yamlio
    from .models.publish import append_trained_block, publish

    path, block = publish(run_dir, stage, card)
    name = card or path.stem
    if write:
        print(f"wrote {path} and the trained: block of {append_trained_block(name, block)}")
    else:
        print(
            f"wrote {path}; add to the card (or rerun with --write):\n"
            + yamlio.dump({"trained": block}, sort_keys=False, width=1000)
        )


# ----------------------------------------------------------------------------- data
@data_app.command("inspect")
def data_inspect(
    path: Path = typer.Argument(..., help="A file, a folder or a .zip."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per file (a list)."),
    bin_width: Optional[int] = typer.Option(
        None,
        "--bin-width",
        min=3,
        help="float32 values per record of raw LiDAR .bin files (KITTI 4, nuScenes 5, ScanNet 6); default: by "
        "convention",
    ),
):
    """Decode every file under PATH and report one status per file."""
    from .data.inspect import inspect_path
    from .progress import track

    results = inspect_path(path, progress=track, bin_width=bin_width)
    if as_json:
        print(json.dumps(results, indent=2))
        return
    bad = [r for r in results if not r["ok"]]
    shown = bad[:50] if len(results) > 50 else results
    _table(
        f"{path}: {len(results) - len(bad)} ok, {len(bad)} failed",
        ["path", "ok", "kind", "shape", "details / error"],
        [
            [
                r["path"],
                "yes" if r["ok"] else "[red]no[/]",
                r["kind"] or "-",
                "x".join(map(str, r["shape"])) if r["shape"] else "-",
                r["error"] or _details(r),
            ]
            for r in shown
        ],
    )


@data_app.command("compress")
def data_compress(
    src: Path = typer.Argument(..., help="A dataset folder or .zip (any layout; it is kept)."),
    dst: Path = typer.Argument(..., help="A new folder, or a .zip file, for the compressed copy."),
    max_size: Optional[int] = typer.Option(None, help="Images: longest side in pixels."),
    quality: Optional[int] = typer.Option(None, help="Images: JPEG/WebP quality 1-100 (default: Pillow's 75)."),
    image_format: str = typer.Option("jpeg", "--format", help="Images: jpeg, webp or png."),
    stride: Optional[int] = typer.Option(None, help="Videos: keep every k-th frame."),
    keyframes: bool = typer.Option(False, "--keyframes", help="Videos: keep key frames only."),
    short_side: Optional[int] = typer.Option(None, help="Videos: re-encode at this short side (even)."),
    crf: int = typer.Option(23, help="Videos: libx264 CRF 0-51 (higher: smaller files, lower quality)."),
    voxel_size: Optional[float] = typer.Option(
        None, help="Points: one point per voxel of this size (the file's units)."
    ),
    points: Optional[int] = typer.Option(None, "--points", help="Points: keep this many, farthest-point sampled."),
    decode_sample: int = typer.Option(500, min=1, help="Files decoded to measure decode throughput before and after."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Also write the figures here as JSON."),
):
    """Write a compressed copy of a dataset and report bytes before/after and decode throughput
    (median of 3 passes over the same sample of files, before and after, in one run)."""
    from .data.compression import Levels, compress_dataset
    from .fileio import write_json
    from .progress import track
    from .report import fmt_bytes

    lv = Levels(
        max_size=max_size,
        quality=quality,
        image_format=image_format,
        stride=stride,
        keyframes=keyframes,
        short_side=short_side,
        crf=crf,
        voxel_size=voxel_size,
        num_points=points,
    )
    stats = compress_dataset(src, dst, lv, progress=track, decode_sample=decode_sample)
    rows = [
        [
            "files",
            f"{stats['files']} ({stats['compressed']} compressed, {stats['copied']} copied, {len(stats['failed'])} "
            "unreadable)",
        ],
        ["bytes", f"{fmt_bytes(stats['bytes_before'])} -> {fmt_bytes(stats['bytes_after'])} ({stats['ratio']:.1%})"],
    ]
    if "decode_per_s_before" in stats:
        rows.append(
            [
                f"decode {stats['decode_unit']}/s",
                f"{stats['decode_per_s_before']:.0f} -> {stats['decode_per_s_after']:.0f} "
                f"(x{stats['decode_per_s_after'] / stats['decode_per_s_before']:.2f}, {stats['decode_sample']} files)",
            ]
        )
    rows += [["unreadable", f["path"] + ": " + f["error"]] for f in stats["failed"][:20]]
    _table(f"{src} -> {dst}", ["", "value"], rows)
    if json_file:
        write_json(json_file, stats)


def _details(r: dict) -> str:
    if r.get("frames") is not None:
        return f"{r['frames']} frames, {r['fps']:g} fps, {r['backend']}"
    if r.get("points") is not None:
        what = f"mesh: {r['points']} vertices, {r['faces']} faces" if r.get("mesh") else f"{r['points']} points"
        return f"{what}, {r['channels']} channels" + (
            f", read as {r['bin_width']} floats per record" if r.get("bin_width") else ""
        )
    return ""


# ----------------------------------------------------------------------------- pipeline
def _print_report(report: dict, run_dir: Path) -> None:
    from .report import table_rows

    head, rows = table_rows(report)
    _table(f"effvision: {report['recipe']}", head, rows)
    out.print(f"report: {run_dir / 'report.md'}")


def _run(recipe_path: str, sets: list[str], run_dir: Optional[Path], only: set[str] | None) -> None:
    from .pipeline import run_pipeline
    from .recipe import load_recipe

    recipe = load_recipe(recipe_path, sets)
    run_dir = run_dir or Path("runs") / recipe.name
    report = run_pipeline(recipe, run_dir, only_types=only)
    _print_report(report, run_dir)


@app.command()
def compress(
    recipe: str = typer.Argument(..., help="Recipe YAML (or a name under compress/)."),
    set_: List[str] = typer.Option([], "--set", help=SET_HELP),
    run_dir: Optional[Path] = typer.Option(
        None, help="Run folder (default runs/<recipe name>); an existing one resumes."
    ),
):
    """Run a whole recipe: train, prune, distill, export, quantize, bench; writes report.json/md/html."""
    _run(recipe, set_, run_dir, None)


@app.command()
def train(
    recipe: str = typer.Argument(..., help="Recipe YAML (or a name under compress/)."),
    set_: List[str] = typer.Option([], "--set", help=SET_HELP),
    run_dir: Optional[Path] = typer.Option(None, help="Run folder (default runs/<recipe name>[-<preset>])."),
    preset: Optional[str] = typer.Option(
        None, help="Apply one of the recipe's own presets (its `presets:`), e.g. plain."
    ),
    target_accuracy: Optional[float] = typer.Option(
        None,
        help="Stop each train stage when validation top-1 reaches this (0-1] "
        "and report the seconds of training it took.",
    ),
    seeds: int = typer.Option(
        1, min=1, help="Train this many times (seed, seed+1, ...) into <run-dir>/seed-<s>; mean and spread."
    ),
    time_limit: Optional[float] = typer.Option(
        None, min=0.001, help="Stop each train stage after this many seconds of training."
    ),
    nproc: int = typer.Option(
        1,
        help="Training processes on this machine (torchrun, DistributedDataParallel; "
        "gloo on CPU cores, nccl on GPUs); batch_size stays the global batch.",
    ),
):
    """Run only the recipe's select and train stages (a later `compress` on the same run folder resumes after them)."""
    from .recipe import load_recipe
    from .train import distributed
    from .train.time_to_accuracy import check_target, run_seeds

    check_target(target_accuracy)
    recipe = load_recipe(recipe, set_, preset)
    if not distributed.launched_by_torchrun():
        distributed.check_nproc(nproc, recipe.device)
    if nproc > 1 and not distributed.launched_by_torchrun():
        raise typer.Exit(distributed.launch(nproc, _without_option(_ARGV, "--nproc")))
    distributed.init()
    run_dir = run_dir or Path("runs") / (recipe.name + (f"-{preset}" if preset else ""))
    if target_accuracy is None and seeds == 1 and time_limit is None:
        from .pipeline import run_pipeline

        report = run_pipeline(recipe, run_dir, only_types={"select", "train"})
        if distributed.rank() == 0:
            _print_report(report, run_dir)
        return
    summary = run_seeds(recipe, run_dir, seeds, target_accuracy, time_limit)
    if distributed.rank() == 0:
        _print_time_to_accuracy(summary, run_dir)


def _print_time_to_accuracy(summary: dict, run_dir: Path) -> None:
    def secs(v):
        return "-" if v is None else f"{v:.1f}"

    target = summary["target_accuracy"]
    rows = [
        [
            str(r["seed"]),
            secs(r["time_to_accuracy_s"])
            if r["time_to_accuracy_s"] is not None
            else f"not reached ({r['stopped'] or 'end'})",
            "-" if r["epochs_to_accuracy"] is None else f"{r['epochs_to_accuracy']:g}",
            f"{r['accuracy']:.4f}",
            "-" if r.get("accuracy_tta") is None else f"{r['accuracy_tta']:.4f}",
            secs(r["train_s"]),
            secs(r["eval_s"]),
            secs(r["compile_s"]),
        ]
        for r in summary["rows"]
    ]
    _table(
        f"time to {target if target else 'end'}: {summary['recipe']}",
        ["seed", "s to target", "epochs", "top-1", "top-1 mirror-avg", "train s", "eval s", "compile s"],
        rows,
    )
    if summary["reached"]:
        out.print(
            f"reached {summary['reached']}/{summary['seeds']}: {summary['mean_s']:.1f} ± {summary['std_s']:.1f} s of "
            "training "
            f"(evaluation and compilation excluded)"
        )
    out.print(f"wrote {run_dir / 'time_to_accuracy.json'}")


def _without_option(argv: list[str], name: str) -> list[str]:
    """argv without `name VALUE` / `name=VALUE` (what a relaunched process must not see again)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run folder, e.g. runs/demo.")):
    """Rebuild report.json/md/html of a run folder and print its table (refused while a run is
    writing the folder)."""
    from .report import write_report
    from .runlock import run_lock

    if not run_dir.is_dir():
        raise EffvisionError(f"run folder not found: {run_dir}")
    with run_lock(run_dir):
        _print_report(write_report(run_dir), run_dir)


# ----------------------------------------------------------------------------- deploy
def _load_model(spec: str, num_classes: Optional[int]):
    """A checkpoint file written by effvision, or a model name (random weights)."""
    from .models import create_model, load_checkpoint

    if spec.endswith((".pt", ".pth", ".safetensors")) or os.sep in spec:
        return load_checkpoint(spec)
    return create_model(spec, num_classes=num_classes).eval()


def _export_data(net, data: Optional[str], data_root: Optional[str]):
    """The dataset that verifies (and calibrates) an export: --data, else the one the checkpoint
    was trained on, else digits; it must fit the model."""
    from .data import load_dataset
    from .recipe import DataConfig

    trained_on = net.effvision_spec.get("data")
    if data is None and trained_on:
        cfg = DataConfig(
            name=trained_on["name"], root=data_root or trained_on["root"], image_size=trained_on["image_size"]
        )
    else:
        cfg = DataConfig(name=data or "digits", root=data_root)
    bundle = load_dataset(cfg)
    spec = net.effvision_spec
    if list(bundle.input_size) != list(spec["input_size"]) or bundle.num_classes != spec["num_classes"]:
        raise EffvisionError(
            f"--data {cfg.name} ({bundle.num_classes} classes, input {bundle.input_size}) does not fit the model "
            f"({spec['num_classes']} classes, input {spec['input_size']}); pass --data"
        )
    return bundle


@app.command()
def export(
    model: str = typer.Argument(..., help="An effvision checkpoint (model.pt) or a model name."),
    format: str = typer.Option(
        "onnx", "--format", help="onnx (fp32, fp16, int8) or executorch (fp32, int8; XNNPACK, needs the [edge] extra)."
    ),
    precision: str = typer.Option("fp32", help="fp32, fp16 or int8 (static, calibrated on --data)."),
    out_file: Optional[Path] = typer.Option(None, "--out", help="Output file (default model.onnx / model.pte)."),
    data: Optional[str] = typer.Option(
        None,
        help="Dataset card for the parity check and int8 calibration (default: the one the checkpoint was trained "
        "on, else digits).",
    ),
    data_root: Optional[str] = typer.Option(None, help="data.root for that dataset."),
    calibration_samples: int = typer.Option(256, help="Samples for int8 calibration."),
):
    """Export a model (dynamic batch) and verify it against PyTorch on validation samples; the
    parity figures are written beside the file as <file>.parity.json."""
    import torch

    from .compress.selection import calibration_indices
    from .data.selectors import CalibrationConfig
    from .deploy import evaluate
    from .deploy.exporters import export_verified, get_exporter

    exporter = get_exporter(format, precision)  # unknown format or precision: one line, before any work
    net = _load_model(model, None)
    bundle = _export_data(net, data, data_root)
    out_file = out_file or Path("model" + exporter.suffix)
    # The quantize stage's calibration path: class-balanced training samples, eval transforms.
    calib = bundle.train_eval_loader(
        calibration_indices(bundle, CalibrationConfig(n=calibration_samples), net, torch.device("cpu")), batch_size=32
    )
    path, figures = export_verified(
        net, format, precision, out_file, net.effvision_spec["input_size"], calib, bundle.val_loader(), data=bundle.name
    )
    figures["accuracy"] = evaluate(path, bundle.val_loader())
    from .deploy.exporters import parity_path
    from .fileio import write_json

    write_json(parity_path(path), figures)
    out.print(json.dumps(figures, indent=2))


def _csv(value: str, cast=str) -> list:
    try:
        return [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise EffvisionError(f"cannot parse '{value}' as a comma-separated list") from None


def _print_bench(title: str, rows: list[dict]) -> None:
    _table(
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


@app.command()
def bench(
    artifact: str = typer.Argument(..., help="An .onnx or .pte file, an effvision checkpoint or a model name."),
    backend: Optional[str] = typer.Option(
        None, help="Comma list of backends (default: torch-eager,onnxruntime-cpu for a model; by suffix for a file)."
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
):
    """Latency p50/p90/p99, throughput, peak memory and share of the device's peak, per backend,
    precision and batch size, with warm-up and repeats. A model is exported first for backends
    that run files (int8 calibrated on random inputs: for speed, not accuracy)."""
    from .deploy.backends import check_pair
    from .deploy.bench import bench_model, benchmark, default_backend
    from .deploy.results import write_results
    from .deploy.roofline import Roofline
    from .device import resolve_device
    from .env import collect_env
    from .fileio import write_json
    from .models import count_macs, input_shape

    dev = resolve_device(device)
    batches = _csv(batch, int)
    if not batches or min(batches) < 1:
        raise EffvisionError(f"--batch {batch}: give positive batch sizes")
    precisions = _csv(precision) if precision else None
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
    if artifact.endswith((".onnx", ".pte")):
        from .deploy.runtime import onnx_input_shape, onnx_precision

        if not Path(artifact).is_file():
            raise EffvisionError(f"file not found: {artifact}")
        found = onnx_precision(artifact) if artifact.endswith(".onnx") else None
        backends = _csv(backend) if backend else [default_backend(artifact)]
        precisions = precisions or [found or "fp32"]
        if artifact.endswith(".onnx"):
            shape = onnx_input_shape(artifact)
        else:  # a .pte program runs the one batch size it was exported for
            from .deploy.executorch_export import pte_input_shape

            program = pte_input_shape(artifact)
            shape, kw["batches"] = program[1:], [program[0]]
        rows = []
        for b in backends:
            for p in precisions:
                check_pair(b, p, dev)
                if b in ("torch-eager", "torch-compile"):
                    raise EffvisionError(
                        f"backend '{b}' runs a torch model: give a checkpoint or a model name, not {artifact}"
                    )
                rows += benchmark(artifact, shape, b, p, **kw)
    else:
        net = _load_model(artifact, None)
        shape = _csv(input_size, int) if input_size else input_shape(net)
        backends = _csv(backend) if backend else ["torch-eager", "onnxruntime-cpu"]
        pairs = [(b, p) for b in backends for p in (precisions or ["fp32"])]
        rows = bench_model(net, shape, pairs, macs=count_macs(net, shape), **kw)
    _print_bench(f"bench: {artifact} on {dev}", rows)
    meta = {"artifact": artifact, "input_shape": shape, "roofline": rf.summary() if rf else None, "env": collect_env()}
    if json_file:
        write_json(json_file, {**meta, "results": rows})
    if out_dir:
        paths = write_results(rows, out_dir, meta, f"effvision bench: {artifact}")
        out.print("wrote " + ", ".join(str(p) for p in paths.values()))


# ----------------------------------------------------------------------------- studies
def _budgets(value: str) -> list:
    """'0.1,0.3' are fractions, '500' a count of samples."""
    from . import yamlio

    try:
        items = [yamlio.load(v) for v in _csv(value)]
    except yamlio.YAMLError:
        items = []
    if not items or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in items):
        raise EffvisionError(f"--budgets {value}: give fractions in (0, 1] or sample counts, comma-separated")
    return items


@study_app.command("selection")
def study_selection(
    recipe: str = typer.Argument(
        ..., help="A recipe with a train stage (and optionally a select stage for the proxy settings)."
    ),
    methods: str = typer.Option(
        "random,el2n,forgetting,kcenter,gradient_clusters", help="Comma list of selectors (random is always added)."
    ),
    budgets: str = typer.Option(
        "0.1,0.3,0.5", help="Comma list of fractions of the training split (or sample counts)."
    ),
    seeds: int = typer.Option(3, min=1, help="Seeds per (selector, budget); the table gives mean ± std."),
    set_: List[str] = typer.Option([], "--set", help=SET_HELP),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Results folder (default runs/study-selection-<recipe name>); a rerun resumes."
    ),
):
    """Accuracy against budget for each selector: trains on every subset with the recipe's train
    stage and on all data; writes results.json, selection.md and selection.png."""
    from .device import resolve_device
    from .recipe import load_recipe
    from .studies.selection import selection_study, to_markdown

    r = load_recipe(recipe, set_)
    out_dir = out_dir or Path("runs") / f"study-selection-{r.name}"
    names, budget_list = _csv(methods), _budgets(budgets)
    summary = selection_study(r, names, budget_list, seeds, out_dir, resolve_device(r.device))
    out.print(to_markdown(summary, ["random", *[m for m in names if m != "random"]], budget_list, seeds))
    out.print(f"wrote {out_dir / 'results.json'}, {out_dir / 'selection.md'}, {out_dir / 'selection.png'}")


@study_app.command("speed")
def study_speed(
    recipe: str = typer.Argument(
        ..., help="A recipe with a train stage and a preset to compare against (its `presets:`)."
    ),
    target_accuracy: float = typer.Option(..., help="Validation top-1 to reach, in (0, 1]."),
    preset: str = typer.Option("plain", help="The recipe's preset to compare against."),
    seeds: int = typer.Option(2, min=1, help="Seeds of each; for every seed the recipe runs first, then the preset."),
    cap: float = typer.Option(
        4.0, help="Stop a preset run at this multiple of the recipe's time (reported as not reached)."
    ),
    set_: List[str] = typer.Option([], "--set", help=SET_HELP),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Results folder (default runs/study-speed-<recipe name>); a rerun resumes."
    ),
):
    """Seconds of training to the target for the recipe and its preset, side by side in one run;
    writes results.json and speed.md with mean, spread and the speed-up."""
    from .studies.speed import speed_study, to_markdown

    out_dir = out_dir or Path("runs") / f"study-speed-{Path(recipe).stem}"
    summary = speed_study(recipe, set_, preset, target_accuracy, seeds, cap, out_dir)
    out.print(to_markdown(summary))
    out.print(f"wrote {out_dir / 'results.json'}, {out_dir / 'speed.md'}")


@study_app.command("data-compression")
def study_data_compression(
    recipe: str = typer.Argument(
        ..., help="A recipe with a train stage whose dataset has train/val splits under data.root."
    ),
    levels: str = typer.Option(
        "original,quality=95,quality=75,quality=50,quality=30,size=24+quality=95,size=16+quality=95",
        help="Comma list of levels: original, or key=value joined by + "
        "(quality, size, format, stride, keyframes, short_side, crf, voxel, points).",
    ),
    seeds: int = typer.Option(1, min=1, help="Training seeds per level."),
    set_: List[str] = typer.Option([], "--set", help=SET_HELP),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Results and compressed copies (default runs/study-data-compression-<recipe name>)."
    ),
):
    """Bytes, decode throughput and accuracy per compression level of the training split (the
    model trains on the compressed copy and is evaluated on the original validation split)."""
    from .device import resolve_device
    from .recipe import load_recipe
    from .studies.data_compression import data_compression_study, to_markdown

    r = load_recipe(recipe, set_)
    out_dir = out_dir or Path("runs") / f"study-data-compression-{r.name}"
    summary = data_compression_study(r, _csv(levels), seeds, out_dir, resolve_device(r.device))
    out.print(to_markdown(summary))
    out.print(
        f"wrote {out_dir / 'results.json'}, {out_dir / 'data_compression.md'}, {out_dir / 'data_compression.png'}"
    )


@study_app.command("calibration")
def study_calibration(
    run_dir: Path = typer.Argument(..., help="A finished run folder (its last model and fp32 ONNX file are used)."),
    selectors: str = typer.Option("random,kcenter", help="Comma list of selectors choosing the calibration samples."),
    n: int = typer.Option(256, min=1, help="Calibration samples."),
    seeds: int = typer.Option(3, min=1, help="Seeds per selector."),
    method: Optional[str] = typer.Option(
        None, help="minmax, percentile or entropy (default: the run's quantize stage's)."
    ),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="Results folder (default <run>/study-calibration)."),
):
    """int8 accuracy (ONNX Runtime) when each selector picks the calibration set, over seeds."""
    from .device import resolve_device
    from .studies.calibration import calibration_study, to_markdown

    out_dir = out_dir or run_dir / "study-calibration"
    summary = calibration_study(run_dir, _csv(selectors), n, seeds, out_dir, resolve_device("auto"), method)
    out.print(to_markdown(summary))
    out.print(f"wrote {out_dir / 'results.json'}, {out_dir / 'calibration.md'}")


# ----------------------------------------------------------------------------- entry point
_ARGV: list[str] = []  # this invocation's arguments, for `train --nproc` to relaunch under torchrun


def main(argv: list[str] | None = None) -> int:
    global _ARGV
    argv = list(sys.argv[1:] if argv is None else argv)
    _ARGV = list(argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub at run time
    try:
        # typer handles usage errors (exit 2) and --help itself and ends with SystemExit
        app(args=argv, prog_name="effvision")
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        print(
            "effvision: interrupted; completed stages are kept, run the same command again to resume", file=sys.stderr
        )
        return 130
    except EffvisionError as exc:
        if debug:
            traceback.print_exc()
        print(f"effvision: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001  (an unexpected failure still gets one line unless --debug)
        if debug:
            raise
        first = (str(exc).splitlines() or [""])[0]
        print(
            f"effvision: internal error: {type(exc).__name__}: {first} (run again with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
