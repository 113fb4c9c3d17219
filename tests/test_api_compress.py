"""effvision.compress on the caller's own model and data: a module and a Dataset registered
nowhere go through prune, distill, int8 and a bench against the reference into a run folder that
resumes, starts afresh (saying why) when the model changed, and refuses bad inputs in one line
before any long work; a timm model with a replaced head on a torchvision ImageFolder works the same."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import INT8_ALWAYS, write_image_folder
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset

import effvision
from effvision.errors import EffvisionError
from effvision.stages import Bench, Distill, Export, Prune, Quantize, Train


class SmallDigits(Dataset):
    """scikit-learn's digits as 1 x 16 x 16 float tensors: the caller's own dataset."""

    def __init__(self, split: str, n: int = 600):
        d = load_digits()
        x = nn.functional.interpolate(torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16, size=16)
        y = torch.tensor(d.target)
        self.x, self.y = (x[:n], y[:n]) if split == "train" else (x[-n // 3 :], y[-n // 3 :])

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


class TinyNet(nn.Module):
    """The caller's own module: no effvision contract, no registration."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, stride=2),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(32, classes)

    def forward(self, x):
        return self.classifier(self.features(x))


STAGES = [
    # seed 0: baseline 0.715, pruned 0.175, distilled 0.635 (batch 16)
    Train(name="baseline", epochs=5, optimizer="adamw", lr=1e-2),
    Prune(ratio=0.5, target=False),  # the uniform ratio (aiming is test_target's); the report judges the target
    Distill(epochs=3, optimizer="adamw", lr=1e-2),
    Export(),
    Quantize(calibration={"n": 32}, **INT8_ALWAYS),
    Bench(batches=[1], warmup=2, repeats=5),
]
TARGET = {"speedup": 1.2, "max_drop": 0.5}


def _net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyNet()


def _stage_records(run_dir) -> dict[str, str]:
    return {p.parent.name: p.read_text() for p in sorted(run_dir.glob("stages/*/metrics.json"))}


def test_the_callers_module_and_dataset_compress_resume_and_restart_on_other_weights(tmp_path):
    net, train, val = _net(), SmallDigits("train"), SmallDigits("val")
    before = {k: v.clone() for k, v in net.state_dict().items()}
    run_dir = tmp_path / "run"
    result = effvision.compress(net, train, val, stages=STAGES, target=TARGET, run_dir=run_dir, batch_size=16)

    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items()), "the caller's module was changed"
    report = json.loads((run_dir / "report.json").read_text())
    assert [s["name"] for s in report["stages"]] == ["baseline", "prune", "distill", "export", "quantize", "bench"]
    assert report["reference"] is not None and report["reference"]["accuracy"] > 0.5, report["reference"]
    assert result.reference == report["reference"] and result.rows == report["stages"]
    assert report["target"]["speedup"] == 1.2
    assert result.shipped == run_dir / "stages" / "5-quantize" / "model.onnx" and result.shipped.is_file()
    pruned = [s for s in report["stages"] if s["name"] == "prune"][0]
    assert pruned["params"] < report["stages"][0]["params"] * 0.6
    assert report["stages"][0]["accuracy"] > 0.5 and report["stages"][2]["accuracy"] > 0.4  # chance is 0.1
    assert result.started_afresh is None
    # the checkpoints load back onto the caller's module
    model = effvision.load_checkpoint(run_dir / "stages" / "3-distill" / "model.pt", model=TinyNet())
    assert sum(p.numel() for p in model.parameters()) == pruned["params"]

    # another process cannot rebuild the caller's class by name: one line says how to load it
    export = [sys.executable, "-m", "effvision.cli", "export", str(run_dir / "stages" / "3-distill" / "model.pt")]
    out = subprocess.run([*export, "--out", str(tmp_path / "m.onnx")], capture_output=True, text=True, timeout=300)
    err = out.stderr.strip()
    assert out.returncode == 1 and "effvision.load_checkpoint(path, model=TinyNet(...))" in err, err
    assert len(err.splitlines()) == 1, err

    # the same call again: every stage resumed, none re-ran
    kept = _stage_records(run_dir)
    again = effvision.compress(_net(), train, val, stages=STAGES, target=TARGET, run_dir=run_dir, batch_size=16)
    assert _stage_records(run_dir) == kept and again.started_afresh is None

    # other weights: the run starts afresh and says why
    other = _net()
    with torch.no_grad():
        other.classifier.bias[0] += 1.0
    changed = effvision.compress(other, train, val, stages=STAGES[:2], run_dir=run_dir, batch_size=16)
    assert changed.started_afresh and "the model's weights changed" in changed.started_afresh, changed.started_afresh
    assert _stage_records(run_dir)["1-baseline"] != kept["1-baseline"]


