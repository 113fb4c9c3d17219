"""Clips per second of the video loader: sampled decoding (a frame sampler, decode-time resize,
decord with the PyAV fallback) against the naive way, decoding every frame at full size with
PyAV and subsampling afterwards. Both run over the same files, alternating round by round, so
the ratio is measured side by side (BENCHMARKS.md).

With --memory N it measures memory instead: N clip reads through VideoDataset.read (what a
training epoch calls: sampler, decoder, PyAV fallback, skipping) per backend and clip set, each in a
fresh process, sampling the resident set size every --every reads; the growth after the first
--warmup reads is what a long epoch would accumulate (decord is reported to leak; PyAV 18.1 did:
video_io._decoded).

    python -m effvision.studies.video_loader_bench ../shared/testdata/videos --frames 8 --size 112
    python -m effvision.studies.video_loader_bench ../shared/testdata/videos --memory 2000 --dataset synthetic-motion
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from ..data.timing import NO_SPLIT, TimeSplit
from ..data.video.datasets import VideoDataset
from ..data.video.frame_samplers import get_sampler, segment_indices
from ..data.video.io import is_video, scan_video
from ..device import resident_bytes


def decode_all_then_subsample(path: Path, frames: int, size: int, split=NO_SPLIT) -> tuple[np.ndarray, list[int]]:
    """Every frame decoded and converted to full-size RGB, then TSN's centre frames kept and
    resized (short side `size`): what a loader without random access or decode-time resize does."""
    import av
    from torchvision.transforms.v2 import functional as TF

    with split("read"):
        container = av.open(str(path))
    with container:
        with split("decode"):
            every = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    with split("sample"):
        keep = segment_indices(len(every), frames, False, np.random.default_rng(0))
        clip = torch.from_numpy(np.stack([every[i] for i in keep])).permute(0, 3, 1, 2)
        return TF.resize(clip, size, antialias=True).permute(0, 2, 3, 1).numpy(), keep


def measure(files: list[Path], frames: int, size: int, rounds: int, sampler: str = "tsn") -> dict:
    """Both ways over the same files, alternating round by round; the sampled way reads through
    each file's scan (VideoInfo, as VideoDataset keeps it), which is timed once, apart."""
    s = get_sampler(sampler, frames)
    start = time.perf_counter()
    infos = {p: scan_video(p) for p in files}
    scan_s = time.perf_counter() - start
    names = (f"{sampler} sampler, decode-time resize, file scanned once", "PyAV decode every frame, then subsample")
    splits = {name: TimeSplit() for name in names}
    decoded = {name: [] for name in names}
    mismatched: set[str] = set()

    def sampled(p: Path, split) -> np.ndarray:
        s.split = split
        c = s.clip(p, size, info=infos[p])
        decoded[names[0]].append(c.decoded)
        if sampler == "tsn" and c.indices != segment_indices(infos[p].frames, frames, False, np.random.default_rng(0)):
            mismatched.add(p.name)
        return c.frames

    def everything(p: Path, split) -> np.ndarray:
        out, keep = decode_all_then_subsample(p, frames, size, split)
        decoded[names[1]].append(infos[p].frames)
        if sampler == "tsn" and keep != segment_indices(infos[p].frames, frames, False, np.random.default_rng(0)):
            mismatched.add(p.name)  # the file decodes to another frame count than its scan said
        return out

    methods = dict(zip(names, (sampled, everything), strict=True))
    for fn in methods.values():  # warm-up: imports, codec initialisation, file cache
        fn(files[0], NO_SPLIT)
    for name in names:
        decoded[name].clear()
    rates: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name, fn in methods.items():
            start = time.perf_counter()
            for p in files:
                out = fn(p, splits[name])
                assert out.shape[0] == frames and min(out.shape[1:3]) == size
            rates[name].append(len(files) / (time.perf_counter() - start))
    s.split = NO_SPLIT
    medians = {name: statistics.median(r) for name, r in rates.items()}
    fast, slow = medians.values()
    return {
        "files": len(files),
        "frames": frames,
        "size": size,
        "rounds": rounds,
        "scan_s": scan_s,
        "clips_per_s_median": medians,
        "clips_per_s_all": rates,
        "decoded_frames_per_clip": {name: statistics.mean(d) for name, d in decoded.items()},
        "split": {name: sp.shares() for name, sp in splits.items()},
        "frames_differ": sorted(mismatched),
        "speedup": fast / slow,
    }


def rss_mib() -> float:
    return resident_bytes() / 2**20


def libc_function(name: str):
    """A function of the C library (glibc's malloc_trim, mallinfo2 ...), or None where it has none."""
    import ctypes
    import ctypes.util

    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name, None)
    except OSError:
        return None


def release_free_heap() -> None:
    """Hand the memory malloc holds free back to the system (glibc's malloc_trim; elsewhere a
    no-op): freed heap that stays resident would otherwise absorb new allocations, hiding growth."""
    trim = libc_function("malloc_trim")
    if trim is not None:
        trim(0)


