"""Scoring a training split for coreset selection: train a proxy model briefly (counting
forgetting events as it goes), then read every sample's embedding and class probabilities. The
signals feed the selectors of effvision.data.selectors, for any modality."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Optional

import numpy as np
import torch
from pydantic import Field

from ..data.selectors import Budget, CalibrationConfig, Selection, Signals, resolve_budget, select
from ..errors import EffvisionError
from ..registry import SELECTORS
from ..train.config import Optimizer, TrainSettings
from ..train.loop import fit


class ProxyConfig(TrainSettings):
    """The model that scores samples: a narrower copy of the current model (or of `model`, a
    smaller one), trained for `epochs` on the whole split (0: score with the model as it is),
    its scores read from its own training (Data Diet's early scores, without a pass of their own)."""

    model: Optional[str] = Field(
        None, description="a cheaper model to score with (zoo card or registered arch); default: the current model"
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the proxy's builder")
    width: float = Field(
        0.5,
        gt=0,
        le=1,
        description="the proxy's channels as a fraction of its model's (uniform pruning) when it trains; 1: as is",
    )
    epochs: int = Field(2, ge=0, description="epochs the proxy trains")
    runs: int = Field(1, ge=1, description="proxy runs (seeds) whose probabilities and EL2N scores are averaged")
    scores: Literal["training", "pass"] = Field(
        "training",
        description="training: probabilities and EL2N from each sample's logits at its last presentation in the "
        "proxy's training (no extra pass); pass: one evaluation pass over the split after training",
    )
    optimizer: Optimizer = Field("adamw", description="the proxy's optimizer")
    lr: float = Field(3e-3, gt=0, description="the proxy's peak learning rate")


@dataclass
class Scored:
    signals: Signals
    proxy_train_s: float = 0.0
    scoring_s: float = 0.0
    proxy_accuracy: list[float] = field(default_factory=list)


class ForgettingCounter:
    """Toneva et al.: a forgetting event is a sample classified correctly at one presentation and
    wrongly at the next; samples never classified correctly count as forgotten most (inf)."""

    def __init__(self, n: int):
        self.last = np.zeros(n, bool)
        self.learned = np.zeros(n, bool)
        self.events = np.zeros(n, np.int64)

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        i = idx.numpy()
        correct = (logits.argmax(1) == y).cpu().numpy()
        self.events[i] += self.last[i] & ~correct
        self.last[i] = correct
        self.learned[i] |= correct

    def counts(self) -> np.ndarray:
        return np.where(self.learned, self.events.astype(np.float64), np.inf)


class LastPresentation:
    """Each sample's softmax at its latest presentation in training (NaN rows: never presented)."""

    def __init__(self, n: int, num_classes: int):
        self.probs = np.full((n, num_classes), np.nan, np.float32)

    def __call__(self, idx: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        self.probs[idx.numpy()] = logits.float().softmax(1).cpu().numpy()

    def unseen(self) -> np.ndarray:
        return np.flatnonzero(np.isnan(self.probs[:, 0]))


@torch.inference_mode()
def embeddings_and_probs(model: torch.nn.Module, loader, device: torch.device) -> tuple[np.ndarray, np.ndarray]:
    """Penultimate features (the model contract's forward_head(pre_logits=True)) and softmax."""
    model.eval().to(device)
    embs, probs = [], []
    for x, _ in loader:
        feats = model.forward_features(x.to(device))
        embs.append(model.forward_head(feats, pre_logits=True).float().flatten(1).cpu())
        probs.append(model.forward_head(feats).float().softmax(1).cpu())
    return torch.cat(embs).numpy(), torch.cat(probs).numpy()


def needed_signals(selectors: list[str]) -> tuple[set[str], int]:
    """The signals a set of selectors looks at, and the fewest proxy epochs they need."""
    needs, min_epochs = set(), 0
    for name in selectors:
        sel = SELECTORS.get(name)
        needs |= set(sel.needs)
        min_epochs = max(min_epochs, sel.min_proxy_epochs)
    return needs, min_epochs


def score(
    data,
    selectors: list[str],
    proxy: ProxyConfig,
    make_proxy: Callable[[], torch.nn.Module],
    device: torch.device,
    seed: int = 0,
    label: str = "proxy",
) -> Scored:
    """Signals of data's training split for these selectors (no model at all when they need only labels)."""
    needs, min_epochs = needed_signals(selectors)
    targets = np.asarray(data.train.targets, dtype=np.int64)
    out = Scored(Signals(targets, data.num_classes))
    if not needs:
        return out
    if proxy.epochs < min_epochs:
        names = [s for s in selectors if SELECTORS.get(s).min_proxy_epochs > proxy.epochs]
        raise EffvisionError(
            f"selector {', '.join(names)} needs a proxy trained for at least {min_epochs} epochs (proxy.epochs is "
            f"{proxy.epochs})"
        )
    onehot = np.eye(data.num_classes, dtype=np.float32)[targets]
    probs_sum, el2n_sum, counters = 0.0, 0.0, []
    from_training = proxy.scores == "training" and proxy.epochs > 0
    emb = None
    for run in range(proxy.runs):
        # narrowed only when it trains: with epochs 0 the model scores as it is (make_proxy may give
        # the model being compressed itself, which must not change)
        model = narrowed(make_proxy(), proxy.width) if proxy.epochs else make_proxy()
        probs = None
        if proxy.epochs:
            counter, last = ForgettingCounter(len(targets)), LastPresentation(len(targets), data.num_classes)

            def record(idx, logits, y, counter=counter, last=last):
                counter(idx, logits, y)
                last(idx, logits, y)

            res = fit(
                model,
                data,
                proxy,
                device,
                seed=seed + 1000 * run,
                label=f"{label} {run + 1}/{proxy.runs}",
                on_batch=record,
            )
            out.proxy_train_s += res.train_s
            out.proxy_accuracy.append(res.accuracy)
            counters.append(counter)
            probs = last.probs if from_training else None
        start = time.perf_counter()
        if probs is None or "embeddings" in needs:
            emb, passed = embeddings_and_probs(model, data.train_eval_loader(), device)
            probs = passed if probs is None else probs
        unseen = last.unseen() if from_training else ()
        if len(unseen):  # the few a dropped last batch never showed: one small pass
            probs[unseen] = embeddings_and_probs(model, data.train_eval_loader(unseen), device)[1]
        out.scoring_s += time.perf_counter() - start
        probs_sum = probs_sum + probs
        el2n_sum = el2n_sum + np.linalg.norm(probs - onehot, axis=1)
    s = out.signals
    s.embeddings, s.probs, s.el2n = emb, probs_sum / proxy.runs, el2n_sum / proxy.runs
    if counters and proxy.epochs >= 2:
        learned = np.any([c.learned for c in counters], axis=0)
        s.forgetting = np.where(learned, np.sum([c.events for c in counters], axis=0).astype(np.float64), np.inf)
    return out


def narrowed(model: torch.nn.Module, width: float) -> torch.nn.Module:
    """The model with `width` of its channels (uniform structured pruning; the classifier keeps its outputs)."""
    if width >= 1:
        return model
    from .prune import prune

    return prune(model, 1 - width)


def choose(
    data,
    selector: str,
    budget: Budget,
    options: dict,
    proxy: ProxyConfig,
    make_proxy: Callable[[], torch.nn.Module],
    device: torch.device,
    seed: int = 0,
) -> tuple[Selection, Scored]:
    """Score data's training split for one selector and select `budget` samples of it."""
    resolve_budget(budget, len(data.train))  # a bad budget stops before any proxy training
    scored = score(data, [selector], proxy, make_proxy, device, seed, label=f"proxy for {selector}")
    return select(selector, scored.signals, budget, seed=seed, **options), scored


def proxy_factory(model: torch.nn.Module, proxy: ProxyConfig, data) -> Callable[[], torch.nn.Module]:
    """A fresh proxy per run: the named cheaper model, else a copy of `model` (left untouched)."""
    if proxy.model is None:
        return lambda: copy.deepcopy(model)
    from ..models import create_model

    return lambda: create_model(proxy.model, num_classes=data.num_classes, input_size=data.input_size, **proxy.kwargs)


def calibration_indices(
    data, cfg: CalibrationConfig, model: torch.nn.Module, device: torch.device, seed: int = 0
) -> np.ndarray:
    """Training-split indices of the calibration set, chosen by the model being quantized among a
    class-balanced random pool of at most cfg.pool samples."""
    n = min(cfg.n, len(data.train))
    pool = None
    if SELECTORS.get(cfg.selector).needs and len(data.train) > max(cfg.pool, n):
        pool = select(
            "class_balanced", Signals(np.asarray(data.train.targets), data.num_classes), max(cfg.pool, n), seed=seed
        ).indices
        data = data.with_train_subset(pool)
    scorer = ProxyConfig(epochs=0, width=1.0)  # the model being quantized, whole and untouched
    sel, _ = choose(data, cfg.selector, n, cfg.options, scorer, lambda: model, device, seed)
    return sel.indices if pool is None else pool[sel.indices]
