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


def missing_weights(name: str) -> str | None:
    """Why a model named on the command line has no weights to load; None when it has them (an
    unknown name is one line with suggestions)."""
    card = get_card(name)
    if card is None:
        resolve(name)
        return f"{name} is an architecture, not a zoo card with weights"
    if card.trained is not None or card.hub or card.package is not None or card.weights:
        return None
    how = f" (train it: effvision train {card.recipe})" if card.recipe else ""
    return f"model card {name} has no weights{how}"


def card_model(name: str, random_weights: bool = False) -> nn.Module:
    """A model named on the command line (export, bench, predict): a zoo card is the card's model
    with its weights (trained, packaged or from the hub); a name without weights is refused in
    one line unless `random_weights` asks for the architecture alone."""
    if random_weights:
        return create_model(name).eval()
    why = missing_weights(name)
    if why is not None:
        raise EffvisionError(f"{why}: give a checkpoint, or pass --random-weights for the architecture alone")
    card = get_card(name)
    return create_model(name, pretrained="zoo" if card.trained is not None or card.hub else None).eval()
