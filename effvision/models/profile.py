"""Model size and cost: parameters, MACs (torch-pruning's counter) and bytes on disk."""
from __future__ import annotations

import torch
from torch import nn


def input_shape(model: nn.Module) -> list[int]:
    return list(getattr(model, "effvision_spec", {}).get("input_size") or [3, 32, 32])


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def count_macs(model: nn.Module, shape: list[int] | None = None) -> int:
    import torch_pruning as tp

    x = torch.zeros(1, *(shape or input_shape(model)), device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    macs, _ = tp.utils.count_ops_and_params(model, x)
    model.train(was_training)
    return int(macs)
