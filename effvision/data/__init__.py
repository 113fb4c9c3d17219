"""Datasets by card name: load_dataset() gives train/val splits, transforms and loaders."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from ..errors import EffvisionError
from ..progress import track
from ..recipe import DataConfig
from ..registry import DATASETS

# Importing a module registers what it defines: the readers (DATASETS), samplers (SAMPLERS), selectors.
from . import selectors  # noqa: F401
from .cards import DatasetCard, get_card
from .decision import DecisionSplit, resolve_size, split_indices
from .images import builtin as image_readers  # noqa: F401
from .images.folders import cache_budget
from .images.transforms import eval_transform, train_transform
from .points import datasets as point_readers  # noqa: F401
from .points import samplers as point_samplers  # noqa: F401
from .points.batches import PointBatches, point_batches_possible
from .points.transforms import PointTrainTransform, point_eval_transform
from .tensor_batches import ShuffledBatches, TensorBatches, decoded_bytes, mapped_images, stack_images
from .timing import NO_SPLIT
from .video import datasets as video_readers  # noqa: F401
from .video import frame_samplers  # noqa: F401
from .video.transforms import video_eval_transform, video_train_transform


class Subset(torch.utils.data.Subset):
    """A subset that keeps `targets`, `classes` and the scan report of its parent."""

    def __init__(self, parent: Dataset, indices: list[int]):
        super().__init__(parent, indices)
        self.targets = [parent.targets[i] for i in indices]
        self.classes, self.report = parent.classes, parent.report


def stratified_subset(ds: Dataset, n: int | None, seed: int = 0) -> Dataset:
    if n is None or n >= len(ds):
        return ds
    from sklearn.model_selection import train_test_split

    stratify = ds.targets if n >= len(set(ds.targets)) else None  # fewer samples than classes: plain random
    idx, _ = train_test_split(list(range(len(ds))), train_size=n, stratify=stratify, random_state=seed)
    return Subset(ds, sorted(idx))


@dataclass
class DatasetBundle:
    name: str
    modality: str
    card: DatasetCard
    config: DataConfig
    train: Dataset
    val: Dataset
    classes: list[str]
    train_weights: Optional[torch.Tensor] = None  # per training sample loss weights (a weighted coreset); None: uniform
    decision: Optional[DecisionSplit] = None  # the slice held out for decisions (None or empty: none held out)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_size(self) -> list[int]:
        size = self.card.image_size
        if self.modality == "points":
            return [self.card.channels, self.config.num_points or self.card.num_points]
        return (
            [3, self.config.num_frames or self.card.num_frames, size, size]
            if self.modality == "video"
            else [3, size, size]
        )

    @property
    def bad_samples(self) -> list[tuple[str, str]]:
        seen = {id(self.train.report): self.train.report, id(self.val.report): self.val.report}
        return [b for r in seen.values() for b in r.bad]

    def summary(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "modality": self.modality,
            "train_size": len(self.train),
            "val_size": len(self.val),
            "decision": self.decision.summary() if self.decision else None,
            "num_classes": self.num_classes,
            "bad_samples": len(self.bad_samples),
        }
        if self.modality in ("video", "points"):
            out["sampler"] = self.card.sampler_name(self.config)
        if self.modality == "video":
            out["frames_per_clip"] = self.input_size[1]
        if self.modality == "points":
            out.update(root_dataset(self.train).summary())
        return out

    def train_loader(
        self,
        batch_size: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        with_index: bool = False,
        rank: int = 0,
        world: int = 1,
        persistent: bool = True,
    ) -> DataLoader:
        """Shuffled, augmented training batches; with_index adds each sample's index in the split
        (the loop uses it for sample weights and per-sample statistics). With world > 1 a
        distributed sampler gives this rank its share (call loader.sampler.set_epoch each epoch).
        persistent=False starts the workers anew each epoch, seeded from the loader's generator:
        an epoch's augmentations then follow from that generator's state alone, which a resumed
        training restores (persistent workers carry their random state across epochs)."""
        bs = batch_size or self.config.batch_size
        ds = Transformed(self.train, self.train_tf, with_index)
        sampler = None
        if world > 1:
            sampler = torch.utils.data.DistributedSampler(
                ds, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
            )
            shuffle = False
        return DataLoader(
            ds,
            batch_size=bs,
            shuffle=shuffle,
            sampler=sampler,
            drop_last=len(self.train) // world > bs,
            num_workers=self.config.num_workers,
            generator=torch.Generator().manual_seed(seed),
            persistent_workers=persistent and self.config.num_workers > 0,
        )

    def batched_train_loader(
        self,
        batch_size: int | None,
        device: torch.device,
        seed: int = 0,
        translate: int | None = None,
        rank: int = 0,
        world: int = 1,
        required: bool = False,
    ) -> ShuffledBatches | None:
        """Training batches made and augmented a whole batch at a time: images from the split held
        as a uint8 tensor on `device` (or, when it does not fit the memory budget, from a decoded,
        memory-mapped cache on disk), point clouds from their cache. None where the data needs the
        per-sample path (video; images cropped `resized`; the voxel sampler), an error then if required."""
        c, bs = self.card, batch_size or self.config.batch_size
        why = None
        if self.modality == "video":
            why = f"dataset {self.name} is video: its clips are decoded per sample"
        elif self.modality == "image" and c.train_crop != "pad":
            why = f"batched images augment by translation; dataset {self.name} asks for train_crop: {c.train_crop}"
        elif self.modality == "points" and not point_batches_possible(self.train):
            why = f"the {c.sampler_name(self.config)} sampler picks each cloud's points on its own"
        if why:
            if required:
                raise EffvisionError(f"tensor_data: {why} (turn tensor_data off)")
            return None
        if self.modality == "points":
            return PointBatches(self.train, c.augment, c.up_axis, bs, device, seed, rank, world)
        common = dict(seed=seed, hflip=c.hflip, translate=c.image_size // 8 if translate is None else translate)
        common.update(rank=rank, world=world)
        if decoded_bytes(self.train, c.image_size) <= cache_budget():
            images = stack_images(self.train, c.image_size, c.interpolation)
            return TensorBatches(images, self.train.targets, c.mean, c.std, bs, device, **common)
        images, rows = mapped_images(self.train, c.image_size, c.cache_dir, track, c.interpolation)
        return TensorBatches(images, self.train.targets, c.mean, c.std, bs, device, rows=rows, **common)

    def val_loader(self, batch_size: int | None = None) -> DataLoader:
        return DataLoader(
            Transformed(self.val, self.eval_tf),
            batch_size=batch_size or self.config.eval_batch_size,
            shuffle=False,
            num_workers=self.config.num_workers,
        )

    def train_eval_loader(self, indices: Sequence[int] | None = None, batch_size: int | None = None) -> DataLoader:
        """Training samples (all, or these indices) in order, with evaluation transforms: what a
        model is scored on for selection, and what the deployed model will see (calibration)."""
        ds = self.train if indices is None else torch.utils.data.Subset(self.train, list(indices))
        return DataLoader(
            Transformed(ds, self.eval_tf),
            batch_size=batch_size or self.config.eval_batch_size,
            shuffle=False,
            num_workers=self.config.num_workers,
        )

    def decision_loader(self, n: int | None = None, seed: int = 0, batch_size: int | None = None) -> DataLoader:
        """The decision split (all of it, or a stratified n of it), with evaluation transforms: the
        only data a choice may be scored on. A run with none held out stops here with one line."""
        if not self.decision:
            raise EffvisionError(
                f"this run holds out no training samples for its decisions (data.holdout: {self.config.holdout}): "
                "set data.holdout (e.g. 0.1) so no choice is made on the validation split or on training images"
            )
        picked = stratified_subset(self.decision.dataset, n, seed)
        return DataLoader(
            Transformed(picked, self.eval_tf),
            batch_size=batch_size or self.config.eval_batch_size,
            shuffle=False,
            num_workers=self.config.num_workers,
        )

    def decision_size(self, n: int | None = None) -> int:
        """How many samples decision_loader(n) scores."""
        held = len(self.decision) if self.decision else 0
        return held if n is None else min(n, held)

    def with_train_subset(self, indices: Sequence[int], weights: Optional[Sequence[float]] = None) -> "DatasetBundle":
        """This bundle training on a subset of its training split (a selected coreset)."""
        w = None if weights is None else torch.as_tensor(weights, dtype=torch.float32)
        return replace(self, train=Subset(self.train, [int(i) for i in indices]), train_weights=w)

    @property
    def train_tf(self):
        c = self.card
        if self.modality == "video":
            return video_train_transform(c.image_size, c.mean, c.std, c.hflip, c.train_crop)
        if self.modality == "points":
            return PointTrainTransform(c.augment, c.up_axis)
        return train_transform(c.image_size, c.mean, c.std, c.hflip, c.train_crop, c.interpolation)

    @property
    def eval_tf(self):
        c = self.card
        if self.modality == "video":
            return video_eval_transform(c.image_size, c.mean, c.std)
        if self.modality == "points":
            return point_eval_transform
        return eval_transform(c.image_size, c.mean, c.std, interpolation=c.interpolation)


def root_dataset(ds: Dataset) -> Dataset:
    """The dataset under any Subset."""
    return root_dataset(ds.dataset) if isinstance(ds, torch.utils.data.Subset) else ds


class Transformed(Dataset):
    """Applies a transform on top of a dataset (uint8 images or clips, float point clouds)."""

    def __init__(self, ds: Dataset, transform, with_index: bool = False):
        self.ds, self.transform, self.with_index = ds, transform, with_index

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        img, y = self.ds[i]
        with getattr(root_dataset(self.ds), "split", NO_SPLIT)("augment"):  # a benchmark's TimeSplit
            img = self.transform(img)
        return (img, y, i) if self.with_index else (img, y)


def resolved_card(config: DataConfig, preprocessing=None) -> DatasetCard:
    """The dataset card as a run uses it: data.image_size over the card's, and a pretrained
    model card's mean, std and interpolation for images (see load_dataset)."""
    card = get_card(config.name)
    if config.image_size:
        card = card.model_copy(update={"image_size": config.image_size})
    if preprocessing is not None and card.modality == "image":
        keep = {k: getattr(preprocessing, k) for k in ("mean", "std", "interpolation")}
        card = card.model_copy(update=keep)
    return card


