"""Dataset compression study: for each level (JPEG quality, resolution, frame stride, points per
cloud ...), a compressed copy of the training split, its bytes and decode throughput, and the
accuracy of the recipe's model trained on it and evaluated on the original validation split."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from ..data.cards import get_card
from ..data.compression import Levels, compress_dataset
from ..data.layouts import data_root, split_path
from ..errors import EffvisionError
from ..progress import log, track
from ..recipe import Recipe
from .common import Rows, markdown_table, mean_std, plot_curves

_KEYS = {
    "quality": ("quality", int),
    "size": ("max_size", int),
    "format": ("image_format", str),
    "stride": ("stride", int),
    "keyframes": ("keyframes", lambda v: v.lower() in ("1", "true", "yes")),
    "short_side": ("short_side", int),
    "crf": ("crf", int),
    "voxel": ("voxel_size", float),
    "points": ("num_points", int),
}


def parse_level(spec: str) -> Levels:
    """'quality=75', 'size=16+quality=95', 'stride=2+crf=28', 'points=256' (or 'original')."""
    lv = Levels()
    if spec == "original":
        return lv
    for part in spec.split("+"):
        key, _, value = part.partition("=")
        if key not in _KEYS or not value:
            raise EffvisionError(f"level '{spec}': '{part}' is not key=value with a key among {', '.join(_KEYS)}")
        field, cast = _KEYS[key]
        try:
            setattr(lv, field, cast(value))
        except ValueError:
            raise EffvisionError(f"level '{spec}': '{value}' is not a valid {key}") from None
    lv.check()
    return lv


def _link(src: Path, dst: Path) -> None:
    try:
        os.symlink(src.resolve(), dst)
    except OSError:  # no symlinks here: copy
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)


def data_compression_study(recipe: Recipe, levels: list[str], seeds: int, out_dir: Path, device: torch.device) -> dict:
    from ..data import load_dataset
    from ..models import create_model
    from ..train.loop import fit

    train_cfg = next((s for s in recipe.stages if s.type == "train"), None)
    if train_cfg is None:
        raise EffvisionError(f"{recipe._source}: the study trains with the recipe's train stage; the recipe has none")
    parsed = {spec: parse_level(spec) for spec in levels}  # bad levels stop before any work
    card = get_card(recipe.data.name)
    root = data_root(card, recipe.data)
    train_src, val_src = split_path(root, card.train, ("train",)), split_path(root, card.val, ("val", "test"))
    out_dir = Path(out_dir)
    settings = {
        "recipe": recipe.model_dump(mode="json", exclude={"stages"}),
        "train": train_cfg.model_dump(mode="json"),
    }  # rows are keyed by level
    rows = Rows(out_dir, settings)
    for spec, lv in parsed.items():
        level_root = out_dir / "data" / spec.replace("=", "").replace("+", "_")
        if spec == "original":
            level_root = root
        else:

            def compress(lv=lv, level_root=level_root):
                if level_root.exists():
                    shutil.rmtree(level_root)  # a half-written copy from a killed run
                level_root.mkdir(parents=True)
                _link(val_src, level_root / val_src.name)
                stats = compress_dataset(train_src, level_root / train_src.name, lv, progress=track)
                return {
                    k: stats[k]
                    for k in (
                        "files",
                        "compressed",
                        "bytes_before",
                        "bytes_after",
                        "ratio",
                        "decode_per_s_before",
                        "decode_per_s_after",
                        "decode_unit",
                    )
                    if k in stats
                } | {"failed": len(stats["failed"])}

            rows.measure({"kind": "compress", "level": spec}, compress)
        cfg = recipe.data.model_copy(update={"root": str(level_root)})
        data = load_dataset(cfg, seed=recipe.seed)
        for seed in range(recipe.seed, recipe.seed + seeds):

            def train(seed=seed, data=data, spec=spec):
                torch.manual_seed(seed)
                m = recipe.model
                model = create_model(m.name, num_classes=data.num_classes, input_size=data.input_size, **m.kwargs)
                res = fit(model, data, train_cfg, device, seed=seed, label=f"{spec} seed {seed}")
                log(f"{spec} seed {seed}: top-1 {res.accuracy:.4f}")
                return {"accuracy": res.accuracy, "train_s": round(res.train_s, 3)}

            rows.measure({"kind": "train", "level": spec, "seed": seed}, train)
    summary = summarize(rows.rows, levels)
    rows.save(summary=summary)
    plot_summary(summary, out_dir / "data_compression.png", recipe.data.name)
    (out_dir / "data_compression.md").write_text(to_markdown(summary) + "\n")
    return summary


def plot_summary(summary: dict, path: Path, dataset: str) -> Path | None:
    levels = summary["levels"]
    pts = {spec: [(s["bytes_after"] / 2**20, *s["accuracy"])] for spec, s in levels.items() if s.get("bytes_after")}
    ref = ("original", levels["original"]["accuracy"][0]) if "original" in levels else None
    return plot_curves(
        path,
        pts,
        "training split (MiB)",
        "top-1 accuracy (mean ± std over seeds)",
        f"{dataset}: accuracy against bytes of the training split",
        reference=ref,
        logx=True,
        joined=False,
    )


def summarize(rows: list[dict], levels: list[str]) -> dict:
    out = {}
    for spec in levels:
        comp = next((r for r in rows if r["kind"] == "compress" and r["level"] == spec), None)
        accs = [r["accuracy"] for r in rows if r["kind"] == "train" and r["level"] == spec]
        out[spec] = {
            "accuracy": mean_std(accs),
            "seeds": len(accs),
            **({k: v for k, v in comp.items() if k not in ("kind", "level")} if comp else {}),
        }
    if "original" in out:  # the original's size and decode speed are the compressed runs' "before"
        first = next((v for v in out.values() if "bytes_before" in v), None)
        if first:
            out["original"].update(
                bytes_after=first["bytes_before"], ratio=1.0, decode_per_s_after=first.get("decode_per_s_before")
            )
    return {"levels": out}


def to_markdown(summary: dict) -> str:
    from ..report_text import fmt_bytes

    head = ["level", "training split", "of original", "decode/s (x original, same run)", "top-1 (mean ± std)"]
    rows = []
    for spec, s in summary["levels"].items():
        rows.append(
            [
                spec,
                fmt_bytes(s.get("bytes_after")),
                f"{s['ratio']:.1%}" if s.get("ratio") is not None else "-",
                (
                    f"{s['decode_per_s_after']:.0f} (x{s['decode_per_s_after'] / s['decode_per_s_before']:.2f})"
                    if s.get("decode_per_s_before")
                    else f"{s['decode_per_s_after']:.0f}"
                    if s.get("decode_per_s_after")
                    else "-"
                ),
                f"{s['accuracy'][0]:.4f} ± {s['accuracy'][1]:.4f} ({s['seeds']} seeds)",
            ]
        )
    return markdown_table(head, rows)
