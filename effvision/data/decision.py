"""The decision split: a fixed, stratified slice of the training split held out at load time.

Every choice a run makes (a plan's lever, pruned widths, where pruning stops, the int8 reverts,
int8 or fp32, a search trial's score) is scored on this slice; no stage trains on it, and the
validation split is read only for the figures the report prints. It is cut before selection and
`max_train_samples`, from the whole training split in the reader's (sorted) order, by a seed of its
own, so the same recipe data always holds out the same images, and a zoo card can record which
images it never saw (`sha256` of the indices)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from torch.utils.data import Dataset

from ..errors import EffvisionError

DEFAULT_FRACTION = 0.1  # of the training split, where a recipe that decides names no size
DEFAULT_MAX = 5000  # enough for a 0.5-point floor to be read at about +-0.3 points (one sigma at 92 %)
MIN_PER_CLASS = 2  # fewer cannot be stratified


def indices_sha256(indices: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, sorted(indices))).encode()).hexdigest()[:16]


def resolve_size(holdout: int | float | None, n_train: int, decides: bool) -> int:
    """How many training samples to hold out: a count, a fraction of the split, or (None) the
    default where the recipe has a stage that decides and none where it only trains."""
    if holdout is None:
        return min(DEFAULT_MAX, round(DEFAULT_FRACTION * n_train)) if decides else 0
    n = round(holdout * n_train) if isinstance(holdout, float) and holdout < 1 else int(holdout)
    if n >= n_train:
        raise EffvisionError(
            f"data.holdout: {holdout} holds out {n} of the {n_train} training samples: nothing would be left "
            "to train on"
        )
    return n


def split_indices(targets: list[int], n: int, seed: int) -> tuple[list[int], list[int]]:
    """(kept for training, held out) indices: n held out, stratified by class."""
    from sklearn.model_selection import train_test_split

    everything = list(range(len(targets)))
    if n == 0:
        return everything, []
    classes = len(set(targets))
    if n < MIN_PER_CLASS * classes:
        raise EffvisionError(
            f"data.holdout: {n} samples cannot hold out {MIN_PER_CLASS} of each of the {classes} classes "
            f"(ask for at least {MIN_PER_CLASS * classes})"
        )
    kept, held = train_test_split(everything, test_size=n, stratify=targets, random_state=seed)
    return sorted(kept), sorted(held)


@dataclass
class DecisionSplit:
    """The held-out slice (a Subset of the whole training split) and how it was cut."""

    dataset: Dataset
    indices: list[int]  # into the whole training split, in the reader's order
    seed: int
    of: int  # the whole training split's size
    starting_model: str | None = None  # whether the model a run starts from has seen these images

    def __len__(self) -> int:
        return len(self.indices)

    def summary(self) -> dict:
        """What report.json and a zoo card record of it."""
        return {
            "n": len(self.indices),
            "of": self.of,
            "seed": self.seed,
            "stratified": True,
            "sha256": indices_sha256(self.indices),
            **({"starting_model": self.starting_model} if self.starting_model else {}),
        }
