"""Built-in image dataset readers: the embedded digits and any ImageFolder folder or zip."""

from __future__ import annotations

from pathlib import Path

import torch

from ..errors import EffvisionError
from ..registry import DATASETS
from .images import ImageFolderDataset, TensorImageDataset


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


def data_root(card, config) -> Path:
    """The folder a card's data lives in: data.root, else the card's root; it must exist."""
    root_str = config.root or card.root
    if not root_str:
        raise EffvisionError(
            f"dataset {card.name} needs a path: pass --set data.root=<folder holding {card.train or 'train/'}>"
        )
    root = Path(root_str).expanduser()
    if not root.exists():
        raise EffvisionError(f"data path not found: {root}")
    if root.is_file() and root.suffix.lower() == ".zip" and card.modality != "image":
        # decord, PyAV and open3d read files on disk: a video or point-cloud archive is
        # extracted once (safely) into the cache; images are read from the .zip in place
        from .archive import extract_once

        return extract_once(root, card.cache_dir)
    return root


def split_path(root: Path, given: str | None, defaults: tuple[str, ...]) -> Path:
    for name in [given] if given else list(defaults):
        if (root / name).exists():
            return root / name
    tried = given or " or ".join(defaults)
    raise EffvisionError(f"data path not found: {root / tried} (set data.root to the folder that holds it)")


@DATASETS.register("imagefolder")
def imagefolder(card, config, progress=None):
    """Folders (or .zip files) in ImageFolder layout: <root>/<train>/<class>/<image> and the val split."""
    root = data_root(card, config)
    train = ImageFolderDataset(split_path(root, card.train, ("train",)), config.on_bad_sample, progress)
    val = ImageFolderDataset(split_path(root, card.val, ("val", "test")), config.on_bad_sample, progress)
    return train, val