def test_a_recipe_files_stages_run_on_the_callers_model_and_data(tmp_path):
    """recipe=<file>: its stages, seed and batch size; its model and data are the call's."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "name: mine\nseed: 1\nmodel: {name: cifar_resnet8}\ndata: {name: cifar10, batch_size: 16}\nstages:\n"
        "  - {name: baseline, type: train, epochs: 2, optimizer: adamw, lr: 0.01}\n  - {type: prune, ratio: 0.5}\n"
    )
    result = effvision.compress(
        _net(), SmallDigits("train"), SmallDigits("val"), recipe=recipe, run_dir=tmp_path / "run"
    )
    assert [r["name"] for r in result.rows] == ["baseline", "prune"]
    resolved = (tmp_path / "run" / "recipe.yaml").read_text()
    assert "seed: 1" in resolved and "batch_size: 16" in resolved and "cifar" not in resolved.split("stages:")[0]
    with pytest.raises(EffvisionError, match="either stages"):
        effvision.compress(_net(), SmallDigits("train"), SmallDigits("val"), recipe=recipe, stages=STAGES)


class _Reshaping(TinyNet):
    """A forward that hard-codes a channel count: the pruned copy cannot run."""

    def forward(self, x):
        return self.classifier(self.features(x).view(-1, 32))


class _Wrong(Dataset):
    classes = [str(c) for c in range(10)]

    def __init__(self, item, n: int = 20):
        self.item, self.n = item, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.item(i)


@pytest.mark.parametrize(
    "model,train,words",
    [
        (TinyNet(classes=4), None, ["logits of shape (2, 10) are expected", "(2, 4)"]),
        (
            TinyNet(),
            _Wrong(lambda i: (torch.zeros(1, 16, 16), 10 + i % 2)),
            ["label 11 is out of range for 10 classes"],
        ),
        (TinyNet(), _Wrong(lambda i: (torch.zeros(1, 16, 16), -1)), ["class indices start at 0"]),
        (TinyNet(), _Wrong(lambda i: (torch.zeros(1, 16, 16 + i % 2), i % 10)), ["item 1 has input shape (1, 16, 17)"]),
        (TinyNet(), _Wrong(lambda i: torch.zeros(3)), ["not an (input, label) pair"]),
        (nn.Linear(4, 10), None, ["the model fails on a batch of the train data", "RuntimeError"]),
        (_Reshaping(), None, ["the pruner cannot trace _Reshaping"]),
    ],
    ids=["output-shape", "label-range", "negative-label", "input-shape", "no-pair", "model-fails", "untraceable"],
)
def test_bad_models_and_data_are_one_error_before_any_training(model, train, words, tmp_path):
    train = train or SmallDigits("train", 60)
    with pytest.raises(EffvisionError) as err:
        effvision.compress(model, train, SmallDigits("val", 60), stages=STAGES[:2], run_dir=tmp_path / "run")
    message = str(err.value)
    assert all(w in message for w in words) and "\n" not in message, message
    assert not (tmp_path / "run").exists(), "a run folder was written before the inputs were checked"


def test_a_timm_model_with_a_new_head_on_an_image_folder(tmp_path):
    timm = pytest.importorskip("timm")
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    classes = ("cat", "dog", "fox")
    tf = transforms.Compose([transforms.Resize(32), transforms.ToTensor()])
    train = ImageFolder(write_image_folder(tmp_path / "train", classes, per_class=8, size=24), transform=tf)
    val = ImageFolder(write_image_folder(tmp_path / "val", classes, per_class=4, size=24), transform=tf)
    net = timm.create_model("resnet10t", pretrained=False, num_classes=1000)
    net.reset_classifier(len(train.classes))  # the caller's replaced head
    stages = [Prune(ratio=0.3), Distill(epochs=1), Export(), Quantize(calibration={"n": 8}, **INT8_ALWAYS)]
    result = effvision.compress(net, DataLoader(train, batch_size=8), val, stages=stages, run_dir=tmp_path / "run")
    names = [r["name"] for r in result.rows]
    assert names == ["prune", "distill", "export", "quantize"] and result.shipped.suffix == ".onnx"
    data = json.loads((tmp_path / "run" / "dataset.json").read_text())
    assert data["train_size"] == len(train) and data["num_classes"] == 3 and data["input_shape"] == [3, 32, 32]


@pytest.mark.slow  # 20-25 s; make test runs the same API on the caller's module and dataset (above)
def test_the_example_script_runs(tmp_path):
    """examples/compress_own_model.py, as a user runs it."""
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "examples" / "compress_own_model.py"
    run = subprocess.run(  # in tmp_path: nothing it writes lands in the checkout
        [sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["reference"] is not None and report["headline"] is not None
    assert "ships:" in run.stdout and (tmp_path / "run" / "stages" / "5-quantize").is_dir()


def test_a_dataset_that_augments_at_random_keeps_its_identity():
    """A train split with a random transform (as every real fine-tune has) is the same data on
    the next call, so a re-run resumes instead of starting afresh."""
    from effvision.data.caller import caller_data

    class Jittered(SmallDigits):
        def __getitem__(self, i):
            x, y = super().__getitem__(i)
            return x + 0.1 * torch.randn_like(x), y

    first = caller_data(Jittered("train"), SmallDigits("val")).identity
    assert caller_data(Jittered("train"), SmallDigits("val")).identity == first
