"""Time-to-accuracy over seeds (DAWNBench's figure of merit): a recipe's training stages run once
per seed, each stopping when validation top-1 first reaches the target, and the seconds of
training it took (evaluation and compilation excluded, reported apart) summarised as mean and
spread. `effvision train --target-accuracy A --seeds N` and `effvision study speed` use it."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import EffvisionError
from ..recipe import Recipe


def check_target(target: Optional[float]) -> None:
    if target is not None and not 0 < target <= 1:
        raise EffvisionError(f"--target-accuracy {target}: a top-1 accuracy must be in (0, 1], e.g. 0.94")


def with_target(recipe: Recipe, seed: int, target: Optional[float], time_limit: Optional[float] = None) -> Recipe:
    """A copy of the recipe for one seed whose train stages stop at the target (and the time limit)."""
    out = recipe.model_copy(deep=True)
    out._source = recipe._source
    out.seed = seed
    trains = [s for s in out.stages if s.type == "train"]
    if (target or time_limit) and not trains:
        raise EffvisionError(
            f"{recipe._source}: --target-accuracy and --time-limit need a train stage; this recipe has none"
        )
    for s in trains:
        if target is not None:
            s.target_accuracy, s.stop_at_target = target, True
        if time_limit is not None:
            s.max_train_s = time_limit
    return out


def train_row(recipe: Recipe, run_dir: Path) -> dict:
    """Run the recipe's select and train stages into run_dir; the last train stage's figures."""
    from ..pipeline import run_pipeline

    report = run_pipeline(recipe, run_dir, only_types={"select", "train"})
    stage = [s for s in report["stages"] if s["type"] == "train"][-1]
    keys = (
        "time_to_accuracy_s",
        "epochs_to_accuracy",
        "accuracy",
        "accuracy_tta",
        "train_s",
        "eval_s",
        "compile_s",
        "stopped",
        "processes",
    )
    return {
        "seed": recipe.seed,
        "run_dir": str(run_dir),
        "target_accuracy": stage.get("target_accuracy"),
        **{k: stage.get(k) for k in keys},
    }


def summarise(rows: list[dict]) -> dict:
    """Mean and spread of seconds to target over the seeds that reached it."""
    import statistics

    times = [r["time_to_accuracy_s"] for r in rows if r["time_to_accuracy_s"] is not None]
    return {
        "seeds": len(rows),
        "reached": len(times),
        "mean_s": statistics.fmean(times) if times else None,
        "std_s": statistics.stdev(times) if len(times) > 1 else (0.0 if times else None),
        "min_s": min(times) if times else None,
        "max_s": max(times) if times else None,
    }


def run_seeds(
    recipe: Recipe, run_dir: Path, seeds: int, target: Optional[float], time_limit: Optional[float] = None
) -> dict:
    """Train once per seed (recipe.seed, +1, ...) into run_dir (one seed) or run_dir/seed-<s>."""
    from ..fileio import write_json
    from ..train import distributed

    check_target(target)
    rows = []
    for k in range(seeds):
        seeded = with_target(recipe, recipe.seed + k, target, time_limit)
        rows.append(train_row(seeded, run_dir if seeds == 1 else run_dir / f"seed-{seeded.seed}"))
        summary = {
            "recipe": recipe._source,
            "target_accuracy": target,
            "time_limit_s": time_limit,
            "seeds_planned": seeds,
            "rows": rows,
            **summarise(rows),
        }
        if distributed.rank() == 0:  # after every seed: a run stopped early keeps the seeds it finished
            write_json(Path(run_dir) / "time_to_accuracy.json", summary)
    return summary
