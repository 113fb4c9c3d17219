"""Structured channel pruning with torch-pruning's dependency graph: the result is a physically
smaller model (fewer channels), not a masked one."""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Callable

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
        hits = {
            n: m for n, m in model.named_modules() if (re.fullmatch(pat[3:], n) if pat.startswith("re:") else n == pat)
        }
        if not hits:
            raise EffvisionError(
                f"no layer matches '{pat}' (layer names look like: "
                f"{', '.join(list(dict(model.named_modules()))[1:6])}, ...)"
            )
        found.update(hits)
    return found


def prune(
    model: nn.Module,
    ratio: float,
    importance: str = "l2",
    global_pruning: bool = False,
    layer_ratios: dict[str, float] | None = None,
    ignore: list[str] | None = None,
    round_to: int | None = None,
    iterative_steps: int = 1,
    calib_loader=None,
    between_steps: Callable[[int], None] | None = None,
) -> nn.Module:
    """Remove `ratio` of the prunable channels in place (the classifier's outputs are kept);
    `layer_ratios` (by name or re:regex) set other ratios for some layers (0 keeps them whole).
    With iterative_steps, `between_steps(k)` (training, typically) runs after each step but the last."""
    model = model.cpu().eval()
    with traceable(model) as frozen:
        per_layer = {m: r for pat, r in (layer_ratios or {}).items() for m in match_layers(model, [pat]).values()}
        if round_to and ratio > 0:
            per_layer = {**_round_to_floors(model, importance, ignore, ratio, round_to), **per_layer}
        pruner = meta_pruner(model, importance, ignore, ratio, global_pruning, per_layer, round_to, iterative_steps)
        # Nested classifiers too (a video model's 2D backbone): each keeps its cached widths in step.
        owners = [m for m in model.modules() if hasattr(m, "reset_classifier")] or [model]
        widths_before = [(m, _head_widths(m)) for m in owners]
        for k in range(1, iterative_steps + 1):
            if importance == "taylor":
                _accumulate_gradients(model, calib_loader)
            pruner.step()
            if between_steps is not None and k < iterative_steps:
                model.zero_grad(set_to_none=True)
                for owner, before in widths_before:  # trained as the pruned model it now is
                    _sync_cached_widths(owner, before)
                widths_before = [(m, _head_widths(m)) for m in owners]
                for n, q in model.named_parameters():
                    q.requires_grad_(n not in frozen)
                between_steps(k)
                model.cpu().eval()
                for q in model.parameters():
                    q.requires_grad_(True)
        model.zero_grad(set_to_none=True)
    for owner, before in widths_before:
        _sync_cached_widths(owner, before)
    return model


def _round_to_floors(model: nn.Module, importance: str, ignore, ratio: float, round_to: int) -> dict[nn.Module, float]:
    """Ratios that keep `round_to` channels in each group the uniform ratio would cut below it.
    torch-pruning rounds the channels kept down to the multiple, and a group rounded to none is
    skipped, left whole: speednet at ratio 0.89 with round_to 16 kept every group at full width
    and ran slower than at 0.5."""
    pruner = meta_pruner(model, importance, ignore)
    dg = pruner.DG
    floors = {}
    for group in dg.get_all_groups(ignored_layers=pruner.ignored_layers, root_module_types=pruner.root_module_types):
        root = group[0].dep.target.module
        width = dg.get_out_channels(root)
        if width and width > round_to and width * (1 - ratio) < round_to:
            floors[root] = 1 - (round_to + 0.5) / width  # half a channel over, so float error cannot round it away
    return floors


@contextlib.contextmanager
def traceable(model: nn.Module):
    """torch-pruning follows channels through autograd: frozen per-channel parameters (a temporal
    shift's direction masks) must be traced too, or they would keep their old width. Pruned
    parameters are new objects, so they are frozen again by name afterwards."""
    frozen = {n for n, q in model.named_parameters() if not q.requires_grad}
    for q in model.parameters():
        q.requires_grad_(True)
    try:
        with torch.enable_grad():  # the dependency graph is traced through autograd
            yield frozen
    finally:
        for n, q in model.named_parameters():
            q.requires_grad_(n not in frozen)


def meta_pruner(
    model: nn.Module,
    importance: str = "l2",
    ignore: list[str] | None = None,
    ratio: float = 0.0,
    global_pruning: bool = False,
    per_layer: dict[nn.Module, float] | None = None,
    round_to: int | None = None,
    iterative_steps: int = 1,
    kind: str = "MetaPruner",
    **options,
):
    """torch-pruning's MetaPruner (or another of its pruners, `kind`, with its `options`) over the
    model's dependency graph, with the layers it must not prune left out (the classifier's
    outputs, attention internals, `ignore`); inside traceable()."""
    import torch_pruning as tp

    example = torch.zeros(1, *input_shape(model))
    ignored = (
        [m for m in [classifier_of(model)] if m is not None]
        + list(match_layers(model, ignore or []).values())
        + attention_internals(model)
    )
    with warnings.catch_warnings():
        # Layer scales and the like: torch-pruning prunes their last non-singleton dimension, which
        # is their channel dimension; the ones that are not (per-head) are in `ignored` above.
        warnings.filterwarnings("ignore", message="Unwrapped parameters detected")
        pruner = getattr(tp.pruner, kind)(
            model,
            example,
            importance=_importance(importance),
            pruning_ratio=ratio,
            global_pruning=global_pruning,
            pruning_ratio_dict=per_layer or None,
            ignored_layers=ignored,
            round_to=round_to,
            iterative_steps=iterative_steps,
            unwrapped_parameters=_channel_parameters(model) or None,
            **options,
        )
    if any(_is_uneven_grouped(m) for m in model.modules()):  # (another pass over the groups: only when needed)
        _keep_uneven_grouped_convs(pruner)
    return pruner


