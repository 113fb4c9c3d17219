"""Coreset selectors: which training samples to keep for a budget, chosen from signals a model
gives (labels, penultimate embeddings, class probabilities, forgetting counts), so every selector
works the same on images, videos and point clouds. Registered in SELECTORS.

Each selector returns indices into the split it was given (and, for gradient clustering, a weight
per kept sample). Score-based selectors keep the highest scores (the hardest or least certain
samples), as their papers do; `keep: easy` takes the other end, which small budgets may prefer
(Sorscher et al., "Beyond neural scaling laws", 2022).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Optional, Union

import numpy as np
import torch
from pydantic import AfterValidator, Field, StrictInt

from ..errors import EffvisionError
from ..recipe import Strict
from ..registry import SELECTORS


def known_selector(name: str) -> str:
    SELECTORS.get(name)  # unknown: a one-line error naming close matches
    return name


SelectorName = Annotated[str, AfterValidator(known_selector)]
Budget = Union[StrictInt, float]  # an int is a count of samples, a float a fraction of the split


class CalibrationConfig(Strict):
    """Which training samples calibrate int8 activations: `n` of them chosen by `selector`,
    scored by the model being quantized (no proxy training)."""

    selector: SelectorName = Field(
        "class_balanced", description="a registered selector (kcenter, herding, random, ...)"
    )
    n: int = Field(256, gt=0, description="calibration samples")
    pool: int = Field(
        4096,
        gt=0,
        description="a selector that scores samples sees this many (class-balanced at random), "
        "which bounds its cost on large datasets",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="the selector's own options (e.g. keep: easy)")


@dataclass
class Signals:
    """What selectors look at, one row per sample of the split being selected from."""

    targets: np.ndarray  # (N,) int labels
    num_classes: int
    embeddings: Optional[np.ndarray] = None  # (N, D) penultimate features of the (proxy) model
    probs: Optional[np.ndarray] = None  # (N, C) softmax of the (proxy) model, averaged over proxy runs
    el2n: Optional[np.ndarray] = None  # (N,) ||softmax - onehot||_2, averaged over proxy runs
    forgetting: Optional[np.ndarray] = None  # (N,) forgetting events during proxy training; inf = never learned

    def __len__(self) -> int:
        return len(self.targets)

    def require(self, *names: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise EffvisionError(f"this selector needs {', '.join(missing)} from a proxy model, which was not computed")

    def onehot(self) -> np.ndarray:
        return np.eye(self.num_classes, dtype=np.float32)[self.targets]

    def grad_embeddings(self) -> np.ndarray:
        """Per-sample gradient of the cross-entropy with respect to the last linear layer
        (weights and bias): (p - y) outer [h, 1] (BADGE, Ash et al. 2020), flattened."""
        self.require("probs", "embeddings")
        err = self.probs - self.onehot()
        h = np.concatenate([self.embeddings, np.ones((len(self), 1), np.float32)], 1)
        return (err[:, :, None] * h[:, None, :]).reshape(len(self), -1)


@dataclass
class Selection:
    indices: np.ndarray  # sorted indices into the split
    weights: Optional[np.ndarray] = None  # per kept sample, mean 1 (None: uniform)


@dataclass(frozen=True)
class Selector:
    fn: Callable[..., Selection]
    needs: tuple[str, ...]  # Signals fields beyond the labels
    min_proxy_epochs: int  # forgetting events need at least two presentations of each sample
    summary: str

    def options(self) -> list[str]:
        return [p for p in inspect.signature(self.fn).parameters if p not in ("signals", "n", "rng")]


def register_selector(name: str, needs: tuple[str, ...] = (), min_proxy_epochs: int = 0):
    def add(fn: Callable) -> Callable:
        SELECTORS.register(name, Selector(fn, needs, min_proxy_epochs, (fn.__doc__ or "").strip().splitlines()[0]))
        return fn

    return add


def resolve_budget(budget: float | int, size: int) -> int:
    """A fraction in (0, 1] of the split, or a count (an int) of at most its size."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise EffvisionError(f"budget {budget!r}: give a fraction in (0, 1] or a sample count")
    if isinstance(budget, int):
        if not 0 < budget <= size:
            raise EffvisionError(f"budget {budget}: a count must be between 1 and the dataset size ({size})")
        return budget
    if not 0 < budget <= 1:
        raise EffvisionError(
            f"budget {budget}: a fraction must be in (0, 1] (or give a whole count of samples, at most {size})"
        )
    return max(1, round(budget * size))


