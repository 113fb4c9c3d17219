"""Model size and cost: parameters, MACs (torch-pruning's counter) and bytes on disk."""

from __future__ import annotations

import torch
from torch import nn


def input_shape(model: nn.Module) -> list[int]:
    return list(getattr(model, "effvision_spec", {}).get("input_size") or [3, 32, 32])


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _subclass_counters(model: nn.Module, known: dict) -> dict:
    """Counters for subclasses of the layer types torch-pruning knows: it matches exact types, so
    torchvision's Conv3DSimple (an nn.Conv3d) would otherwise count as free (R3D-18: 0.78 of ~20 GMACs)."""
    out = {}
    for t in {type(m) for m in model.modules()} - set(known):
        base = next((b for b in t.__mro__[1:] if b in known), None)
        if base is not None:
            out[t] = known[base]
    return out


@torch.no_grad()
def count_macs(model: nn.Module, shape: list[int] | None = None) -> int:
    import torch_pruning as tp
    from torch_pruning.utils import op_counter

    x = torch.zeros(1, *(shape or input_shape(model)), device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    op_counter.CUSTOM_MODULES_MAPPING = _subclass_counters(model, op_counter.MODULES_MAPPING)  # reset by the call
    macs, _ = tp.utils.count_ops_and_params(model, x)
    model.train(was_training)
    return int(macs)
