"""Images per second of an image recipe's training data, per-sample DataLoader (tensor_data:
false, the path every recipe but the speed recipe took before) against batched augmentation (the
default now), alternating round by round: the loader alone, with the split of its time, and one
training epoch of the recipe's first training stage (its model freshly initialised), so the
figure is what training runs at (BENCHMARKS.md).

    python -m effvision.studies.image_loader_bench compress/cifar10.yaml --set data.root=../shared/datasets
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

WAYS = {"per-sample DataLoader": False, "batched": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", type=Path)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="recipe override, a.b=value")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from .. import stages  # noqa: F401  (registers the stage types a recipe names)
    from ..data import load_dataset
    from ..data.tensor_batches import base_and_indices
    from ..data.timing import NO_SPLIT, TimeSplit, format_shares, timed_pass
    from ..models import create_model
    from ..recipe import load_recipe
    from ..train import fit
    from ..train.parts import train_batches

    recipe = load_recipe(args.recipe, args.sets)
    stage = next(s for s in recipe.stages if s.type == "train")
    data = load_dataset(recipe.data, recipe.seed)
    base, _ = base_and_indices(data.train)
    cpu = torch.device("cpu")
    settings = {name: stage.model_copy(update={"epochs": 1, "tensor_data": t}) for name, t in WAYS.items()}
    loaders = {name: train_batches(data, s, cpu, 0, 0, 1) for name, s in settings.items()}
    splits = {name: TimeSplit() for name in WAYS}
    loader_rates, train_rates = {n: [] for n in WAYS}, {n: [] for n in WAYS}
    for r in range(args.rounds):
        for name in WAYS:
            loader = loaders[name]
            batched = hasattr(loader, "split")
            base.split = NO_SPLIT if batched else splits[name]
            if batched:
                loader.split = splits[name]
            seconds, n = timed_pass(loader, splits[name])
            loader_rates[name].append(n / seconds)
            base.split = NO_SPLIT
            m = recipe.model
            model = create_model(m.name, data.num_classes, input_size=data.input_size, **m.kwargs)
            res = fit(model, data, settings[name], cpu, seed=r, label=name)
            train_rates[name].append(res.samples / res.train_s)
            print(
                f"round {r + 1} {name}: loader {loader_rates[name][-1]:.0f} images/s, "
                f"training {train_rates[name][-1]:.0f} images/s",
                flush=True,
            )
    result = {
        "recipe": str(args.recipe),
        "images": len(data.train),
        "batch_size": stage.batch_size or data.config.batch_size,
        "loader_images_per_s": {n: statistics.median(v) for n, v in loader_rates.items()},
        "train_images_per_s": {n: statistics.median(v) for n, v in train_rates.items()},
        "rounds": {"loader": loader_rates, "train": train_rates},
        "split": {n: sp.shares() for n, sp in splits.items()},
    }
    print("| way | loader images/s | training images/s | loader time split |\n|---|---|---|---|")
    for n in WAYS:
        split = format_shares(result["split"][n])
        print(f"| {n} | {result['loader_images_per_s'][n]:.0f} | {result['train_images_per_s'][n]:.0f} | {split} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
