"""Shared fixtures: quiet output, no hub access, tiny recipes and generated image folders."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ["EFFVISION_QUIET"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"

import effvision.stages  # noqa: E402, F401  (registers every stage type, as the pipeline and the CLI do)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared (real test data) is not present")


# The pipeline tests check the stages' mechanics on a net too small for int8 to pay: they ship
# int8 whatever it measures (test_int8_search.py and the demo test cover the decisions).
INT8_ALWAYS = {"require_faster": False, "speed_aware": False}


def tiny_recipe(**over) -> dict:
    """A recipe through every stage that runs in seconds: a quarter-width net on 400 digits."""
    raw = {
        "name": "tiny",
        "seed": 0,
        "data": {"name": "digits", "max_train_samples": 400, "max_val_samples": 120, "batch_size": 32},
        "model": {"name": "cifar_resnet8", "kwargs": {"width": 0.25}},
        "stages": [
            {
                "name": "baseline",
                "type": "train",
                "epochs": 3,
                "optimizer": "adamw",
                "lr": 3e-3,
                "target_accuracy": 0.12,  # chance is 0.1: seed 0 is at 0.158 after 3 epochs (0.2 per sample)
            },
            {"type": "prune", "ratio": 0.5},
            {"type": "distill", "epochs": 1},
            {"type": "export"},
            {"type": "quantize", "calibration": {"n": 64}, **INT8_ALWAYS},
            {"type": "bench", "warmup": 2, "repeats": 5, "batches": [1, 8], "reference": False},
        ],
    }
    raw.update(over)
    return raw


def write_image_folder(root: Path, classes=("cat", "dog"), per_class: int = 6, size: int = 20) -> Path:
    rng = np.random.default_rng(0)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            arr = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
            Image.fromarray(arr).save(root / c / f"{i}.png")
    return root


def zip_folder(folder: Path, dest: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(dest, "w") as z:
        for p in sorted(folder.rglob("*")):
            if p.is_file():
                z.write(p, prefix + str(p.relative_to(folder)))
    return dest


@pytest.fixture
def image_root(tmp_path) -> Path:
    """<root>/train and <root>/val ImageFolder trees of random images."""
    write_image_folder(tmp_path / "train")
    write_image_folder(tmp_path / "val", per_class=3)
    return tmp_path


# A bundle's predict.py run with imports of torch, torchvision or effvision failing:
# [sys.executable, "-I", "-c", HIDE_TORCH, "bundle/predict.py", ARGS...]
HIDE_TORCH = """
import runpy, sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision", "effvision"):
            raise ImportError(f"{name} is hidden")
sys.meta_path.insert(0, Hide())
script = sys.argv[1]
sys.argv = sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    assert not any(m.split(".")[0] in ("torch", "effvision") for m in sys.modules)
"""


needs_openvino = pytest.mark.skipif(  # by its spec: the suite's process never loads OpenVINO (tests/test_openvino.py)
    any(importlib.util.find_spec(m) is None for m in ("openvino", "nncf")),
    reason="OpenVINO and NNCF (the [openvino] extra) are not installed",
)


def run_cli(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    """`effvision ARGS` in a child process (a runtime's native libraries stay out of the suite's)."""
    cmd = [sys.executable, "-m", "effvision.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def child_json(code: str) -> dict:
    """What a Python snippet prints last, as JSON, run in a child process."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_error_line(out: subprocess.CompletedProcess, *fragments) -> None:
    """A child's exit 1 with one line on stderr, "effvision: error: ...", holding each fragment."""
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith("effvision: error:"), out.stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
