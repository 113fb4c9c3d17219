"""Compress a model and data of your own with one call: effvision.compress.

The network below is a plain nn.Module and the dataset a plain torch Dataset (built from
scikit-learn's handwritten digits, shipped with scikit-learn): neither is registered with effvision.
The call trains it, prunes half of its channels, distills it back from the trained model, exports
ONNX, quantizes it to int8 and times the result against the uncompressed model exported to the same
runtime; everything lands in a run folder that a second run resumes. (Add
target={"speedup": 1.5, "max_drop": 0.02} and the prune stage aims its per-layer widths at that
measured speed-up instead of the uniform ratio: docs/guides/compress-to-target.md.)

    python examples/compress_own_model.py [RUN_DIR]      (default runs/own-model; about 20 s on 2 cores)
"""

from __future__ import annotations

import sys

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import Dataset

import effvision
from effvision.stages import Bench, Distill, Export, Prune, Quantize, Train


class Digits(Dataset):
    """8 x 8 digits upsampled to 1 x 16 x 16 float tensors; the last 360 images are the validation split."""

    def __init__(self, split: str):
        d = load_digits()
        images = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
        images = nn.functional.interpolate(images, size=16, mode="bilinear", align_corners=False)
        labels = torch.tensor(d.target)
        part = slice(None, -360) if split == "train" else slice(-360, None)
        self.images, self.labels = images[part], labels[part]
        self.classes = [str(c) for c in range(10)]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


class SmallConvNet(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.Conv2d(64, 64, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.body(x))


def main(run_dir: str) -> effvision.api.CompressResult:
    torch.manual_seed(0)
    result = effvision.compress(
        SmallConvNet(),
        train=Digits("train"),
        val=Digits("val"),
        stages=[
            Train(name="baseline", epochs=4, optimizer="adamw", lr=3e-3),
            Prune(ratio=0.5),
            Distill(epochs=3, optimizer="adamw", lr=3e-3),
            Export(),
            Quantize(calibration={"n": 128}),
            Bench(batches=[1, 32]),
        ],
        run_dir=run_dir,
    )
    print(result.table())
    print(f"ships: {result.shipped}")
    return result


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/own-model")
