"""The schema of a zoo card (models/<name>.yaml): what a model is, its weights, the input they expect.

Only the schema: zoo.py reads the card files, hub.py and packaged.py fetch the weights a card names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import Field, PrivateAttr

from ..recipe import Strict


class Holdout(Strict):
    """The training images a card's run held out (data.holdout): the decision split of every
    compression that starts from it, which the card never saw."""

    n: int = Field(..., ge=0, description="images held out")
    of: int = Field(..., ge=0, description="the whole training split's size")
    seed: int = Field(0, description="data.holdout_seed of the run")
    stratified: bool = True
    sha256: str = Field(..., description="of the held-out indices (data/decision.py): the same slice is recognised")


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
    holdout: Optional[Holdout] = Field(
        None, description="the training images the run held out (None: it trained on the whole training split)"
    )


class PackagedWeights(Strict):
    """Where a card's pretrained weights lie inside an installed distribution, and how they map."""

    distribution: str = Field(..., description="the installed package that ships the file (pip name)")
    file: str = Field(..., description="the weights file, relative to the distribution's install location")
    sha256: str = Field(..., min_length=64, max_length=64)
    layout: str = Field(..., description="the file's key layout: a converter in WEIGHT_LAYOUTS")


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
    # the folder of the card's file (zoo.py sets it): a card's trained weights are relative to it
    _folder: Path = PrivateAttr(default=Path("models"))


def trained_weights_path(card: ModelCard) -> Path | None:
    return None if card.trained is None else card._folder / card.trained.weights