def select(name: str, signals: Signals, budget: float | int, seed: int = 0, **options) -> Selection:
    """Run a registered selector for a budget; unknown names and options are one-line errors."""
    sel: Selector = SELECTORS.get(name)
    unknown = sorted(set(options) - set(sel.options()))
    if unknown:
        raise EffvisionError(
            f"selector '{name}': unknown option {', '.join(unknown)} (options: {', '.join(sel.options()) or 'none'})"
        )
    n = resolve_budget(budget, len(signals))
    signals.require(*sel.needs)
    out = sel.fn(signals, n, np.random.default_rng(seed), **options)
    order = np.argsort(out.indices, kind="stable")
    weights = None if out.weights is None else out.weights[order] / out.weights.mean()
    return Selection(np.asarray(out.indices)[order].astype(np.int64), weights)


# ----------------------------------------------------------------------------- helpers
def class_quota(targets: np.ndarray, n: int, num_classes: int) -> np.ndarray:
    """Samples per class for a budget of n, proportional to class sizes (largest remainder)."""
    counts = np.bincount(targets, minlength=num_classes)
    exact = counts * n / counts.sum()
    quota = np.floor(exact).astype(int)
    for c in np.argsort(-(exact - quota), kind="stable")[: n - quota.sum()]:
        quota[c] += 1
    return np.minimum(quota, counts)


def _top(scores: np.ndarray, n: int, keep: str, rng) -> np.ndarray:
    if keep not in ("hard", "easy"):
        raise EffvisionError(f"keep: '{keep}' (choices: hard, easy)")
    jitter = rng.random(len(scores)) * 1e-9  # break ties (e.g. equal forgetting counts) at random
    order = np.argsort(
        -(np.nan_to_num(np.asarray(scores, np.float64), posinf=np.finfo(np.float64).max) + jitter), kind="stable"
    )
    return order[:n] if keep == "hard" else order[::-1][:n]


def _unit(x: np.ndarray) -> torch.Tensor:
    t = torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32)
    return t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)


# ----------------------------------------------------------------------------- selectors
@register_selector("random")
def random_subset(signals: Signals, n: int, rng) -> Selection:
    """Uniformly random samples (the baseline every study includes)."""
    return Selection(rng.choice(len(signals), n, replace=False))


@register_selector("class_balanced")
def class_balanced(signals: Signals, n: int, rng) -> Selection:
    """Random samples, each class kept in proportion to its size."""
    quota = class_quota(signals.targets, n, signals.num_classes)
    picks = [rng.choice(np.flatnonzero(signals.targets == c), q, replace=False) for c, q in enumerate(quota) if q]
    return Selection(np.concatenate(picks))


@register_selector("herding", needs=("embeddings",))
def herding(signals: Signals, n: int, rng) -> Selection:
    """Per class, greedily add the sample that keeps the kept set's mean embedding closest to the
    class mean (Welling 2009, as iCaRL uses it)."""
    emb = _unit(signals.embeddings)
    picks = []
    for c, q in enumerate(class_quota(signals.targets, n, signals.num_classes)):
        idx = np.flatnonzero(signals.targets == c)
        if not q:
            continue
        x = emb[idx]
        target, total = x.mean(0), torch.zeros_like(x[0])
        free = torch.ones(len(idx), dtype=torch.bool)
        for k in range(1, q + 1):
            gap = ((target * k - total)[None] - x).norm(dim=1)  # distance of the mean after adding each candidate
            gap[~free] = float("inf")
            j = int(gap.argmin())
            free[j], total = False, total + x[j]
            picks.append(idx[j])
    return Selection(np.asarray(picks))


@register_selector("kcenter", needs=("embeddings",))
def kcenter(signals: Signals, n: int, rng) -> Selection:
    """k-center greedy (Sener & Savarese 2018): repeatedly add the sample farthest from every
    sample kept so far, so the kept set covers the embedding space."""
    x = torch.as_tensor(np.ascontiguousarray(signals.embeddings), dtype=torch.float32)
    first = int(rng.integers(len(x)))
    picks = [first]
    dist = (x - x[first]).pow(2).sum(1)
    for _ in range(n - 1):
        j = int(dist.argmax())
        picks.append(j)
        dist = torch.minimum(dist, (x - x[j]).pow(2).sum(1))
    return Selection(np.asarray(picks))


