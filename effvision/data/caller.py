"""Data the caller holds (effvision.compress on any Dataset or DataLoader): (input, label) pairs
already in the form the model takes, so no transform is applied; the input shape is read from the
first sample, the classes from the labels. Checked before any long work: a sample that is not a
tensor and a label, inputs of differing shapes, labels outside 0..classes-1."""

from __future__ import annotations

import contextlib
import hashlib
import random
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..errors import EffvisionError
from ..models.caller import tensor_bytes
from ..recipe import DataConfig
from . import DatasetBundle, Subset
from .cards import DatasetCard
from .decision import DecisionSplit, resolve_size, split_indices
from .layouts import ScanReport
from .timing import NO_SPLIT

CALLER_DATA = "caller"
SAMPLED = 64  # items hashed into the data's identity (spread over each split), besides the sizes


class CallerSplit(Dataset):
    """One split of the caller's data, with the `targets`, `classes` and `report` effvision's
    datasets carry (labels read once, here)."""

    def __init__(self, ds: Dataset, split: str, classes: Optional[list[str]] = None):
        self.ds, self.split_name = ds, split
        try:
            n = len(ds)
        except TypeError:
            raise EffvisionError(
                f"{split} data: an iterable-style dataset has no length; give a map-style Dataset"
            ) from None
        if n == 0:
            raise EffvisionError(f"{split} data is empty")
        given = getattr(ds, "targets", None)  # ImageFolder's and most datasets': no decoding needed
        if given is not None and len(given) == n:
            self.targets = [_label((None, y), split, i) for i, y in enumerate(given)]
        else:
            self.targets = [_label(self._item(i), split, i) for i in range(n)]
        self.classes = classes or [str(c) for c in range(max(self.targets) + 1)]
        self.report = ScanReport(total=n)
        self.split = NO_SPLIT

    def _item(self, i: int):
        item = self.ds[i]
        if not isinstance(item, (tuple, list)) or len(item) < 2:
            raise EffvisionError(
                f"{self.split_name} data: item {i} is {type(item).__name__}, not an (input, label) pair"
            )
        return item

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i):
        x, y = self._item(i)[:2]
        if not isinstance(x, (torch.Tensor, np.ndarray)):
            raise EffvisionError(
                f"{self.split_name} data: item {i}'s input is a {type(x).__name__}, not a tensor; give the dataset "
                "a transform that makes one (e.g. torchvision.transforms.ToTensor())"
            )
        return torch.as_tensor(x), int(y)


def _label(item, split: str, i: int) -> int:
    y = item[1]
    if isinstance(y, torch.Tensor):
        if y.numel() != 1:
            raise EffvisionError(
                f"{split} data: item {i}'s label has shape {tuple(y.shape)}; a class index is expected"
            )
        y = y.item()
    if isinstance(y, float) and not y.is_integer() or not isinstance(y, (int, float)) or isinstance(y, bool):
        raise EffvisionError(f"{split} data: item {i}'s label is {y!r}; a class index (int) is expected")
    if y < 0:
        raise EffvisionError(f"{split} data: item {i}'s label is {int(y)}; class indices start at 0")
    return int(y)


def _dataset(data: Any, split: str) -> tuple[Dataset, Optional[int]]:
    if isinstance(data, DataLoader):
        return data.dataset, data.batch_size
    if isinstance(data, Dataset) or hasattr(data, "__getitem__"):
        return data, None
    raise EffvisionError(f"{split}: a torch Dataset or DataLoader is expected, got {type(data).__name__}")


