"""Point-cloud classifiers. Every one takes clouds as (B, C, N): xyz first, then any other values.

- PointNet (Qi et al., "PointNet: Deep Learning on Point Sets for 3D Classification and
  Segmentation", CVPR 2017): a shared per-point MLP and a symmetric max pool. The vanilla form of
  the paper's ablation (no T-Nets): augmentation teaches the rotations the data needs.
- PointNet++ SSG (Qi et al., "PointNet++: Deep Hierarchical Feature Learning on Point Sets in a
  Metric Space", NeurIPS 2017), single-scale grouping, light widths: set abstractions pick
  centroids, group neighbours in a ball, run a PointNet on each group.
- DGCNN (Wang et al., "Dynamic Graph CNN for Learning on Point Clouds", ACM TOG 2019), light
  widths: EdgeConv layers over a k-nearest-neighbour graph recomputed in feature space.

Neighbour search is written as a distance matrix (MatMul), TopK and GatherElements, which ONNX
exports and ONNX Runtime runs. Farthest-point sampling inside a network cannot export (below), so
PointNet++ defaults to `centroids: prefix`: the first M points are the centroids, which is a
farthest-point sample when the data pipeline's `fps` sampler ordered the cloud coarse to fine.
"""

from __future__ import annotations

from itertools import pairwise

import torch
from torch import nn

from ..registry import MODELS
from .contract import LinearHead

FPS_EXPORT_BLOCKER = (
    "farthest-point sampling inside the network (centroids: fps) has no ONNX operator: it is a loop of "
    "one data-dependent argmax per centroid, which tracing unrolls into about 12 nodes per centroid "
    "(some 8,000 for 512 + 128 centroids, minutes to export); export the variant with centroids: prefix "
    "and the data's fps sampler (it orders points coarse to fine, so the first M points are a "
    "farthest-point sample)"
)


def _w(channels: int, width: float) -> int:
    return max(8, int(round(channels * width)))


def _mlp1d(widths: list[int]) -> nn.Sequential:
    layers = []
    for cin, cout in pairwise(widths):
        layers += [nn.Conv1d(cin, cout, 1, bias=False), nn.BatchNorm1d(cout), nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


def _mlp2d(widths: list[int], act: nn.Module | None = None) -> nn.Sequential:
    layers = []
    for cin, cout in pairwise(widths):
        layers += [nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), act or nn.ReLU(inplace=True)]
    return nn.Sequential(*layers)


def _classifier_head(cin: int, hidden: list[int], dropout: float, act: nn.Module | None = None) -> nn.Sequential:
    layers, c = [], cin
    for h in hidden:
        layers += [nn.Linear(c, h, bias=False), nn.BatchNorm1d(h), act or nn.ReLU(inplace=True), nn.Dropout(dropout)]
        c = h
    return nn.Sequential(*layers)


