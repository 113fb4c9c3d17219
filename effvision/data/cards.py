"""Dataset cards: declarative YAML under data/ saying where a dataset is and how to feed it."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field

from ..errors import EffvisionError
from ..paths import card_files
from ..recipe import Strict, load_card
from ..registry import DATASETS, suggest


class PointAugment(Strict):
    """Training augmentations of a point cloud (after sampling, before the model)."""

    rotate: bool = Field(True, description="random rotation about the up axis")
    scale: tuple[float, float] = Field((0.8, 1.25), description="anisotropic scale range per axis")
    jitter: float = Field(0.01, ge=0, description="std of Gaussian noise per coordinate (clipped at 5x)")
    dropout: float = Field(0.875, ge=0, lt=1, description="largest fraction of points dropped (replaced by the first)")


class DatasetCard(Strict):
    name: str
    modality: Literal["image", "video", "points"] = "image"
    source: str = Field(..., description="registered dataset reader (digits, imagefolder, ...)")
    root: Optional[str] = Field(None, description="folder holding train/val (a recipe's data.root wins)")
    train: Optional[str] = Field(None, description="folder or .zip in ImageFolder layout, relative to root")
    val: Optional[str] = None
    num_classes: Optional[int] = Field(None, gt=0)
    classes: Optional[list[str]] = Field(
        None, description="class names in label order (the data's folders, sorted); exports carry them"
    )
    image_size: int = Field(32, gt=0)
    mean: list[float] = Field(default_factory=lambda: [0.485, 0.456, 0.406])
    std: list[float] = Field(default_factory=lambda: [0.229, 0.224, 0.225])
    interpolation: Literal["bilinear", "bicubic", "nearest"] = Field(
        "bilinear", description="how images are resized to image_size (a pretrained model card's wins)"
    )
    hflip: bool = True
    train_crop: Literal["pad", "resized"] = "pad"
    # video
    num_frames: int = Field(8, gt=0, description="frames per clip (video)")
    sampler: Optional[str] = Field(
        None,
        description="video: tsn (default), dense, keyframes, motion; points: fps (default), voxel, random, uniform",
    )
    sampler_options: dict[str, Any] = Field(
        default_factory=dict, description="e.g. {stride: 2} for dense, {voxel_size: 0.03} for voxel"
    )
    resize: Optional[int] = Field(
        None, gt=0, description="short side frames are decoded at, >= image_size (default image_size)"
    )
    # points
    num_points: int = Field(1024, gt=0, description="points per cloud the model sees (points)")
    cache_points: int = Field(
        2048, gt=0, description="points per file kept in the cache (farthest-point sampled), >= num_points"
    )
    mesh_points: int = Field(4096, gt=0, description="points sampled on a mesh's surface (OFF, OBJ, STL, PLY meshes)")
    bin_width: Optional[int] = Field(
        None, ge=3, description="float32 values per .bin record (KITTI 4, nuScenes 5); default: guessed per file"
    )
    channels: int = Field(3, ge=3, description="values per point fed to the model: xyz, then colour/intensity")
    up_axis: Literal["x", "y", "z"] = "z"
    augment: PointAugment = Field(default_factory=PointAugment)
    cache_dir: str = Field(
        "runs/cache",
        description="where sampled clouds (points) and decoded images too large for memory are cached "
        "(generated data caches beside itself)",
    )
    generate: dict[str, Any] = Field(default_factory=dict, description="parameters of a generated dataset")
    description: str = ""

    def sampler_name(self, config) -> str | None:
        """The sampler a run uses: the recipe's (data.sampler), the card's, else the modality's
        default (tsn for video, fps for points)."""
        return config.sampler or self.sampler or {"video": "tsn", "points": "fps"}.get(self.modality)


def get_card(name: str) -> DatasetCard:
    files = card_files("data")
    if name in files:
        return load_card(files[name], DatasetCard, name)
    if name in DATASETS:  # a registered reader needs no card
        return DatasetCard(name=name, source=name)
    raise EffvisionError(suggest(name, sorted(set(files) | set(DATASETS.names())), "dataset"))
