"""Structured channel pruning with torch-pruning's dependency graph: the result is a physically
smaller model (fewer channels), not a masked one."""
from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import EffvisionError
from ..models.adapters import classifier_of
from ..models.profile import input_shape

IMPORTANCE = ("l1", "l2", "bn_scale", "taylor")


def _importance(kind: str):
    import torch_pruning as tp

    if kind == "l1":
        return tp.importance.GroupMagnitudeImportance(p=1)
    if kind == "l2":
        return tp.importance.GroupMagnitudeImportance(p=2)
    if kind == "bn_scale":
        return tp.importance.BNScaleImportance()
    if kind == "taylor":
        return tp.importance.GroupTaylorImportance()
    raise EffvisionError(f"unknown importance '{kind}' (choices: {', '.join(IMPORTANCE)})")


def match_layers(model: nn.Module, patterns: list[str]) -> dict[str, nn.Module]:
    """Modules named exactly, or matched by a `re:` regular expression."""
    found = {}
    for pat in patterns:
        hits = {n: m for n, m in model.named_modules() if (re.fullmatch(pat[3:], n) if pat.startswith("re:") else n == pat)}
        if not hits:
            raise EffvisionError(f"no layer matches '{pat}' (layer names look like: {', '.join(list(dict(model.named_modules()))[1:6])}, ...)")
        found.update(hits)
    return found


def prune(model: nn.Module, ratio: float, importance: str = "l2", global_pruning: bool = False, layer_ratios: dict[str, float] | None = None,
          ignore: list[str] | None = None, round_to: int | None = None, iterative_steps: int = 1, calib_loader=None) -> nn.Module:
    """Remove `ratio` of the prunable channels in place (the classifier's outputs are kept)."""
    import torch_pruning as tp

    model = model.cpu().eval()
    example = torch.zeros(1, *input_shape(model))
    # torch-pruning follows channels through autograd: frozen per-channel parameters (a temporal
    # shift's direction masks) must be traced too, or they would keep their old width.
    frozen = {n for n, q in model.named_parameters() if not q.requires_grad}
    for q in model.parameters():
        q.requires_grad_(True)
    ignored = [m for m in [classifier_of(model)] if m is not None] + list(match_layers(model, ignore or []).values())
    per_layer = {m: r for pat, r in (layer_ratios or {}).items() for m in match_layers(model, [pat]).values()}
    pruner = tp.pruner.MetaPruner(model, example, importance=_importance(importance), pruning_ratio=ratio, global_pruning=global_pruning,
                                  pruning_ratio_dict=per_layer or None, ignored_layers=ignored, round_to=round_to, iterative_steps=iterative_steps,
                                  unwrapped_parameters=_channel_parameters(model) or None)
    # Nested classifiers too (a video model's 2D backbone): each keeps its cached widths in step.
    owners = [m for m in model.modules() if hasattr(m, "reset_classifier")] or [model]
    widths_before = [(m, _head_widths(m)) for m in owners]
    for _ in range(iterative_steps):
        if importance == "taylor":
            _accumulate_gradients(model, calib_loader)
        pruner.step()
    model.zero_grad(set_to_none=True)
    for n, q in model.named_parameters():  # pruned parameters are new objects: freeze them again by name
        q.requires_grad_(n not in frozen)
    for owner, before in widths_before:
        _sync_cached_widths(owner, before)
    return model


def _channel_parameters(model: nn.Module) -> list[tuple[nn.Parameter, int]]:
    """(parameter, channel dim) of modules that declare per-channel parameters outside standard
    layers (`channel_parameters()`), so torch-pruning prunes them without guessing the dim."""
    return [pd for m in model.modules() if hasattr(m, "channel_parameters") for pd in m.channel_parameters()]


def _head_widths(model: nn.Module) -> list[int | None]:
    """Channel counts near the head that timm models cache as attributes."""
    head, conv_head = classifier_of(model), getattr(model, "conv_head", None)
    return [getattr(head, "in_features", None), getattr(conv_head, "out_channels", None), getattr(conv_head, "in_channels", None)]


def _sync_cached_widths(model: nn.Module, before: list[int | None]) -> None:
    """timm models cache num_features / head_hidden_size and reset_classifier() sizes the new head
    from them; point each at the pruned width of the layer it described."""
    after = _head_widths(model)
    for attr in ("num_features", "head_hidden_size"):
        if isinstance(getattr(type(model), attr, None), property) or not isinstance(getattr(model, attr, None), int):
            continue
        old = getattr(model, attr)
        match = next((new for was, new in zip(before, after) if was == old and new is not None), None)
        if match is not None:
            setattr(model, attr, match)


def _accumulate_gradients(model: nn.Module, loader, batches: int = 4) -> None:
    """Taylor importance needs loss gradients: a few training batches, no optimizer step."""
    if loader is None:
        raise EffvisionError("taylor importance needs data to compute gradients")
    model.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(loader):
        if i >= batches:
            break
        F.cross_entropy(model(x), y).backward()
