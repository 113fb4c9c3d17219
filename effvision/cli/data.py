"""`effvision data ...`: inspect dataset files, write compressed copies, prepare public datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ..errors import EffvisionError
from .common import out, table

app = typer.Typer(
    help="Datasets: inspect files, write compressed copies, prepare public datasets.", no_args_is_help=True
)


@app.command("inspect")
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
    from ..data.inspect import inspect_path
    from ..progress import track

    results = inspect_path(path, progress=track, bin_width=bin_width)
    if as_json:
        print(json.dumps(results, indent=2))
        return
    bad = [r for r in results if not r["ok"]]
    shown = bad[:50] if len(results) > 50 else results
    table(
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


@app.command("compress")
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
    from ..data.compression import Levels, compress_dataset
    from ..fileio import write_json
    from ..progress import track
    from ..report_text import fmt_bytes

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
    table(f"{src} -> {dst}", ["", "value"], rows)
    if json_file:
        write_json(json_file, stats)


PREPARABLE = ("cifar10",)


@app.command("prepare")
def data_prepare(
    dataset: str = typer.Argument(..., help="The dataset to prepare: cifar10."),
    dest: Path = typer.Argument(..., help="The folder to write into; pass it as data.root (--set data.root=DIR)."),
    archive: Optional[Path] = typer.Option(
        None,
        "--from",
        help="An archive you already have (cifar-10-python.tar.gz, or its extracted folder); "
        "without it the dataset is downloaded with torchvision.",
    ),
    quality: int = typer.Option(95, min=1, max=100, help="JPEG quality of the written images."),
):
    """Write a public dataset in the layout its card reads: for cifar10, DIR/cifar10-jpeg-train.zip
    and DIR/cifar10-jpeg-test.zip (ImageFolder zips), from torchvision's archive."""
    from ..data.images.prepare_cifar10 import prepare_cifar10
    from ..report_text import fmt_bytes

    if dataset not in PREPARABLE:
        raise EffvisionError(f"cannot prepare '{dataset}' (choices: {', '.join(PREPARABLE)})")
    summary = prepare_cifar10(dest, archive, quality=quality)
    for f in summary["files"]:
        out.print(f"wrote {f['path']}: {f['images']} {f['split']} images, {fmt_bytes(f['bytes'])}")
    out.print(f"use it with: --set data.root={dest}")


def _details(r: dict) -> str:
    if r.get("frames") is not None:
        return f"{r['frames']} frames, {r['fps']:g} fps, {r['backend']}"
    if r.get("points") is not None:
        what = f"mesh: {r['points']} vertices, {r['faces']} faces" if r.get("mesh") else f"{r['points']} points"
        return f"{what}, {r['channels']} channels" + (
            f", read as {r['bin_width']} floats per record" if r.get("bin_width") else ""
        )
    return ""
