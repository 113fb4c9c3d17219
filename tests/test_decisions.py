"""Decisions never read the split the report prints: a small target run twice, once with its
validation labels permuted, makes the same plan, prunes to the same widths, reverts the same int8
nodes and ships the same precision; only the reported accuracy changes (to chance).

Speed is the one other input of those choices, so both runs take it from one deterministic clock
(a file's time is its size times its input's pixels): what differs between the runs is then the
validation labels alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch.utils.data import Dataset

import effvision.data as data_module
from effvision.cli import main

RECIPE = {
    "name": "decided",
    "seed": 0,
    # at 20 px (the card's model is trained at 32) its margins are thin: int8 flips a few
    # predictions, and the floor of 0 below has the int8 search revert nodes
    "data": {"name": "digits", "image_size": 20, "max_train_samples": 500, "batch_size": 64, "holdout": 200},
    "model": {"name": "cifar_resnet8_100.digits", "pretrained": "zoo"},
    "target": {"speedup": 5.0, "batch": 1, "max_drop": 0.1},
    "stages": [
        {"type": "plan", "score_samples": 200, "calibration": {"n": 32}, "repeats": 8},
        {
            "type": "prune",
            "aim": {"steps": 1, "candidates": 4, "repeats": 8, "score_samples": 200},
            "finetune": {"step_epochs": 0, "epochs": 1},
        },
        {"type": "export"},
        {"type": "quantize", "calibration": {"n": 8}, "method": "minmax", "require_faster": False, "max_drop": 0.0},
        {"type": "bench", "batches": [1], "repeats": 4, "roofline": False},
    ],
}


class PermutedLabels(Dataset):
    """A split whose labels are shuffled (a fixed permutation), its images untouched."""

    def __init__(self, ds):
        self.ds = ds
        self.targets = list(np.random.default_rng(0).permutation(np.asarray(ds.targets)))
        self.classes, self.report = ds.classes, ds.report

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[i][0], int(self.targets[i])


def _clock_p50(target, shape) -> float:
    """Milliseconds by a fixed rule: the file's bytes (a model's fp32 parameters) times its input's pixels."""
    from effvision.runtimes import runtime_of_path

    if isinstance(target, torch.nn.Module):
        size = 4 * sum(p.numel() for p in target.parameters())
    else:
        size = runtime_of_path(target).file_bytes(target)
    return round(size * int(np.prod(shape[-2:])) * 1e-9, 6)


def _fixed_compare(targets, shape, backend, batches=(1,), device="cpu", warmup=0, repeats=8, rounds=8, threads=None):
    rows = []
    for name, spec in targets.items():
        p50 = _clock_p50(spec[0], list(spec[2]) if len(spec) > 2 else shape)
        for b in batches:
            rows.append(
                {
                    "target": name,
                    "backend": backend or "onnxruntime-cpu",
                    "precision": spec[1],
                    "device": str(device),
                    "batch": b,
                    "p50": p50 * b,
                    "p90": p50 * b,
                    "p99": p50 * b,
                    "samples_per_s": 1e3 / p50,
                    "repeats": repeats,
                    "warmup": warmup,
                    "first_call_ms": p50,
                    "timer": "fixed",
                    "interleaved": {"rounds": rounds, "per_block": 1, "with": [n for n in targets if n != name]},
                }
            )
    return rows


def _fixed_tables(self, todo):
    return {
        key: 1e-3 + layer.cin * layer.cout * int(np.prod(layer.spatial or [1])) * 1e-9 for key, layer in todo.items()
    }


def _run(tmp: Path, permuted: bool, monkeypatch) -> dict:
    import effvision.compression.latency as latency
    import effvision.deploy.bench as bench

    monkeypatch.setattr(bench, "compare", _fixed_compare)
    monkeypatch.setattr(latency.LatencyTables, "_time", _fixed_tables)
    load = data_module.load_dataset

    def loaded(*args, **kwargs):
        bundle = load(*args, **kwargs)
        if permuted:
            bundle.val = PermutedLabels(bundle.val)
        return bundle

    monkeypatch.setattr(data_module, "load_dataset", loaded)
    raw = json.loads(json.dumps(RECIPE))
    raw["stages"][1]["aim"]["cache_dir"] = str(tmp / "latency")
    recipe = tmp / "decided.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    code = main(["compress", str(recipe), "--run-dir", str(tmp / "run")])
    monkeypatch.undo()
    assert code in (0, 1), code  # the target's verdict does not matter here: the choices do
    return {**json.loads((tmp / "run" / "report.json").read_text()), "run_dir": str(tmp / "run")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    true = _run(tmp_path_factory.mktemp("true"), False, mp)
    permuted = _run(tmp_path_factory.mktemp("permuted"), True, mp)
    return true, permuted


def _choices(report: dict) -> dict:
    stage = {s["type"]: s for s in report["stages"]}
    plan, aim, quantize = report["plan"], stage["prune"]["aim"], stage["quantize"]
    return {
        "levers": [(lv["lever"], lv["top1"], lv["cost"], lv.get("kept", False)) for lv in plan["levers"]],
        "plan_int8": plan["int8"]["float_nodes"] if plan["int8"] else None,
        "kept": plan["kept"],
        "widths": aim.get("widths"),
        "candidates": [(c["widths"], c["top1"]) for s in aim.get("steps", []) for c in s.get("candidates", [])],
        "floor": aim.get("floor"),
        "int8_reverts": quantize["float_layers"] + quantize["float_nodes"],
        "int8_steps": (quantize["accuracy_search"] or {}).get("steps"),
        "shipped": quantize["shipped"],
    }


def test_decisions_are_the_same_when_the_validation_labels_are_permuted(runs):
    true, permuted = runs
    assert _choices(true) == _choices(permuted)
    assert _choices(true)["int8_steps"], "the floor of 0 should have made the int8 search revert nodes"
    shipped = [s for s in true["stages"] if s["type"] == "quantize"][0]
    shuffled = [s for s in permuted["stages"] if s["type"] == "quantize"][0]
    assert shipped["accuracy"] > 0.7 and shuffled["accuracy"] < 0.25  # the report reads the labels, as it must
    assert true["dataset"]["decision"]["n"] == 200 and "held out for decisions" in true["plan"]["scored_on"]


def test_the_report_names_both_splits(runs):
    true, _ = runs
    assert true["dataset"]["decision"]["sha256"] and true["dataset"]["val_size"] == 360
    text = (Path(true["run_dir"]) / "report.md").read_text()
    assert "decision split: 200 training images" in text and "the whole validation split (360" in text
