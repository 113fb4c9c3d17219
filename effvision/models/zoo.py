"""The zoo: one declarative YAML card per model entry under models/ (no code in cards)."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal, Optional

from pydantic import Field

from ..paths import card_files
from ..recipe import Strict, load_card


class ModelCard(Strict):
    name: str
    arch: str = Field(..., description="registered architecture, timm:<name> or torchvision:<name>")
    modality: Literal["image", "video", "points"] = "image"
    num_classes: int = Field(..., gt=0)
    input_size: list[int] = Field(..., min_length=2, max_length=4, description="C, H, W (image); C, T, H, W (video); C, N (points)")
    kwargs: dict[str, Any] = Field(default_factory=dict)
    dataset: Optional[str] = None
    weights: Optional[str] = Field(None, description="local .pth/.safetensors file")
    params: Optional[int] = Field(None, ge=0, description="parameters as built (a test recounts them)")
    macs: Optional[int] = Field(None, ge=0, description="multiply-accumulates of one forward pass at input_size (a test recounts them)")
    paper: Optional[str] = None
    description: str = ""


@lru_cache(maxsize=None)
def _cards() -> dict[str, ModelCard]:
    cards = {}
    for stem, path in card_files("models").items():
        card = load_card(path, ModelCard, stem)
        cards[card.name] = card
    return cards


def list_cards(modality: str | None = None) -> list[ModelCard]:
    return [c for c in _cards().values() if modality in (None, c.modality)]


def get_card(name: str) -> ModelCard | None:
    return _cards().get(name)
