"""The channel multiple the target backend runs fastest, measured in the whole network.

A layer timed alone cannot show it: ONNX Runtime on x86 runs convolutions in channel blocks (8 wide
with AVX2, 16 with AVX-512), and a width off the block breaks the blocked chain between layers
with reorders. Measured on a 2-core AVX2 machine, CIFAR ResNet-20 with every group at 7/15/31
channels ran 1.8-2x slower than at 8/16/32, and 4/12/28 no faster than 8/16/32. So candidates
are tried in the network: for each multiple m, every channel group near half its width at a
multiple of m (`aligned`), against m/2 channels fewer (`fewer`). m pays when the fewer channels
realise less than a quarter of the saving their MACs promise and less than 5% of the time: a
memory-bound network (a MobileNet at 32x32: 40% fewer MACs, 8% less time) realises little of
any cut. The multiple chosen is the largest that pays (1 when none does)."""

from __future__ import annotations

import copy

from torch import nn

from ..models.profile import count_macs
from ..progress import log
from .latency_prune import ChannelGroup, ratios_for
from .prune import prune

CANDIDATES = (2, 4, 8, 16)
REALIZED = 0.25  # share of the MAC saving below which the removed channels bought nothing
KEPT = 0.95  # ... and the time they left: fewer MACs realise little on a memory-bound network anyway


def aligned_widths(groups: list[ChannelGroup], multiple: int, fraction: float = 0.5) -> dict[str, int]:
    """Each group near `fraction` of its width, at a multiple of `multiple` (never wider than it is)."""
    return {g.root: min(g.width, max(multiple, int(g.width * fraction) // multiple * multiple)) for g in groups}


def at_widths(
    model: nn.Module, groups: list[ChannelGroup], widths: dict[str, int], importance: str = "l2"
) -> nn.Module:
    """A pruned copy of `model` with each group at `widths` (groups of `model` as it is), the
    channels kept chosen by `importance` as prune() chooses them."""
    narrower = {g.root: widths[g.root] for g in groups if widths[g.root] < g.width}
    return prune(copy.deepcopy(model), 0.0, importance, layer_ratios=ratios_for(narrower, groups))


def fastest_multiple(model: nn.Module, groups: list[ChannelGroup], aim, shape: list[int]) -> dict:
    """Measure the candidates on the target (aim: an Aim), the largest first, and take the first
    that pays. Returns the record: multiple, each candidate's timings, and the last aligned model
    measured with its latency on the aim's scale, a whole-network point for the latency model."""
    probes, multiple = [], 1
    for m in sorted(CANDIDATES, reverse=True):
        aligned_widths_m = aligned_widths(groups, m)
        fewer_widths = {r: max(1, w - m // 2) for r, w in aligned_widths_m.items()}
        aligned, fewer = at_widths(model, groups, aligned_widths_m), at_widths(model, groups, fewer_widths)
        ms = aim.timings({"aligned": aligned, "fewer": fewer})
        a, f = ms["aligned"], ms["fewer"]
        macs_ratio = count_macs(fewer, shape) / count_macs(aligned, shape)
        realized = (1 - f / a) / max(1e-9, 1 - macs_ratio)
        pays = realized < REALIZED and f >= KEPT * a
        probes.append(
            {
                "multiple": m,
                "aligned_ms": round(a, 4),
                "fewer_ms": round(f, 4),
                "macs_ratio": round(macs_ratio, 3),
                "realized": round(realized, 3),
                "pays": pays,
            }
        )
        if pays:
            multiple = m
            break
    log(
        f"  channel multiple: {multiple} (measured: "
        + ", ".join(f"{p['multiple']}: {p['aligned_ms']:.3f} vs {p['fewer_ms']:.3f} ms" for p in probes)
        + ")"
    )
    return {"multiple": multiple, "probes": probes, "half": (aligned, aim.scaled(a, ms["reference"]))}
