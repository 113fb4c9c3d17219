"""The pipeline commands: `effvision compress`, `train` and `report` (a recipe run into a run folder)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..errors import EffvisionError
from .common import ARGV, out, set_option, table


def _print_report(report: dict, run_dir: Path) -> None:
    from ..report_text import headline_lines, table_rows

    head, rows = table_rows(report)
    table(f"effvision: {report['recipe']}", head, rows)
    for line in headline_lines(report):
        if line:
            out.print(line.replace("**", ""), markup=False)
    out.print(f"report: {run_dir / 'report.md'}")


def _run(recipe_path: str, sets: list[str], run_dir: Optional[Path], only: set[str] | None) -> None:
    from ..pipeline import run_pipeline
    from ..stages import load_recipe

    recipe = load_recipe(recipe_path, sets)
    run_dir = run_dir or Path("runs") / recipe.name
    report = run_pipeline(recipe, run_dir, only_types=only)
    _print_report(report, run_dir)
    target = report.get("target") or {}
    if target.get("met") is False:  # the report is written; a script must still see the miss
        raise EffvisionError(f"target not met; see {run_dir / 'report.md'}")


def compress(
    recipe: str = typer.Argument(..., help="Recipe YAML (or a name under compress/)."),
    set_: List[str] = set_option(),
    run_dir: Optional[Path] = typer.Option(
        None, help="Run folder (default runs/<recipe name>); an existing one resumes."
    ),
):
    """Run a whole recipe: train, prune, distill, export, quantize, bench; writes report.json/md/html."""
    _run(recipe, set_, run_dir, None)


def train(
    recipe: str = typer.Argument(..., help="Recipe YAML (or a name under compress/)."),
    set_: List[str] = set_option(),
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
    from ..stages import load_recipe
    from ..studies.time_to_accuracy import check_target, run_seeds
    from ..train import distributed

    check_target(target_accuracy)
    recipe = load_recipe(recipe, set_, preset)
    if not distributed.launched_by_torchrun():
        distributed.check_nproc(nproc, recipe.device)
    if nproc > 1 and not distributed.launched_by_torchrun():
        raise typer.Exit(distributed.launch(nproc, _without_option(ARGV, "--nproc")))
    distributed.init()
    run_dir = run_dir or Path("runs") / (recipe.name + (f"-{preset}" if preset else ""))
    if target_accuracy is None and seeds == 1 and time_limit is None:
        from ..pipeline import run_pipeline

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
    table(
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


def report(run_dir: Path = typer.Argument(..., help="A run folder, e.g. runs/demo.")):
    """Rebuild report.json/md/html of a run folder and print its table (refused while a run is
    writing the folder)."""
    from ..report import write_report
    from ..runlock import run_lock

    if not run_dir.is_dir():
        raise EffvisionError(f"run folder not found: {run_dir}")
    with run_lock(run_dir):
        _print_report(write_report(run_dir), run_dir)


COMMANDS = [compress, train, report]  # registered on the root app, in this order
