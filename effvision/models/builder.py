"""Building an architecture: a model name resolved to a spec (zoo card, registered architecture,
timm: or torchvision:), the spec instantiated, and create_model(), which adds its weights.

The architectures register themselves in MODELS when the package imports them (__init__.py).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..registry import MODELS, UnknownNameError, suggest
from .adapters import LIBRARIES, check_library_name, create_timm, create_torchvision
from .caller import CALLER, build_caller
from .hub import weights_file
from .packaged import load_packaged
from .weights import load_pretrained
from .zoo import get_card, list_cards


def list_models(modality: str | None = None) -> list[str]:
    """Zoo card names and registered architectures (timm:/torchvision: reach far more). A
    registered builder states its modality with a `modality` attribute (default image)."""
    archs = {n for n in MODELS.names() if modality in (None, getattr(MODELS.get(n), "modality", "image"))}
    return sorted({c.name for c in list_cards(modality)} | archs)


def model_card(name: str):
    """A zoo card by name (what it is, its weights, the preprocessing its weights expect)."""
    card = get_card(name)
    if card is None:
        raise UnknownNameError(suggest(name, [c.name for c in list_cards()], "model card"))
    return card


def resolve(name: str, num_classes: int | None = None, input_size: list[int] | None = None, **kwargs) -> dict:
    """The full spec of a model name: arch, num_classes, input size, kwargs, card weights."""
    card = get_card(name)
    spec: dict[str, Any] = {
        "name": name,
        "arch": name,
        "num_classes": num_classes,
        "input_size": input_size,
        "kwargs": dict(kwargs),
        "weights": None,
    }
    if card is not None:
        spec.update(arch=card.arch, weights=card.weights, modality=card.modality)
        spec["kwargs"] = {**card.kwargs, **kwargs}
        spec["num_classes"] = num_classes or card.num_classes
        spec["input_size"] = input_size or list(card.input_size)
    elif name.startswith(LIBRARIES):
        check_library_name(name)
    elif name not in MODELS:
        raise UnknownNameError(suggest(name, list_models() + ["timm:<name>", "torchvision:<name>"], "model"))
    spec["num_classes"] = spec["num_classes"] or 10
    spec["input_size"] = spec["input_size"] or [3, 32, 32]
    return spec


def _clip_kwargs(builder, size: list[int] | None) -> dict:
    """A clip input [C, T, H, W] sets a video builder's num_frames and frame_size (the data's
    clip length wins over a card's kwargs, so `data.num_frames=1` gives a single-frame model)."""
    import inspect

    if not size or len(size) != 4:
        return {}
    params = inspect.signature(builder).parameters
    return {k: v for k, v in (("num_frames", size[1]), ("frame_size", size[-1])) if k in params}


def build(spec: dict) -> nn.Module:
    """Instantiate a spec made by resolve() with random weights."""
    arch, n, size, kwargs = spec["arch"], spec["num_classes"], spec["input_size"], dict(spec["kwargs"])
    if arch.startswith(CALLER):
        return build_caller(spec)
    if arch.startswith("timm:"):
        model = create_timm(arch[5:], n, size, **kwargs)
    elif arch.startswith("torchvision:"):
        model = create_torchvision(arch[12:], n, size, **kwargs)
    else:
        builder = MODELS.get(arch)
        model = builder(num_classes=n, **{**kwargs, **_clip_kwargs(builder, size)})
    model.effvision_spec = dict(spec)
    return model


def create_model(
    name: str,
    num_classes: int | None = None,
    pretrained: str | None = None,
    input_size: list[int] | None = None,
    **kwargs,
) -> nn.Module:
    """Build a model by name. `pretrained` (or the card's `weights`) loads a local file, an
    `hf-hub:` repo from the Hugging Face cache, or `zoo` (the card's own weights); a card whose
    weights an installed package ships (`package:`) is built with them. The head keeps its fresh
    initialisation when the class count differs."""
    spec = resolve(name, num_classes, input_size, **kwargs)
    model = build(spec)
    card = get_card(name)
    source = pretrained or spec.get("weights")
    packaged = card is not None and card.package is not None and card.trained is None
    if packaged and source in (None, "zoo"):  # a card of packaged weights is built with them
        reset = load_packaged(model, card.name, card.package)
    elif source:
        reset = load_pretrained(model, weights_file(source, card))
    else:
        return model
    # The next train stage fine-tunes a pretrained body (a new head when the class count differed).
    model.effvision_spec["transfer"] = {"new_head": bool(reset)}
    return model
