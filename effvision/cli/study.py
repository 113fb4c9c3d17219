"""`effvision study ...`: sweeps that write a table (results.json, .md) and a plot."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..errors import EffvisionError
from .common import csv, out, set_option

app = typer.Typer(help="Studies: sweeps that write a table (results.json, .md) and a plot.", no_args_is_help=True)


def _budgets(value: str) -> list:
    """'0.1,0.3' are fractions, '500' a count of samples."""
    from .. import yamlio

    try:
        items = [yamlio.load(v) for v in csv(value)]
    except yamlio.YAMLError:
        items = []
    if not items or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in items):
        raise EffvisionError(f"--budgets {value}: give fractions in (0, 1] or sample counts, comma-separated")
    return items


@app.command("selection")
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
    set_: List[str] = set_option(),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Results folder (default runs/study-selection-<recipe name>); a rerun resumes."
    ),
):
    """Accuracy against budget for each selector: trains on every subset with the recipe's train
    stage and on all data; writes results.json, selection.md and selection.png."""
    from ..device import resolve_device
    from ..stages import load_recipe
    from ..studies.selection import selection_study, to_markdown

    r = load_recipe(recipe, set_)
    out_dir = out_dir or Path("runs") / f"study-selection-{r.name}"
    names, budget_list = csv(methods), _budgets(budgets)
    summary = selection_study(r, names, budget_list, seeds, out_dir, resolve_device(r.device))
    out.print(to_markdown(summary, ["random", *[m for m in names if m != "random"]], budget_list, seeds))
    out.print(f"wrote {out_dir / 'results.json'}, {out_dir / 'selection.md'}, {out_dir / 'selection.png'}")


@app.command("speed")
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
    set_: List[str] = set_option(),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Results folder (default runs/study-speed-<recipe name>); a rerun resumes."
    ),
):
    """Seconds of training to the target for the recipe and its preset, side by side in one run;
    writes results.json and speed.md with mean, spread and the speed-up."""
    from ..studies.speed import speed_study, to_markdown

    out_dir = out_dir or Path("runs") / f"study-speed-{Path(recipe).stem}"
    summary = speed_study(recipe, set_, preset, target_accuracy, seeds, cap, out_dir)
    out.print(to_markdown(summary))
    out.print(f"wrote {out_dir / 'results.json'}, {out_dir / 'speed.md'}")


@app.command("data-compression")
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
    set_: List[str] = set_option(),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Results and compressed copies (default runs/study-data-compression-<recipe name>)."
    ),
):
    """Bytes, decode throughput and accuracy per compression level of the training split (the
    model trains on the compressed copy and is evaluated on the original validation split)."""
    from ..device import resolve_device
    from ..stages import load_recipe
    from ..studies.data_compression import data_compression_study, to_markdown

    r = load_recipe(recipe, set_)
    out_dir = out_dir or Path("runs") / f"study-data-compression-{r.name}"
    summary = data_compression_study(r, csv(levels), seeds, out_dir, resolve_device(r.device))
    out.print(to_markdown(summary))
    out.print(
        f"wrote {out_dir / 'results.json'}, {out_dir / 'data_compression.md'}, {out_dir / 'data_compression.png'}"
    )


@app.command("calibration")
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
    from ..device import resolve_device
    from ..studies.calibration import calibration_study, to_markdown

    out_dir = out_dir or run_dir / "study-calibration"
    summary = calibration_study(run_dir, csv(selectors), n, seeds, out_dir, resolve_device("auto"), method)
    out.print(to_markdown(summary))
    out.print(f"wrote {out_dir / 'results.json'}, {out_dir / 'calibration.md'}")


@app.command("pareto")
def study_pareto(
    recipe: str = typer.Argument(..., help="A recipe whose prune stage aims at a target (a `target:` block)."),
    targets: str = typer.Option("1.5,2,3", help="Comma list of speed-ups over the reference, each > 1."),
    uniform: bool = typer.Option(
        True, "--uniform/--no-uniform", help="Also run uniform-ratio pruning at each matched measured latency."
    ),
    set_: List[str] = set_option(),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Results and run folders (default runs/study-pareto-<recipe name>); a rerun resumes."
    ),
):
    """Top-1 against measured latency and size: the recipe at each target, and uniform pruning at
    the same measured latency; writes results.json, pareto.md, pareto.png and pareto-size.png."""
    from ..studies.pareto import pareto_study, to_markdown

    out_dir = out_dir or Path("runs") / f"study-pareto-{Path(recipe).stem}"
    summary = pareto_study(recipe, set_, _speedups(targets), out_dir, uniform)
    out.print(to_markdown(summary))
    out.print(f"wrote {out_dir / 'results.json'}, {out_dir / 'pareto.md'}, {out_dir / 'pareto.png'}")


@app.command("front")
def study_front(
    recipe: str = typer.Argument(..., help="A recipe with a `target:` block, a plan stage and a prune stage."),
    floors: str = typer.Option("0.005,0.01,0.02", help="Comma list of top-1 losses (absolute), each a run."),
    set_: List[str] = set_option(),
    out_dir: Optional[Path] = typer.Option(
        None, "--out", help="Results and run folders (default runs/study-front-<recipe name>); a rerun resumes."
    ),
):
    """The fastest file within each accuracy floor: the recipe once per floor (max_drop alone), every
    shipped file and the reference timed side by side; writes results.json and front.md."""
    from ..studies.front import front_study, to_markdown

    try:
        values = [float(v) for v in csv(floors)]
    except ValueError:
        raise EffvisionError(f"--floors {floors}: give top-1 losses, e.g. 0.005,0.01,0.02") from None
    out_dir = out_dir or Path("runs") / f"study-front-{Path(recipe).stem}"
    summary = front_study(recipe, set_, values, out_dir)
    out.print(to_markdown(summary))
    out.print(f"wrote {out_dir / 'results.json'}, {out_dir / 'front.md'}")


def _speedups(value: str) -> list[float]:
    try:
        return [float(v) for v in csv(value)]
    except ValueError:
        raise EffvisionError(f"--targets {value}: give speed-ups over the reference, each > 1 (e.g. 1.5,2,3)") from None
