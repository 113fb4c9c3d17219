"""Per-group widths chosen by measured accuracy, not by weight norm (EagleEye, Li et al. 2020):
candidate width vectors that the latency model says meet a step's goal are each pruned from the
model, given batch-norm statistics recomputed on training images, and scored on other training
images; the most accurate is taken. Candidates: the importance planner's widths, one fraction of
every group (uniform), and others as little pruned as meets the goal: drawn from the whole grid
of widths where it is small, random per-group mixes of the uniform cut where it is not.

The latency model only proposes: the candidates are timed on the target, the most accurate
first, and the first that measures within the goal is taken (NetAdapt's rule of measuring).

Why: weight norm, normalised within each group, does not say which group costs accuracy when
thinned, and the latency saved is largest in the high-resolution early blocks, so the planner
alone cut speednet's first block from 32 to 8 channels and lost 1.4 points to uniform pruning at
matched latency (BENCHMARKS.md). Scoring needs no training, so tens of candidates cost a minute."""

from __future__ import annotations

import numpy as np
from torch import nn

from ..progress import log
from .latency import LatencyModel, grid
from .latency_prune import ChannelGroup, floor_width

BN_SAMPLES = 1024  # recalibrate_batchnorm's random subset; scoring uses the images after it


def layers_at(
    groups: list[ChannelGroup], current: dict[str, tuple[int, int]], widths: dict[str, int]
) -> dict[str, tuple[float, float]]:
    """Every layer's (cin, cout) with each group at `widths` (root -> channels; groups now at g.width)."""
    layers = {n: (float(a), float(b)) for n, (a, b) in current.items()}
    for g in groups:
        f = widths.get(g.root, g.width) / g.width
        if f == 1:
            continue
        for n in g.outs:
            layers[n] = (layers[n][0], layers[n][1] * f)
        for n in g.ins:
            layers[n] = (layers[n][0] * f, layers[n][1])
    return layers


def _levels(g: ChannelGroup, original: dict[str, int], multiple: int) -> list[int]:
    """The widths group g may take now: its original width's grid, from the floor to its width."""
    lo = floor_width(original[g.root])
    return sorted({w for w in grid(original[g.root], multiple) if lo <= w < g.width} | {g.width})


def _shaped(groups, levels, cuts: np.ndarray, t: float) -> dict[str, int]:
    """Each group cut by t * its share of cuts, rounded up to a width it may take."""
    out = {}
    for g, cut in zip(groups, cuts, strict=True):
        want = g.width * (1 - t * cut)
        out[g.root] = next((w for w in levels[g.root] if w >= want - 1e-9), g.width)
    return out


def _least_cut(groups, levels, cuts, predict, goal_ms) -> dict[str, int] | None:
    """The widths of this cut shape pruned only as far as meets goal_ms (bisection on its strength;
    None when even the full cut, every group to its floor in proportion, does not)."""
    if predict(_shaped(groups, levels, cuts, 1.0)) > goal_ms:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(20):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if predict(_shaped(groups, levels, cuts, mid)) <= goal_ms else (mid, hi)
    return _shaped(groups, levels, cuts, hi)


ENUMERATED = 20_000  # grids with at most this many width vectors are searched whole


def candidate_widths(
    groups: list[ChannelGroup],
    original: dict[str, int],
    current: dict[str, tuple[int, int]],
    lat: LatencyModel,
    goal_ms: float,
    multiple: int,
    count: int,
    planned: dict[str, int] | None = None,
    seed: int = 0,
) -> list[tuple[str, dict[str, int]]]:
    """Up to `count` distinct (kind, widths) predicted to meet goal_ms: 'planned' (the importance
    planner's, if given), 'uniform', then the rest. On a small grid (a few groups at a coarse
    multiple) the rest are drawn from every width vector that meets the goal and is not pruned
    further than it needs (widening any one group by a level would miss it); on a large one they
    are random per-group mixes of the uniform cut. Widths: root -> channels, every group."""
    levels = {g.root: _levels(g, original, multiple) for g in groups}
    # the full cut of a group reaches its floor: 1 - floor / width
    reach = np.array([1 - levels[g.root][0] / g.width for g in groups])
    rng = np.random.default_rng(seed)

    def predict(widths: dict[str, int]) -> float:
        return lat.predict(layers_at(groups, current, widths))

    found: list[tuple[str, dict[str, int]]] = []
    seen: set[tuple[int, ...]] = set()

    def add(kind: str, widths: dict[str, int] | None) -> None:
        key = tuple(widths[g.root] for g in groups) if widths else None
        if key is not None and key not in seen and len(found) < count and predict(widths) <= goal_ms:
            seen.add(key)
            found.append((kind, widths))

    if planned is not None:
        add("planned", {g.root: planned.get(g.root, g.width) for g in groups})
    add("uniform", _least_cut(groups, levels, reach, predict, goal_ms))
    if int(np.prod([len(levels[g.root]) for g in groups])) <= ENUMERATED:
        tight = _tight_vectors(groups, levels, predict, goal_ms)
        for i in rng.permutation(len(tight)):
            add("grid", tight[i])
    else:
        for _ in range(count * 4):  # rounding makes some draws the same widths
            add("random", _least_cut(groups, levels, reach * rng.uniform(0.0, 1.0, len(groups)), predict, goal_ms))
    return found


