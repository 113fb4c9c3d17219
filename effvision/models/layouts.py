"""Weight layouts: converters that map the tensors of a packaged weights file, named in another
library's key layout, onto an architecture's names, checking every name and shape.

A card's `package.layout` names one; packaged.py loads the file and applies it.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from ..errors import EffvisionError
from ..registry import Registry
from .adapters import classifier_of

# layout name -> converter(state, model, card_name) -> state in the model's names
WEIGHT_LAYOUTS = Registry("weight layout")


def _check_mapping(mapped: dict[str, tuple[str, torch.Tensor]], model: nn.Module, card_name: str) -> dict:
    """Every file tensor lands on a model tensor of its shape and every model tensor gets one, but
    the classifier, which may be sized for other classes. Returns {model name: tensor}."""
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