@register_selector("el2n", needs=("el2n",))
def el2n(signals: Signals, n: int, rng, keep: str = "hard") -> Selection:
    """Largest EL2N scores, the error norm ||softmax - onehot|| of a briefly trained proxy
    (Paul et al., "Deep Learning on a Data Diet", 2021)."""
    return Selection(_top(signals.el2n, n, keep, rng))


@register_selector("grand", needs=("probs", "embeddings"))
def grand(signals: Signals, n: int, rng, keep: str = "hard") -> Selection:
    """Largest GraNd scores, the per-sample gradient norm (Paul et al. 2021), here of the last
    linear layer: ||p - y|| * ||[h, 1]||, which needs no per-sample backward pass."""
    err = np.linalg.norm(signals.probs - signals.onehot(), axis=1)
    feat = np.sqrt((signals.embeddings.astype(np.float64) ** 2).sum(1) + 1)
    return Selection(_top(err * feat, n, keep, rng))


@register_selector("forgetting", needs=("forgetting",), min_proxy_epochs=2)
def forgetting(signals: Signals, n: int, rng, keep: str = "hard") -> Selection:
    """Most forgetting events (correct, then wrong) while a proxy trains; samples never learned
    count as forgotten most (Toneva et al., ICLR 2019). Needs at least 2 proxy epochs."""
    return Selection(_top(signals.forgetting, n, keep, rng))


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(np.clip(p, 1e-12, 1))).sum(1)


@register_selector("entropy", needs=("probs",))
def entropy(signals: Signals, n: int, rng, keep: str = "hard") -> Selection:
    """Highest predictive entropy of the proxy (least certain first)."""
    return Selection(_top(_entropy(signals.probs), n, keep, rng))


@register_selector("margin", needs=("probs",))
def margin(signals: Signals, n: int, rng, keep: str = "hard") -> Selection:
    """Smallest gap between the proxy's two most likely classes (least certain first)."""
    top2 = np.sort(signals.probs, axis=1)[:, -2:]
    return Selection(_top(-(top2[:, 1] - top2[:, 0]), n, keep, rng))


@register_selector("gradient_clusters", needs=("probs", "embeddings"))
def gradient_clusters(signals: Signals, n: int, rng, dims: int = 64) -> Selection:
    """Redundancy-aware sampling: per class, cluster the last-layer gradient embeddings into as
    many clusters as the class's quota (k-means) and keep the sample nearest each centre, weighted
    by its cluster's size, so the kept gradients sum like the whole class's (in the spirit of
    CRAIG, Mirzasoleiman et al. 2020). Embeddings wider than `dims` are randomly projected first
    (Johnson-Lindenstrauss), which keeps k-means affordable."""
    from sklearn.cluster import KMeans

    g = signals.grad_embeddings()
    if g.shape[1] > dims:
        g = g @ (rng.standard_normal((g.shape[1], dims)).astype(np.float32) / math.sqrt(dims))
    picks, weights = [], []
    for c, q in enumerate(class_quota(signals.targets, n, signals.num_classes)):
        idx = np.flatnonzero(signals.targets == c)
        if not q:
            continue
        if q >= len(idx):
            picks.append(idx)
            weights.append(np.ones(len(idx)))
            continue
        km = KMeans(n_clusters=q, init="random", n_init=1, max_iter=20, random_state=int(rng.integers(2**31))).fit(
            g[idx]
        )
        reps, sizes = _nearest_members(g[idx], km.cluster_centers_, km.labels_)
        picks.append(idx[reps])
        weights.append(sizes)
    return Selection(np.concatenate(picks), np.concatenate(weights))


def _nearest_members(x: np.ndarray, centres: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The member of each (non-empty) cluster nearest its centre, and the cluster's size."""
    dist = ((x - centres[labels]) ** 2).sum(1)
    order = np.lexsort((dist, labels))  # by cluster, nearest first
    first = np.r_[True, labels[order][1:] != labels[order][:-1]]
    sizes = np.bincount(labels)[labels[order][first]]
    return order[first], sizes.astype(np.float64)
