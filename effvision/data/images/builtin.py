"""Built-in image dataset readers: the embedded digits and any ImageFolder folder or zip."""

from __future__ import annotations

import torch

from ...registry import DATASETS
from ..layouts import data_root, split_path
from .folders import ImageFolderDataset, TensorImageDataset


@DATASETS.register("digits")
def digits(card, config, progress=None):
    """scikit-learn's real 8x8 handwritten digits (1797 images, shipped with the package),
    upsampled to the card's size as RGB; a fixed stratified 80/20 split (1437 / 360)."""
    import torch.nn.functional as F
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    x = F.interpolate(x, size=(card.image_size, card.image_size), mode="bilinear", align_corners=False)
    x = (x.clamp(0, 1) * 255).round().to(torch.uint8).expand(-1, 3, -1, -1).contiguous()
    y = d.target.tolist()
    tr, va = train_test_split(list(range(len(y))), test_size=0.2, stratify=y, random_state=0)
    classes = [str(i) for i in range(10)]
    return (
        TensorImageDataset(x[tr], [y[i] for i in tr], classes),
        TensorImageDataset(x[va], [y[i] for i in va], classes),
    )


@DATASETS.register("imagefolder")
def imagefolder(card, config, progress=None):
    """Folders (or .zip files) in ImageFolder layout: <root>/<train>/<class>/<image> and the val split."""
    root = data_root(card, config)
    train = ImageFolderDataset(split_path(root, card.train, ("train",)), config.on_bad_sample, progress)
    val = ImageFolderDataset(split_path(root, card.val, ("val", "test")), config.on_bad_sample, progress)
    return train, val
