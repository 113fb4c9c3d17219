"""Clips per second of the video loader: sampled decoding (a frame sampler, decode-time resize,
decord with the PyAV fallback) against the naive way, decoding every frame at full size with
PyAV and subsampling afterwards. Both run over the same files, alternating round by round, so
the ratio is measured side by side (BENCHMARKS.md).

    python -m effvision.data.video_loader_bench ../shared/testdata/videos --frames 8 --size 112
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

from .frame_samplers import get_sampler, segment_indices
from .video_io import is_video


def decode_all_then_subsample(path: Path, frames: int, size: int) -> np.ndarray:
    """Every frame decoded and converted to full-size RGB, then TSN's centre frames kept and
    resized (short side `size`): what a loader without random access or decode-time resize does."""
    import av
    from torchvision.transforms.v2 import functional as TF

    with av.open(str(path)) as container:
        every = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    keep = segment_indices(len(every), frames, False, np.random.default_rng(0))
    clip = torch.from_numpy(np.stack([every[i] for i in keep])).permute(0, 3, 1, 2)
    return TF.resize(clip, size, antialias=True).permute(0, 2, 3, 1).numpy()


def measure(files: list[Path], frames: int, size: int, rounds: int, sampler: str = "tsn") -> dict:
    s = get_sampler(sampler, frames)
    methods = {f"{sampler} sampler, decode-time resize": lambda p: s.clip(p, size).frames,
               "PyAV decode every frame, then subsample": lambda p: decode_all_then_subsample(p, frames, size)}
    for fn in methods.values():  # warm-up: imports, codec initialisation, file cache
        fn(files[0])
    rates: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            start = time.perf_counter()
            for p in files:
                out = fn(p)
                assert out.shape[0] == frames and min(out.shape[1:3]) == size
            rates[name].append(len(files) / (time.perf_counter() - start))
    medians = {name: statistics.median(r) for name, r in rates.items()}
    fast, slow = medians.values()
    return {"files": len(files), "frames": frames, "size": size, "rounds": rounds, "clips_per_s_median": medians,
            "clips_per_s_all": rates, "speedup": fast / slow}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m effvision.data.video_loader_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sampler", default="tsn")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the loader's view: one decoding process, no intra-op help
    files = sorted(p for p in args.folder.rglob("*") if p.is_file() and is_video(p.name))
    if not files:
        print(f"effvision: error: no video files under {args.folder}", file=sys.stderr)
        return 1
    result = measure(files, args.frames, args.size, args.rounds, args.sampler)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
