"""Point-cloud loader speed (BENCHMARKS.md): samples per second of read -> normalise -> FPS to N
points (the `fps` sampler, open3d inside), and our farthest-point sampling — the torch loop
PointNet++ runs inside the network (centroids: fps) — against open3d's farthest_point_down_sample
on the same clouds, alternating round by round so the ratio is measured side by side (the
measurement that chose open3d for the data pipeline). With --dataset,
also the training loader of a dataset card: clouds drawn from its cache, FPS to N with a random
start, augmented and batched, as an epoch sees them.

    python -m effvision.studies.point_loader_bench ../shared/testdata/pointclouds --points 1024 \
        --dataset synthetic-shapes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..data.points.io import POINT_EXTS, guess_bin_width, read_points
from ..data.points.samplers import farthest_point_indices, normalize_unit_sphere
from ..data.timing import NO_SPLIT, TimeSplit, format_shares, timed_pass
from ..models.points import farthest_point_sample


def _width(path: Path) -> int:
    return (
        {"nuscenes": 5, "scannet": 6, "sunrgbd": 6}.get(path.name.split("__")[0], guess_bin_width(path))
        if path.suffix == ".bin"
        else 4
    )


def measure(files: list[Path], points: int, rounds: int) -> dict:
    clouds = {f: read_points(f, bin_width=_width(f)) for f in files}
    fps_rows = []
    for f, cloud in clouds.items():
        xyz = cloud[:, :3].astype(np.float64)
        batch = torch.from_numpy(np.ascontiguousarray(xyz.T, dtype=np.float32))[None]
        torch_s, open3d_s = [], []
        for _ in range(rounds):
            t = time.perf_counter()
            farthest_point_sample(batch, min(points, len(xyz)))
            torch_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            farthest_point_indices(xyz, points)
            open3d_s.append(time.perf_counter() - t)
        fps_rows.append(
            {
                "file": f.name,
                "points_in": len(cloud),
                "torch_ms": 1000 * statistics.median(torch_s),
                "open3d_ms": 1000 * statistics.median(open3d_s),
            }
        )
    loader, split = [], TimeSplit()
    for _ in range(rounds):
        t = time.perf_counter()
        for f in files:
            with split("read"):
                cloud = normalize_unit_sphere(read_points(f, bin_width=_width(f)))
            with split("sample"):
                cloud[farthest_point_indices(cloud[:, :3].astype(np.float64), points)]
        loader.append(len(files) / (time.perf_counter() - t))
    return {
        "points": points,
        "rounds": rounds,
        "files": len(files),
        "fps": fps_rows,
        "loader_samples_per_s": statistics.median(loader),
        "loader_rounds": loader,
        "loader_split": split.shares(),
    }


def cached_loader(dataset: str, points: int, rounds: int, batch_size: int = 32) -> dict:
    """Samples per second of full passes over a card's training data, three ways, alternating
    round by round: batched (the training default), per sample with the cached farthest-point
    orders (tensor_data: false), and per sample searching afresh on every draw (before the
    orders were cached). Each with the split of its time."""
    from ..data import load_dataset
    from ..data.tensor_batches import base_and_indices
    from ..recipe import DataConfig

    bundle = load_dataset(DataConfig(name=dataset, num_points=points, batch_size=batch_size))
    base, _ = base_and_indices(bundle.train)
    cached_orders = base.orders
    batched = bundle.batched_train_loader(batch_size, torch.device("cpu"))
    ways = {
        "batched (training default)": (batched, cached_orders),
        "per sample, cached FPS orders": (bundle.train_loader(batch_size), cached_orders),
        "per sample, FPS searched per draw (before)": (bundle.train_loader(batch_size), None),
    }
    rates = {name: [] for name in ways}
    splits = {name: TimeSplit() for name in ways}
    for _ in range(rounds):
        for name, (loader, orders) in ways.items():
            base.orders = orders
            base.split = NO_SPLIT if loader is batched else splits[name]
            batched.split = splits[name] if loader is batched else NO_SPLIT
            seconds, n = timed_pass(loader, splits[name])
            rates[name].append(n / seconds)
    base.orders, base.split, batched.split = cached_orders, NO_SPLIT, NO_SPLIT
    return {
        "dataset": dataset,
        "samples": len(bundle.train),
        "batch_size": batch_size,
        "samples_per_s": {name: statistics.median(r) for name, r in rates.items()},
        "rounds": rates,
        "split": {name: sp.shares() for name, sp in splits.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--points", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dataset", help="also time this dataset card's training loader (cached clouds)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    files = sorted(p for p in args.root.rglob("*") if p.is_file() and p.suffix.lower() in POINT_EXTS)
    if not files:
        print(f"no point-cloud files under {args.root}", file=sys.stderr)
        return 1
    result = measure(files, args.points, args.rounds)
    print("| file | points | ours: torch FPS (in-network) ms | open3d FPS ms |\n|---|---|---|---|")
    for r in result["fps"]:
        print(f"| {r['file'][:40]} | {r['points_in']} | {r['torch_ms']:.1f} | {r['open3d_ms']:.1f} |")
    cold = format_shares(result["loader_split"])
    print(f"cold (read, normalise, FPS to {args.points}): {result['loader_samples_per_s']:.1f} samples/s ({cold})")
    if args.dataset:
        result["cached"] = cached_loader(args.dataset, args.points, args.rounds)
        c = result["cached"]
        print(f"{args.dataset} training data (cache, FPS to {args.points}, augment, batch {c['batch_size']}):")
        print("| way | samples/s (median) | time split |\n|---|---|---|")
        for name, rate in c["samples_per_s"].items():
            split = format_shares(c["split"][name])
            print(f"| {name} | {rate:.1f} | {split} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