class PointClassifier(LinearHead, nn.Module):
    """The model contract for point networks: forward_features gives (B, F) pooled features."""

    # The largest fp32 logit difference the export stage accepts from an exported copy (unless a
    # recipe sets its own). Networks that pick neighbours by TopK over float distances raise it:
    # a near-tie may resolve the other way in another runtime and move a few logits (DGCNN on the
    # generated shapes: max 2.5e-3, mean 7e-6, top-1 agreement 1.0).
    parity_tolerance = 1e-3

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head(x)
        return x if pre_logits else self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def square_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(B, M, N) squared distances between (B, C, M) and (B, C, N) points, as one MatMul."""
    inner = torch.matmul(a.transpose(1, 2), b)
    return (a * a).sum(1).unsqueeze(2) - 2 * inner + (b * b).sum(1).unsqueeze(1)


def gather_points(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """(B, C, M, K) values of x (B, C, N) at indices idx (B, M, K)."""
    b, c, _ = x.shape
    m, k = idx.shape[1:]
    return torch.gather(x, 2, idx.reshape(b, 1, m * k).expand(b, c, m * k)).reshape(b, c, m, k)


def farthest_point_sample(xyz: torch.Tensor, m: int) -> torch.Tensor:
    """(B, m) indices of a farthest-point sample of (B, 3, N) points, starting at point 0."""
    b, _, n = xyz.shape
    chosen = torch.zeros(b, m, dtype=torch.long, device=xyz.device)
    nearest = torch.full((b, n), float("inf"), device=xyz.device)
    last = torch.zeros(b, dtype=torch.long, device=xyz.device)
    for i in range(1, m):
        centre = xyz.gather(2, last.view(b, 1, 1).expand(b, xyz.shape[1], 1))
        nearest = torch.minimum(nearest, ((xyz - centre) ** 2).sum(1))
        last = nearest.argmax(1)
        chosen[:, i] = last
    return chosen


# --------------------------------------------------------------------------- PointNet
class PointNet(PointClassifier):
    """Shared MLP (64, 64, 128, 1024 x width) per point, max pool, MLP head (512, 256 x width)."""

    def __init__(self, num_classes: int = 40, in_chans: int = 3, width: float = 1.0, dropout: float = 0.4):
        super().__init__()
        self.features = _mlp1d([in_chans] + [_w(c, width) for c in (64, 64, 128, 1024)])
        self.head = _classifier_head(_w(1024, width), [_w(512, width), _w(256, width)], dropout)
        self.fc = nn.Linear(_w(256, width), num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).amax(dim=2)


# --------------------------------------------------------------------------- PointNet++ SSG
class SetAbstraction(nn.Module):
    """Centroids, the k nearest points within `radius` of each (ball query; short balls repeat
    their nearest point), a PointNet on each group (relative xyz + features), max over the group.
    num_centroids=None groups all points into one (the last level)."""

    def __init__(self, num_centroids: int | None, radius: float, k: int, widths: list[int], centroids: str = "prefix"):
        super().__init__()
        self.num_centroids, self.radius, self.k, self.centroids = num_centroids, radius, k, centroids
        self.mlp = _mlp2d(widths)

    def forward(self, xyz: torch.Tensor, feats: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.num_centroids is None:
            grouped = xyz if feats is None else torch.cat([xyz, feats], 1)
            return xyz[:, :, :1], self.mlp(grouped.unsqueeze(3)).amax(dim=2)
        m = self.num_centroids
        if xyz.shape[2] < m:
            raise ValueError(f"set abstraction needs at least {m} points, got {xyz.shape[2]}")
        if self.centroids == "fps":
            idx = farthest_point_sample(xyz, m)
            centres = xyz.gather(2, idx.unsqueeze(1).expand(-1, 3, -1))
        else:
            centres = xyz[:, :, :m]
        dist, near = square_distances(centres, xyz).topk(self.k, dim=2, largest=False)
        near = torch.where(dist > self.radius**2, near[:, :, :1], near)
        local = (gather_points(xyz, near) - centres.unsqueeze(3)) / self.radius
        grouped = local if feats is None else torch.cat([local, gather_points(feats, near)], 1)
        return centres, self.mlp(grouped).amax(dim=3)


class PointNet2SSG(PointClassifier):
    """Two set abstractions (512 and 128 centroids, radii 0.2 and 0.4, k neighbours), a global
    one, and an MLP head; widths (x width) 32-32-64, 64-64-128, 128-256-512 for the light model."""

    parity_tolerance = 1e-2

    def __init__(
        self,
        num_classes: int = 40,
        in_chans: int = 3,
        width: float = 1.0,
        k: int = 32,
        centroids: str = "prefix",
        num_centroids: tuple[int, int] = (512, 128),
        radii: tuple[float, float] = (0.2, 0.4),
        dropout: float = 0.4,
    ):
        super().__init__()
        if centroids not in ("prefix", "fps"):
            raise ValueError(f"centroids must be prefix or fps, got {centroids!r}")
        self.centroids = centroids
        w1, w2, w3 = ([_w(c, width) for c in ws] for ws in ((32, 32, 64), (64, 64, 128), (128, 256, 512)))
        extra = in_chans - 3
        self.sa1 = SetAbstraction(num_centroids[0], radii[0], k, [3 + extra] + w1, centroids)
        self.sa2 = SetAbstraction(num_centroids[1], radii[1], k, [3 + w1[-1]] + w2, centroids)
        self.sa3 = SetAbstraction(None, 0.0, 0, [3 + w2[-1]] + w3)
        self.head = _classifier_head(w3[-1], [_w(256, width), _w(128, width)], dropout)
        self.fc = nn.Linear(_w(128, width), num_classes)

    @property
    def export_blocker(self) -> str | None:
        """Why this model cannot export to ONNX, or None."""
        return FPS_EXPORT_BLOCKER if self.centroids == "fps" else None

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        xyz, feats = x[:, :3], (x[:, 3:] if x.shape[1] > 3 else None)
        xyz, feats = self.sa1(xyz, feats)
        xyz, feats = self.sa2(xyz, feats)
        return self.sa3(xyz, feats)[1].flatten(1)


# --------------------------------------------------------------------------- DGCNN
class EdgeConv(nn.Module):
    """For each point and each of its k nearest neighbours in feature space, an MLP of
    (neighbour - point, point), then the max over neighbours."""

    def __init__(self, cin: int, cout: int, k: int):
        super().__init__()
        self.k = k
        self.mlp = _mlp2d([2 * cin, cout], nn.LeakyReLU(0.2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        near = square_distances(x, x).topk(self.k, dim=2, largest=False)[1]
        centre = x.unsqueeze(3)
        edges = torch.cat([gather_points(x, near) - centre, centre.expand(-1, -1, -1, self.k)], 1)
        return self.mlp(edges).amax(dim=3)


class DGCNN(PointClassifier):
    """EdgeConv layers (64, 64, 128 x width; the paper's four at 64-64-128-256 are heavier), their
    outputs concatenated, a point-wise layer to `emb` features, max and mean pooled, MLP head."""

    parity_tolerance = 1e-2

    def __init__(
        self,
        num_classes: int = 40,
        in_chans: int = 3,
        width: float = 1.0,
        k: int = 20,
        emb: int = 512,
        dropout: float = 0.5,
    ):
        super().__init__()
        widths = [_w(c, width) for c in (64, 64, 128)]
        self.edges = nn.ModuleList(EdgeConv(cin, cout, k) for cin, cout in pairwise([in_chans] + widths))
        e = _w(emb, width)
        self.embed = nn.Sequential(nn.Conv1d(sum(widths), e, 1, bias=False), nn.BatchNorm1d(e), nn.LeakyReLU(0.2))
        self.head = _classifier_head(2 * e, [_w(256, width)], dropout, nn.LeakyReLU(0.2))
        self.fc = nn.Linear(_w(256, width), num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for edge in self.edges:
            x = edge(x)
            outs.append(x)
        x = self.embed(torch.cat(outs, 1))
        return torch.cat([x.amax(dim=2), x.mean(dim=2)], 1)


@MODELS.register("pointnet")
def pointnet(num_classes: int = 40, in_chans: int = 3, width: float = 1.0, **kwargs) -> PointNet:
    return PointNet(num_classes, in_chans, width, **kwargs)


@MODELS.register("pointnet2_ssg")
def pointnet2_ssg(num_classes: int = 40, in_chans: int = 3, width: float = 1.0, **kwargs) -> PointNet2SSG:
    return PointNet2SSG(num_classes, in_chans, width, **kwargs)


@MODELS.register("dgcnn")
def dgcnn(num_classes: int = 40, in_chans: int = 3, width: float = 1.0, **kwargs) -> DGCNN:
    return DGCNN(num_classes, in_chans, width, **kwargs)


pointnet.modality = pointnet2_ssg.modality = dgcnn.modality = "points"
