"""Per-layer widths chosen for a latency target (HALP's idea, Shen et al. 2022, with NetAdapt's
measured tables): channel groups shrink one grid level at a time, always the move that loses the
least importance per millisecond the latency model says it saves, until the predicted latency
meets the target. A move that the tables say is not faster (a width the backend runs slower) is
skipped for the next level down, so widths land where the backend is fast."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from .latency import LatencyModel, grid
from .prune import meta_pruner, traceable

MIN_FRACTION = 1 / 8  # no group is cut below an eighth of its original width


def floor_width(width: int) -> int:
    """The fewest channels a group of `width` may keep: MIN_FRACTION of it, at least one."""
    return max(1, int(np.ceil(width * MIN_FRACTION)))


@dataclass
class ChannelGroup:
    """Channels torch-pruning removes together, and the layers whose widths they are."""

    root: str  # the group's root layer: its ratio key for prune(layer_ratios=...)
    width: int  # channels now
    scores: np.ndarray  # importance of each channel, ascending, normalised to the group's mean
    outs: list[str]  # layers whose output channels these are
    ins: list[str]  # layers whose input channels these are


def channel_groups(model: nn.Module, importance: str = "l2", ignore: list[str] | None = None) -> list[ChannelGroup]:
    """The prunable channel groups of `model` as prune() would see them, with their importance."""
    names = {m: n for n, m in model.named_modules()}
    layers = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
    model = model.cpu().eval()
    out = []
    with traceable(model):
        pruner = meta_pruner(model, importance, ignore)
        dg = pruner.DG
        found = dg.get_all_groups(ignored_layers=pruner.ignored_layers, root_module_types=pruner.root_module_types)
        for group in found:
            imp = pruner.importance(group)
            if imp is None:
                continue
            outs, ins = [], []
            for dep, _ in group:
                m = dep.target.module
                if not isinstance(m, layers):
                    continue
                if dg.is_out_channel_pruning_fn(dep.handler):
                    outs.append(names[m])
                elif dg.is_in_channel_pruning_fn(dep.handler):
                    ins.append(names[m])
            scores = np.sort(imp.detach().float().cpu().numpy())
            root = names[group[0].dep.target.module]
            out.append(ChannelGroup(root, len(scores), scores, sorted(set(outs)), sorted(set(ins))))
    model.zero_grad(set_to_none=True)
    return out


def layer_widths(model: nn.Module) -> dict[str, tuple[int, int]]:
    """(input, output) channels of every convolution and linear layer, by name."""
    widths = {}
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            widths[name] = (m.in_features, m.out_features)
        elif isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            widths[name] = (m.in_channels, m.out_channels)
    return widths


@dataclass
class Plan:
    widths: dict[str, int]  # group root -> channels to keep (only groups that shrink)
    predicted_ms: float
    start_ms: float  # predicted at the current widths
    importance_lost: float
    reached: bool  # the prediction meets the target


def plan_widths(
    groups: list[ChannelGroup],
    original: dict[str, int],
    current: dict[str, tuple[int, int]],
    lat: LatencyModel,
    target_ms: float,
    multiple: int = 1,
) -> Plan:
    """Greedy: shrink the group whose next faster level costs the least importance per predicted
    millisecond saved, until the prediction meets target_ms. `original` holds each group's width
    before any pruning (its grid), `current` every layer's (cin, cout) now."""
    widths = {g.root: g.width for g in groups}
    layers = dict(current)
    tables = {layer.name: layer for layer in lat.layers}
    _, slope = lat.line()

    def cost(names: set[str], trial: dict[str, tuple[float, float]]) -> float:
        return slope * sum(lat.layer_ms(tables[n], *trial[n]) for n in names)

    def moved(g: ChannelGroup, new: int) -> dict[str, tuple[float, float]]:
        f = new / widths[g.root]
        trial = {}
        for n in set(g.outs) | set(g.ins):
            cin, cout = layers[n]
            trial[n] = (cin * f if n in g.ins else cin, cout * f if n in g.outs else cout)
        return trial

    predicted = start = lat.predict(layers)
    lost = 0.0
    while predicted > target_ms:
        best = None
        for g in groups:
            touched = (set(g.outs) | set(g.ins)) & set(tables)
            floor = floor_width(original[g.root])
            levels = [w for w in grid(original[g.root], multiple) if floor <= w < widths[g.root]]
            before = cost(touched, layers)
            for new in sorted(levels, reverse=True):
                trial = moved(g, new)
                saved = before - cost(touched, {**layers, **trial})
                if saved <= 0:
                    continue  # not faster on the tables: try the next level down
                removed = g.width - widths[g.root]
                loss = float(g.scores[removed : removed + widths[g.root] - new].sum())
                if best is None or loss / saved < best[0]:
                    best = (loss / saved, g, new, trial, saved, loss)
                break
        if best is None:
            break
        _, g, new, trial, saved, loss = best
        widths[g.root], predicted, lost = new, predicted - saved, lost + loss
        layers.update(trial)
    changed = {g.root: widths[g.root] for g in groups if widths[g.root] < g.width}
    return Plan(changed, predicted, start, lost, predicted <= target_ms)


def ratios_for(widths: dict[str, int], groups: list[ChannelGroup]) -> dict[str, float]:
    """prune(layer_ratios=...) for group widths (root -> channels to keep, e.g. a Plan's): torch-
    pruning keeps int(width * (1 - ratio)) channels, so the ratio aims half a channel above the
    width wanted (float error cannot cost a channel)."""
    now = {g.root: g.width for g in groups}
    return {root: max(0.0, 1 - (w + 0.5) / now[root]) for root, w in widths.items()}


def group_widths(model: nn.Module, groups: list[ChannelGroup]) -> dict[str, int]:
    """The width of each group now, read from its root layer's output channels."""
    widths = layer_widths(model)
    return {g.root: widths[g.root][1] for g in groups if g.root in widths}
