"""Dataset cards: declarative YAML under data/ saying where a dataset is and how to feed it."""
from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field

from ..errors import EffvisionError
from ..paths import card_files
from ..recipe import Strict, load_card
from ..registry import DATASETS, suggest


class DatasetCard(Strict):
    name: str
    modality: Literal["image", "video", "points"] = "image"
    source: str = Field(..., description="registered dataset reader (digits, imagefolder, ...)")
    root: Optional[str] = Field(None, description="folder holding train/val (a recipe's data.root wins)")
    train: Optional[str] = Field(None, description="folder or .zip in ImageFolder layout, relative to root")
    val: Optional[str] = None
    num_classes: Optional[int] = Field(None, gt=0)
    image_size: int = Field(32, gt=0)
    mean: list[float] = Field(default_factory=lambda: [0.485, 0.456, 0.406])
    std: list[float] = Field(default_factory=lambda: [0.229, 0.224, 0.225])
    hflip: bool = True
    train_crop: Literal["pad", "resized"] = "pad"
    # video
    num_frames: int = Field(8, gt=0, description="frames per clip (video)")
    sampler: str = Field("tsn", description="video frame sampler: tsn, dense, keyframes, motion")
    sampler_options: dict[str, Any] = Field(default_factory=dict, description="e.g. {stride: 2} for dense")
    resize: Optional[int] = Field(None, gt=0, description="short side frames are decoded at, >= image_size (default image_size)")
    generate: dict[str, Any] = Field(default_factory=dict, description="parameters of a generated dataset")
    description: str = ""


def get_card(name: str) -> DatasetCard:
    files = card_files("data")
    if name in files:
        return load_card(files[name], DatasetCard, name)
    if name in DATASETS:  # a registered reader needs no card
        return DatasetCard(name=name, source=name)
    raise EffvisionError(suggest(name, sorted(set(files) | set(DATASETS.names())), "dataset"))
