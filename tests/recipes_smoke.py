"""Every recipe in compress/ run end to end on a short schedule: each stage's epochs cut to one, the
data to a few thousand samples, searches and timings to their smallest, so that a change to any
stage, runtime or decision shows in minutes where the recipes as written take hours.

    python tests/recipes_smoke.py [--data-root ../shared/datasets] [--only NAME,...] [--out DIR]

A recipe passes when its run writes report.json: a target not met, or a floor that binds on the
short schedule, is the recipe's verdict (exit 1 with its one line), not a failure. Prints one line
per recipe and exits 1 when one failed."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SHORT = {  # per stage type: key -> value (set where the stage's config has the key)
    "train": {"epochs": 1},
    "distill": {"epochs": 1},
    "qat": {"epochs": 1, "calibration": {"n": 32}, "repeats": 8},
    "select": {"proxy": {"epochs": 1}},
    "plan": {"score_samples": 200, "calibration": {"n": 32}, "repeats": 8},
    "quantize": {"calibration": {"n": 32}, "repeats": 8, "rank_samples": 32},
    "export": {"calibration": {"n": 32}},
    "bench": {"repeats": 5, "warmup": 1, "batches": [1], "roofline": False},
}
PRUNE = {"finetune": {"epochs": 1, "step_epochs": 1}, "aim": {"candidates": 2, "repeats": 8, "score_samples": 200}}
LARGE = {"cifar10": 3000}  # training samples kept of the datasets that need ../shared
# run as written (minutes on the digits): one epoch of training leaves QAT's ranges to diverge
AS_WRITTEN = {"qat-digits"}


def shortened(raw: dict) -> dict:
    import effvision.stages  # noqa: F401  (registers every stage type)
    from effvision.registry import STAGES

    raw = json.loads(json.dumps(raw))
    data = raw.setdefault("data", {})
    if data.get("name") in LARGE:
        data["max_train_samples"] = min(data.get("max_train_samples") or 10**9, LARGE[data["name"]])
        data["max_val_samples"] = 1000
        data["holdout"] = data.get("holdout") or 500
    for stage in raw.get("stages", []):
        fields = STAGES.get(stage["type"]).config.model_fields
        for key, value in {**SHORT.get(stage["type"], {}), **(PRUNE if stage["type"] == "prune" else {})}.items():
            if key in fields:
                stage[key] = {**stage.get(key, {}), **value} if isinstance(value, dict) else value
        if stage["type"] == "prune" and "aim" in stage:
            stage["aim"]["steps"] = min(stage["aim"].get("steps", 2), 2)
    return raw


def run(recipe: Path, out: Path, data_root: str | None) -> tuple[str, float, str]:
    raw = yaml.safe_load(recipe.read_text())
    raw = raw if recipe.stem in AS_WRITTEN else shortened(raw)
    short = out / f"{recipe.stem}.yaml"
    short.write_text(yaml.safe_dump(raw, sort_keys=False))
    needs_root = raw.get("data", {}).get("name") in LARGE
    if needs_root and data_root is None:
        return "skipped", 0.0, "needs --data-root (CIFAR-10)"
    cmd = [sys.executable, "-m", "effvision.cli", "compress", str(short), "--run-dir", str(out / recipe.stem)]
    cmd += ["--set", f"data.root={data_root}"] if needs_root else []
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={"EFFVISION_QUIET": "1", **_env()})
    seconds = time.perf_counter() - start
    last = next((ln for ln in reversed(done.stderr.strip().splitlines()) if ln.strip()), "")
    if done.returncode == 0:
        return "ran", seconds, "exit 0"
    if done.returncode == 1 and (out / recipe.stem / "report.json").is_file():
        return "ran", seconds, f"exit 1 with its report: {last[:160]}"
    return "FAILED", seconds, f"exit {done.returncode}: {last[:300]}"


def _env() -> dict:
    import os

    return {k: v for k, v in os.environ.items() if k != "EFFVISION_QUIET"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=None, help="the folder holding the CIFAR-10 zips")
    parser.add_argument("--only", default=None, help="comma list of recipe names")
    parser.add_argument("--out", default="runs/recipes-smoke", help="where the shortened recipes and runs go")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    recipes = sorted((ROOT / "compress").glob("*.yaml"))
    if args.only:
        recipes = [r for r in recipes if r.stem in args.only.split(",")]
    failed = 0
    for recipe in recipes:
        verdict, seconds, why = run(recipe, out, args.data_root)
        failed += verdict == "FAILED"
        print(f"{recipe.stem:28s} {verdict:8s} {seconds:7.1f} s  {why}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