def _tight_vectors(groups, levels, predict, goal_ms) -> list[dict[str, int]]:
    """Every grid width vector that meets goal_ms and misses it when any one group is a level wider."""
    import itertools

    out = []
    for combo in itertools.product(*(levels[g.root] for g in groups)):
        widths = dict(zip((g.root for g in groups), combo, strict=True))
        if predict(widths) > goal_ms:
            continue
        wider = []
        for g in groups:
            up = [w for w in levels[g.root] if w > widths[g.root]]
            if up:
                wider.append({**widths, g.root: up[0]})
        if all(predict(w) > goal_ms for w in wider):
            out.append(widths)
    return out


SLACK = 0.15  # candidates the latency model puts up to this much past the goal are measured too
MEASURED = 6  # at most this many candidates are timed per step, the most accurate first


def candidates_around(
    groups: list[ChannelGroup],
    original: dict[str, int],
    current: dict[str, tuple[int, int]],
    lat: LatencyModel,
    goal_ms: float,
    multiple: int,
    count: int,
    planned: dict[str, int] | None = None,
    seed: int = 0,
    slack: float = SLACK,
) -> list[dict]:
    """Half the candidates predicted to meet goal_ms, the rest predicted within `slack` past it
    (the latency model's error on these nets: a speednet plan predicted at 0.189 ms measured
    0.171, and uniform pruning that the model put past the goal ran faster than the plan); each a
    record of kind, widths, predicted_ms and whether the prediction meets the goal."""
    strict = candidate_widths(groups, original, current, lat, goal_ms, multiple, max(1, count // 2), planned, seed)
    more = candidate_widths(groups, original, current, lat, goal_ms * (1 + slack), multiple, count, None, seed + 1)
    out, seen = [], set()
    for kind, widths in strict + more:
        key = tuple(sorted(widths.items()))
        if key in seen or len(out) >= count:
            continue
        seen.add(key)
        ms = lat.predict(layers_at(groups, current, widths))
        out.append({"kind": kind, "widths": dict(widths), "predicted_ms": round(ms, 4), "predicted_met": ms <= goal_ms})
    return out


def score_candidates(
    model: nn.Module,
    groups: list[ChannelGroup],
    candidates: list[dict],
    data,
    device,
    loader,
    importance: str = "l2",
) -> None:
    """Each candidate's top-1 with no training (a pruned copy, batch norm recomputed on `data`'s
    training images), scored on `loader` (the decision split), into its record as `top1`."""
    from ..scoring import accuracy, torch_predictor
    from .align import at_widths
    from .finetune import recalibrate_batchnorm

    for c in candidates:
        copy = at_widths(model, groups, c["widths"], importance).to(device)
        recalibrate_batchnorm(copy, data, BN_SAMPLES)
        c["top1"] = round(accuracy(torch_predictor(copy, device), loader), 4)
        del copy


def choose_widths(candidates: list[dict], goal_ms: float, measure, limit: int = MEASURED) -> dict:
    """The most accurate scored candidate that measures within goal_ms (measure(widths): ms on
    the goal's scale), timing at most `limit` of them in order of accuracy; when none does, the
    most accurate one predicted to. The records get `measured_ms` and the chosen one `chosen`."""
    order = sorted(candidates, key=lambda c: -c["top1"])
    chosen = None
    for c in order[:limit]:
        c["measured_ms"] = round(measure(c["widths"]), 4)
        if c["measured_ms"] <= goal_ms:
            chosen = c
            break
    if chosen is None:
        chosen = next((c for c in order if c["predicted_met"]), order[0])
    chosen["chosen"] = True
    log(
        f"  widths by accuracy: {len(candidates)} candidates, {sum('measured_ms' in c for c in candidates)} timed; "
        f"took {chosen['kind']} {list(chosen['widths'].values())} at top-1 {chosen['top1']:.4f} (before training)"
        + (f", {chosen['measured_ms']:.3f} ms" if "measured_ms" in chosen else ", none timed within the goal")
    )
    return chosen
