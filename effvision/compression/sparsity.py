"""Sparsity training before pruning (DepGraph, Fang et al. 2023): distillation from the model
entering the prune stage with torch-pruning's group-norm regulariser added to every batch's
gradients, so that whole channel groups, across every layer they span, shrink together and the
pruning that follows removes channels that carry little."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from ..progress import log
from ..recipe import Strict
from .finetune import finetune
from .latency_prune import channel_groups
from .prune import meta_pruner, traceable


class SparsitySettings(Strict):
    epochs: int = Field(0, ge=0, description="epochs of group-norm-regularised distillation before pruning; 0: none")
    reg: float = Field(5e-4, gt=0, description="the regulariser's coefficient (torch-pruning's GroupNormPruner reg)")


def low_half_share(model, ignore: list[str] | None = None) -> float:
    """The share of each channel group's L2 importance held by its less important half, averaged
    over the groups: 0.5 when all channels weigh alike, toward 0 as half of them fade."""
    shares = [g.scores[: g.width // 2].sum() / g.scores.sum() for g in channel_groups(model, "l2", ignore)]
    return float(np.mean(shares)) if shares else 0.5


def train_sparse(ctx, model, teacher, cfg) -> dict:
    """cfg: the PruneConfig (sparsity, ignore, finetune). Trains model in place; returns the record."""
    s = cfg.sparsity
    before = low_half_share(model, cfg.ignore)
    with traceable(model):
        pruner = meta_pruner(model, "l2", cfg.ignore, kind="GroupNormPruner", reg=s.reg)
    finetune(ctx, model, teacher, cfg.finetune, s.epochs, f"{cfg.name} sparsity", lambda: pruner.regularize(model))
    after = low_half_share(model, cfg.ignore)
    log(f"  sparsity training: the less important half of each group held {before:.1%} of its norm, now {after:.1%}")
    return {"epochs": s.epochs, "reg": s.reg, "low_half_share": {"before": round(before, 4), "after": round(after, 4)}}
