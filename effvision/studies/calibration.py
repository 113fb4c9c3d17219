"""Calibration-set study: int8 accuracy of a run's model when its calibration samples are chosen
by different selectors (e.g. k-center against random), over seeds. The quantized files are run in
ONNX Runtime, like the quantize stage measures them."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ..compression.selection import calibration_indices
from ..data.selectors import CalibrationConfig, known_selector
from ..deploy import evaluate
from ..errors import EffvisionError
from ..fileio import read_json
from ..progress import log
from ..run_data import recipe_data
from ..runtimes.onnx_int8 import quantize_onnx
from ..stages import load_recipe
from .common import Rows, markdown_table, mean_std


def _run_artifacts(run_dir: Path) -> tuple[Path, Path | None, str]:
    """The run's last torch model, its last fp32 ONNX file (if any) and its calibration method."""
    stages = sorted(
        (d for d in (run_dir / "stages").glob("*") if (d / "metrics.json").is_file() and not d.name.startswith("0-")),
        key=lambda d: int(d.name.split("-", 1)[0]),
    )
    records = [read_json(d / "metrics.json") for d in stages]
    models = [r["artifacts"]["model"] for r in records if "model" in r["artifacts"]]
    if not models:
        raise EffvisionError(f"{run_dir}: no stage wrote a torch model; run the recipe first")
    onnx = [
        r["artifacts"]["onnx"]
        for r in records
        if r["type"] == "export" and r.get("precision") == "fp32" and "onnx" in r["artifacts"]
    ]
    method = next((r["method"] for r in reversed(records) if r["type"] == "quantize"), "percentile")
    return run_dir / models[-1], (run_dir / onnx[-1]) if onnx else None, method


def calibration_study(
    run_dir: Path,
    selectors: list[str],
    n: int,
    seeds: int,
    out_dir: Path,
    device: torch.device,
    method: str | None = None,
) -> dict:
    """method: the calibration method (minmax, percentile, entropy); default the run's quantize stage's."""
    from ..models import load_checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / "recipe.yaml").is_file():
        raise EffvisionError(
            f"{run_dir} is not a run folder (no recipe.yaml); run `effvision compress RECIPE --run-dir {run_dir}` first"
        )
    configs = [
        CalibrationConfig(selector=known_selector(s), n=n) for s in selectors
    ]  # unknown selectors stop here, in one line
    recipe = load_recipe(run_dir / "recipe.yaml")
    data = recipe_data(recipe)
    model_path, fp32, run_method = _run_artifacts(run_dir)
    method = method or run_method
    model = load_checkpoint(model_path)
    rows = Rows(out_dir, {"run": str(run_dir), "model": str(model_path), "n": n, "method": method})
    with tempfile.TemporaryDirectory() as tmp:
        if fp32 is None:
            from ..runtimes.onnx_files import export_onnx

            fp32 = export_onnx(model, Path(tmp) / "fp32.onnx")
        rows.measure({"kind": "fp32"}, lambda: {"accuracy": evaluate(fp32, data.val_loader())})
        for cfg in configs:
            for seed in range(seeds):

                def run(cfg=cfg, seed=seed):
                    idx = calibration_indices(data, cfg, model, device, seed)
                    q = quantize_onnx(
                        fp32,
                        Path(tmp) / f"{cfg.selector}-{seed}.onnx",
                        data.train_eval_loader(idx, batch_size=32),
                        method,
                    )
                    acc = evaluate(q, data.val_loader())
                    log(f"{cfg.selector} seed {seed}: int8 top-1 {acc:.4f}")
                    return {"accuracy": acc}

                rows.measure({"kind": "int8", "selector": cfg.selector, "seed": seed}, run)
    summary = {
        "fp32": rows.get(kind="fp32")["accuracy"],
        "method": method,
        "n": n,
        "seeds": seeds,
        "int8": {s: mean_std(r["accuracy"] for r in rows.rows if r.get("selector") == s) for s in selectors},
        "per_seed": {s: [r["accuracy"] for r in rows.rows if r.get("selector") == s] for s in selectors},
    }
    rows.save(summary=summary)
    (Path(out_dir) / "calibration.md").write_text(to_markdown(summary) + "\n")
    return summary


def to_markdown(summary: dict) -> str:
    head = ["calibration set", "int8 top-1 (mean ± std)", "per seed"]
    rows = [
        [f"{s} {summary['n']}", f"{m:.4f} ± {sd:.4f}", ", ".join(f"{a:.4f}" for a in summary["per_seed"][s])]
        for s, (m, sd) in summary["int8"].items()
    ]
    return (
        markdown_table(head, rows)
        + f"\n\nfp32 ONNX: {summary['fp32']:.4f}; {summary['method']} calibration, {summary['seeds']} seeds."
    )