def rss_over_reads(dataset: VideoDataset, reads: int, every: int = 50, warmup: int = 100, seed: int = 0) -> dict:
    """Read `reads` clips through dataset.read, cycling over its samples, sampling RSS every
    `every` reads (and at read `warmup` and the last). growth_mib: RSS at the last read minus RSS
    at read `warmup` (imports, codec set-up and allocator pools settle in the first reads).
    steady_growth_mib: the median growth of the sampling windows after warm-up, times their
    number. A leak grows every window; an allocator pool that grows once (a step of 5-7 MiB seen
    in one window of a CI run, flat before and after) moves growth_mib but not this."""
    if not 0 < warmup < reads:
        raise ValueError(f"warmup ({warmup}) must be between 0 and reads ({reads})")
    torch.manual_seed(seed)  # training draws clip positions from torch's generator
    release_free_heap()  # growth must show, not fill memory an earlier job freed
    marks = {warmup, reads, *range(every, reads + 1, every)}
    series = [(0, rss_mib())]
    start = time.perf_counter()
    for n in range(1, reads + 1):
        dataset.read((n - 1) % len(dataset))
        if n in marks:
            series.append((n, rss_mib()))
    seconds = time.perf_counter() - start
    at = dict(series)
    after = [(n, r) for n, r in series if n >= warmup]
    steps = [b - a for (_, a), (_, b) in itertools.pairwise(after)]
    return {
        "reads": reads,
        "every": every,
        "warmup": warmup,
        "files": len(dataset),
        "skipped": len(dataset.report.bad),
        "clips_per_s": reads / seconds,
        "rss_start_mib": at[0],
        "rss_at_warmup_mib": at[warmup],
        "rss_end_mib": at[reads],
        "rss_max_mib": max(r for _, r in series),
        "growth_mib": at[reads] - at[warmup],
        "steady_growth_mib": statistics.median(steps) * len(steps),
        "rss_mib": series,
    }


def memory_dataset(clips: str, backend: str, frames: int, size: int, sampler: str) -> VideoDataset:
    """A training-mode VideoDataset: every video under a folder (one label, `size` px, `sampler`),
    or a dataset card's training split (its own decode size; generated data is written first)."""
    if Path(clips).is_dir():
        files = sorted(p for p in Path(clips).rglob("*") if p.is_file() and is_video(p.name))
        return VideoDataset(
            [(p, 0) for p in files], ["video"], get_sampler(sampler, frames), size, train=True, backend=backend
        )
    from ..data import load_dataset, root_dataset
    from ..recipe import DataConfig

    train = root_dataset(load_dataset(DataConfig(name=clips, num_frames=frames, sampler=sampler)).train)
    return VideoDataset(train.samples, train.classes, train.sampler, train.short_side, train=True, backend=backend)


def _memory_job(
    clips: str, backend: str, frames: int, size: int, sampler: str, reads: int, every: int, warmup: int
) -> dict:
    torch.set_num_threads(1)
    dataset = memory_dataset(clips, backend, frames, size, sampler)
    return {"clips": clips, "backend": backend, "sampler": sampler, **rss_over_reads(dataset, reads, every, warmup)}


def measure_memory(
    clip_sets: list[str],
    backends: list[str],
    frames: int,
    size: int,
    sampler: str,
    reads: int,
    every: int = 50,
    warmup: int = 100,
) -> list[dict]:
    """rss_over_reads for every clip set and backend, each in a fresh process (one run's memory
    must not show in the next one's figures)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    rows = []
    for clips in clip_sets:
        for backend in backends:
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
                row = pool.submit(_memory_job, clips, backend, frames, size, sampler, reads, every, warmup).result()
            print(
                f"| {clips} | {backend} | {row['files']} ({row['skipped']} skipped) | {row['clips_per_s']:.1f} | "
                f"{row['rss_at_warmup_mib']:.1f} | {row['rss_end_mib']:.1f} | {row['growth_mib']:+.1f} |",
                flush=True,
            )
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m effvision.studies.video_loader_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("folder", type=Path)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--size", type=int, default=112)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sampler", default="tsn")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    parser.add_argument("--memory", type=int, metavar="N", help="measure RSS over N clip reads instead of speed")
    parser.add_argument("--every", type=int, default=50, help="--memory: sample RSS every this many reads")
    parser.add_argument("--warmup", type=int, default=100, help="--memory: growth is counted after this many reads")
    parser.add_argument("--backends", default="decord,pyav", help="--memory: comma-separated (auto, decord, pyav)")
    parser.add_argument("--dataset", help="--memory: also this dataset card's training split (e.g. synthetic-motion)")
    parser.add_argument(
        "--max-growth",
        type=float,
        default=50.0,
        metavar="MB",
        help="--memory: exit 1 when any run grows by more than this (10^6 bytes)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the loader's view: one decoding process, no intra-op help
    files = sorted(p for p in args.folder.rglob("*") if p.is_file() and is_video(p.name))
    if not files:
        print(f"effvision: error: no video files under {args.folder}", file=sys.stderr)
        return 1
    if args.memory:
        print(
            "| clips | backend | files | clips/s | RSS MiB at read %d | at read %d | growth MiB "
            "|\n|---|---|---|---|---|---|---|" % (args.warmup, args.memory),
            flush=True,
        )
        rows = measure_memory(
            [str(args.folder)] + ([args.dataset] if args.dataset else []),
            args.backends.split(","),
            args.frames,
            args.size,
            args.sampler,
            args.memory,
            args.every,
            args.warmup,
        )
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
        worst = max(r["growth_mib"] for r in rows) * 2**20 / 1e6
        if worst > args.max_growth:
            print(
                f"effvision: error: RSS grew by {worst:.1f} MB over {args.memory} reads (limit {args.max_growth} MB)",
                file=sys.stderr,
            )
            return 1
        return 0
    result = measure(files, args.frames, args.size, args.rounds, args.sampler)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