def load_dataset(
    config: DataConfig | str | None = None, seed: int = 0, preprocessing=None, decides: bool = False
) -> DatasetBundle:
    """Open a dataset by card name (e.g. 'digits', 'cifar10') or a DataConfig from a recipe.
    `preprocessing` (a pretrained model card's): its mean, std and interpolation replace the
    dataset card's for images, since the weights were trained on inputs normalised so; the size
    stays the dataset's (or data.image_size), the resolution being the recipe's choice.
    `decides`: the run has a stage that makes choices, so data.holdout's default holds some out."""
    if config is None or isinstance(config, str):
        config = DataConfig(name=config or "digits")
    card = resolved_card(config, preprocessing)
    reader = DATASETS.get(card.source)
    train, val = reader(card, config, progress=track)
    if train.classes != val.classes:
        raise EffvisionError(
            f"dataset {card.name}: train and val have different classes ({len(train.classes)} vs {len(val.classes)})"
        )
    if card.num_classes and card.num_classes != len(train.classes):
        raise EffvisionError(
            f"dataset {card.name}: the card says {card.num_classes} classes, the data has {len(train.classes)}"
        )
    if card.classes and card.classes != list(train.classes):
        raise EffvisionError(
            f"dataset {card.name}: the card's classes ({', '.join(card.classes[:4])}, ...) are not the data's "
            f"({', '.join(list(train.classes)[:4])}, ...)"
        )
    kept, held = split_indices(
        list(train.targets), resolve_size(config.holdout, len(train), decides), config.holdout_seed
    )
    decision = DecisionSplit(Subset(train, held), held, config.holdout_seed, len(train)) if held else None
    if held:
        train = Subset(train, kept)
    train = stratified_subset(train, config.max_train_samples, seed)
    val = stratified_subset(val, config.max_val_samples, seed)
    return DatasetBundle(card.name, card.modality, card, config, train, val, list(train.classes), decision=decision)
