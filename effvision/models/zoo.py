"""The zoo: one declarative YAML card per model entry under models/ (no code in cards), read once."""

from __future__ import annotations

from functools import lru_cache

from ..paths import card_files
from ..recipe import load_card
from .cards import ModelCard


@lru_cache(maxsize=None)
def _cards() -> dict[str, ModelCard]:
    cards = {}
    for stem, path in card_files("models").items():
        card = load_card(path, ModelCard, stem)
        card._folder = path.parent
        cards[card.name] = card
    return cards


def list_cards(modality: str | None = None) -> list[ModelCard]:
    return [c for c in _cards().values() if modality in (None, c.modality)]


def get_card(name: str) -> ModelCard | None:
    return _cards().get(name)