@dataclass
class CallerBundle(DatasetBundle):
    """A DatasetBundle over the caller's splits: inputs as given (no transforms, no batched path)."""

    shape: tuple = ()
    identity: dict = field(default_factory=dict)  # sizes, classes, input shape, hash of sampled items

    @property
    def input_size(self) -> list[int]:
        return list(self.shape)

    @property
    def train_tf(self):
        return _identity

    @property
    def eval_tf(self):
        return _identity

    def batched_train_loader(self, *args, required: bool = False, **kwargs):
        if required:
            raise EffvisionError("tensor_data: the caller's data is read per sample (turn tensor_data off)")
        return None

    def with_decision_split(self, decides: bool) -> "CallerBundle":
        """This bundle with its decision split cut from the caller's training data (data.holdout;
        by default only where a stage of the recipe decides)."""
        n = resolve_size(self.config.holdout, len(self.train), decides)
        if not n:
            return self
        kept, held = split_indices(list(self.train.targets), n, self.config.holdout_seed)
        split = DecisionSplit(Subset(self.train, held), held, self.config.holdout_seed, len(self.train))
        return replace(self, train=Subset(self.train, kept), decision=split)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "modality": self.modality,
            "train_size": len(self.train),
            "val_size": len(self.val),
            "decision": self.decision.summary() if self.decision else None,
            "num_classes": self.num_classes,
            "bad_samples": 0,
            "input_shape": self.input_size,
        }


def _identity(x):
    return x


def caller_data(
    train: Any, val: Any, config: Optional[dict] = None, classes: Optional[list[str]] = None
) -> CallerBundle:
    """The caller's train and val data as a bundle the stages read (labels and shapes checked);
    config: DataConfig fields (batch sizes; default batch: a DataLoader's, else 64)."""
    train_ds, loader_batch = _dataset(train, "train")
    val_ds, _ = _dataset(val, "val")
    classes = classes or getattr(train_ds, "classes", None)
    tr = CallerSplit(train_ds, "train", list(classes) if classes else None)
    va = CallerSplit(val_ds, "val", tr.classes)
    n = len(tr.classes)
    for split in (tr, va):
        top = max(split.targets)
        if top >= n:
            raise EffvisionError(
                f"{split.split_name} data: label {top} is out of range for {n} classes (0..{n - 1}); "
                "give classes=[...] or relabel"
            )
    # one pass over items spread over each split: every input has the first one's shape, and
    # their bytes are the data's identity (a re-run resumes only on the same data)
    shape, digest = tuple(tr[0][0].shape), hashlib.sha256()
    with _seeded():  # a split that augments at random (a train transform) gives the same bytes every call
        items = [(split, i, split[i]) for split in (tr, va) for i in _spread(len(split))]
    for split, i, (x, y) in items:
        if tuple(x.shape) != shape:
            raise EffvisionError(
                f"{split.split_name} data: item {i} has input shape {tuple(x.shape)}, item 0 of train {shape}; "
                "every input must have one shape"
            )
        digest.update(f"{i}:{y}:".encode())
        digest.update(tensor_bytes(x))
    if not shape:
        raise EffvisionError("train data: the inputs are scalars; a tensor per sample (e.g. C x H x W) is expected")
    modality = {3: "image", 4: "video", 2: "points"}.get(len(shape), "image")
    card = DatasetCard(name=CALLER_DATA, source=CALLER_DATA, modality=modality, num_classes=n)
    config = DataConfig(name=CALLER_DATA, **{"batch_size": loader_batch or 64, **(config or {})})
    identity = {
        "train_size": len(tr),
        "val_size": len(va),
        "classes": tr.classes,
        "input_shape": list(shape),
        "items": digest.hexdigest()[:16],
    }
    return CallerBundle(CALLER_DATA, modality, card, config, tr, va, list(tr.classes), shape=shape, identity=identity)


@contextlib.contextmanager
def _seeded(seed: int = 0):
    """torch's, numpy's and Python's random state fixed for a block, and given back after it."""
    state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        try:
            yield
        finally:
            random.setstate(state)
            np.random.set_state(np_state)


def _spread(n: int) -> list[int]:
    """Up to SAMPLED indices spread over 0..n-1, the first and last included."""
    if n <= SAMPLED:
        return list(range(n))
    return sorted({round(k * (n - 1) / (SAMPLED - 1)) for k in range(SAMPLED)})