_QKV_NAMES = {"qkv", "qkvs", "qkv_proj", "kv"}


def _is_attention(m: nn.Module) -> bool:
    """By its head count, its name, or query/key/value children (EfficientViT's LiteMLA has only those)."""
    name = type(m).__name__.lower()
    return (
        isinstance(getattr(m, "num_heads", None), int)
        or "attention" in name
        or name.endswith("attn")
        or any(child in _QKV_NAMES for child, _ in m.named_children())
    )


def attention_internals(model: nn.Module) -> list[nn.Module | nn.Parameter]:
    """Every layer inside an attention module but its last (the output projection), and the
    module's own per-head parameters (temperatures, position biases). Their widths are tied to
    heads that each implementation reshapes by its own cached sizes (num_heads, key_dim, ...), so
    they are kept; the block's input and output widths still prune."""
    inner: list[nn.Module | nn.Parameter] = []
    for m in model.modules():
        if _is_attention(m):
            layers = [c for c in m.modules() if isinstance(c, (nn.Linear, nn.modules.conv._ConvNd))]
            inner += layers[:-1]
            inner += list(m.parameters(recurse=False))  # its own, not a layer scale's inside it
    return inner


def _is_uneven_grouped(m) -> bool:
    return isinstance(m, nn.modules.conv._ConvNd) and m.groups > 1 and m.in_channels != m.out_channels


def _keep_uneven_grouped_convs(pruner) -> None:
    """Grouped convolutions whose output width differs from their input (a channel multiplier, as
    in FastViT's patch embedding) break torch-pruning's group-wise indexing; the channel groups
    they touch, on either side, keep their width."""
    for group in list(
        pruner.DG.get_all_groups(ignored_layers=pruner.ignored_layers, root_module_types=pruner.root_module_types)
    ):
        if any(_is_uneven_grouped(dep.target.module) for dep, _ in group):
            pruner.ignored_layers += [
                dep.target.module
                for dep, _ in group
                if isinstance(dep.target.module, nn.Module) and pruner.DG.is_out_channel_pruning_fn(dep.handler)
            ]


def _channel_parameters(model: nn.Module) -> list[tuple[nn.Parameter, int]]:
    """(parameter, channel dim) of modules that declare per-channel parameters outside standard
    layers (`channel_parameters()`), so torch-pruning prunes them without guessing the dim."""
    return [pd for m in model.modules() if hasattr(m, "channel_parameters") for pd in m.channel_parameters()]


def _width(layer: nn.Module | None, attr: str) -> int | None:
    value = getattr(layer, attr, None)
    return value[0] if isinstance(value, tuple) and value else value if isinstance(value, int) else None


def _head_widths(model: nn.Module) -> list[int | None]:
    """Channel counts near the head that timm models (and their head modules) cache as attributes."""
    head, conv_head = classifier_of(model), getattr(model, "conv_head", None)
    head_norm = getattr(getattr(model, "head", None), "norm", None)
    return [
        _width(head, "in_features"),
        _width(conv_head, "out_channels"),
        _width(conv_head, "in_channels"),
        _width(head_norm, "normalized_shape") or _width(head_norm, "num_features"),
    ]


def _sync_cached_widths(model: nn.Module, before: list[int | None]) -> None:
    """timm models cache num_features / head_hidden_size, and head modules (NormMlpClassifierHead)
    their in_features; reset_classifier() sizes the new head from them. Point each at the pruned
    width of the layer it described."""
    after = _head_widths(model)
    head = getattr(model, "head", None)
    owners = [(model, ("num_features", "head_hidden_size"))]
    if isinstance(head, nn.Module) and not isinstance(head, (nn.Linear, nn.modules.conv._ConvNd)):
        owners.append((head, ("in_features", "num_features")))
    for owner, attrs in owners:
        for attr in attrs:
            if isinstance(getattr(type(owner), attr, None), property) or not isinstance(
                getattr(owner, attr, None), int
            ):
                continue
            old = getattr(owner, attr)
            match = next((new for was, new in zip(before, after, strict=True) if was == old and new is not None), None)
            if match is not None:
                setattr(owner, attr, match)


def _accumulate_gradients(model: nn.Module, loader, batches: int = 4) -> None:
    """Taylor importance needs loss gradients: a few training batches, no optimizer step."""
    if loader is None:
        raise EffvisionError("taylor importance needs data to compute gradients")
    model.zero_grad(set_to_none=True)
    for i, (x, y) in enumerate(loader):
        if i >= batches:
            break
        F.cross_entropy(model(x), y).backward()
