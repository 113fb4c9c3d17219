"""The zoo: one declarative YAML card per model entry under models/ (no code in cards)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, PrivateAttr

from ..paths import card_files
from ..recipe import Strict, load_card
from .packaged import PackagedWeights


class TrainedWeights(Strict):
    """Weights the project trained for this card, how, and what they scored (a test re-scores them)."""

    accuracy: float = Field(..., ge=0, le=1, description="top-1 on `split` of the card's dataset")
    split: str = Field("val", description="the split the recipe validates on")
    recipe: str = Field(..., description="the recipe that trained them (a name under compress/)")
    stage: str = Field(..., description="the recipe stage whose model these are")
    command: str = Field(..., description="the command that produced them")
    weights: str = Field(..., description="safetensors file, relative to the card's folder")
    sha256: str = Field(..., min_length=64, max_length=64)
    commit: Optional[str] = Field(None, description="effvision git commit of the run")


class Preprocessing(Strict):
    """How an image reaches the model: resize the short side to size / crop_fraction with
    `interpolation`, centre-crop `size`, scale to 0..1, subtract `mean`, divide by `std` (RGB).
    The weights were trained so; evaluation, calibration and export follow it."""

    size: int = Field(..., gt=0, description="side of the square the model takes")
    crop_fraction: float = Field(0.875, gt=0, le=1, description="crop side over the resized short side")
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bicubic"
    mean: list[float] = Field(..., min_length=3, max_length=3)
    std: list[float] = Field(..., min_length=3, max_length=3)

    @property
    def resize(self) -> int:
        return int(round(self.size / self.crop_fraction))


class ModelCard(Strict):
    name: str
    arch: str = Field(..., description="registered architecture, timm:<name> or torchvision:<name>")
    modality: Literal["image", "video", "points"] = "image"
    num_classes: int = Field(..., gt=0)
    input_size: list[int] = Field(
        ..., min_length=2, max_length=4, description="C, H, W (image); C, T, H, W (video); C, N (points)"
    )
    kwargs: dict[str, Any] = Field(default_factory=dict)
    dataset: Optional[str] = None
    weights: Optional[str] = Field(None, description="local .pth/.safetensors file loaded whenever the card is built")
    hub: Optional[str] = Field(
        None,
        description="Hugging Face Hub repo of pretrained weights (pretrained: zoo), read from the local cache when "
        "offline",
    )
    recipe: Optional[str] = Field(
        None, description="the default recipe (a name under compress/) to fine-tune and compress this model"
    )
    trained: Optional[TrainedWeights] = None
    package: Optional[PackagedWeights] = Field(
        None, description="pretrained weights an installed package ships (pretrained: zoo, or loaded when built)"
    )
    preprocessing: Optional[Preprocessing] = Field(None, description="the input pipeline the weights expect")
    params: Optional[int] = Field(None, ge=0, description="parameters as built (a test recounts them)")
    macs: Optional[int] = Field(
        None, ge=0, description="multiply-accumulates of one forward pass at input_size (a test recounts them)"
    )
    paper: Optional[str] = None
    description: str = ""
    _folder: Path = PrivateAttr(default=Path("models"))


@lru_cache(maxsize=None)
def _cards() -> dict[str, ModelCard]:
    cards = {}
    for stem, path in card_files("models").items():
        card = load_card(path, ModelCard, stem)
        card._folder = path.parent
        cards[card.name] = card
    return cards


def trained_weights_path(card: ModelCard) -> Path | None:
    return None if card.trained is None else card._folder / card.trained.weights


def list_cards(modality: str | None = None) -> list[ModelCard]:
    return [c for c in _cards().values() if modality in (None, c.modality)]


def get_card(name: str) -> ModelCard | None:
    return _cards().get(name)
