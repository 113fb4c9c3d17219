"""The models a command line names: a checkpoint file or a zoo card with its weights (load_model)."""

from __future__ import annotations

from torch import nn

from ..errors import EffvisionError
from .builder import create_model, resolve
from .checkpoint import load_checkpoint
from .zoo import get_card


def is_checkpoint_path(spec: str) -> bool:
    """A command line's model argument that names a file rather than a card or architecture."""
    import os

    return spec.endswith((".pt", ".pth", ".safetensors")) or os.sep in spec


def load_model(spec: str, random_weights: bool = False) -> nn.Module:
    """An effvision checkpoint file, or a name (card_model)."""
    return load_checkpoint(spec) if is_checkpoint_path(spec) else card_model(spec, random_weights)


def card_model(name: str, random_weights: bool = False) -> nn.Module:
    """A model named on the command line (export, bench, predict): a zoo card is the card's model
    with its weights (trained, packaged or from the hub); a name without weights is refused in
    one line unless `random_weights` asks for the architecture alone."""
    card = get_card(name)
    if random_weights:
        return create_model(name).eval()
    if card is None:
        resolve(name)  # an unknown name is one line with suggestions
        raise EffvisionError(
            f"{name} is an architecture, not a zoo card with weights: give a checkpoint, or pass --random-weights "
            "for the architecture alone"
        )
    if card.trained is not None or card.hub:
        return create_model(name, pretrained="zoo").eval()
    if card.package is not None or card.weights:
        return create_model(name).eval()
    how = f" (train it: effvision train {card.recipe})" if card.recipe else ""
    raise EffvisionError(f"model card {name} has no weights{how}; pass --random-weights for the architecture alone")
