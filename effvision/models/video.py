"""Video classifiers. Every one takes torchvision's clip layout (B, C, T, H, W).

- TSN (Wang et al., "Temporal Segment Networks", ECCV 2016): a 2D backbone on every frame, the
  frames' features averaged (segmental consensus) before the classifier.
- TSM (Lin et al., "TSM: Temporal Shift Module for Efficient Video Understanding", ICCV 2019): the
  same, with a fraction of the channels shifted one frame back and one frame forward at the start
  of every residual branch, so the 2D network mixes time at (almost) zero FLOPs. The shift is
  written with rolls and masks, which export to ONNX and prune like element-wise ops.
- 3D CNNs from torchvision (r3d_18, mc3_18, r2plus1d_18) are reached as `torchvision:r3d_18`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import EffvisionError
from ..registry import MODELS
from .builder import build, create_model, resolve
from .zoo import get_card


class TemporalShift(nn.Module):
    """Shift channels [0, c/fold_div) one frame back in time and [c/fold_div, 2c/fold_div) one
    frame forward; the rest stay. Input (B*T, C, H, W), T fixed.

    Written as rolls along the batch axis times 0/1 masks rather than channel slices and
    concatenation: the same result, but structured pruning sees only element-wise ops. The
    per-channel masks are frozen parameters, so pruning removes a channel's mask entry with the
    channel and every kept channel keeps the direction it was trained with. The time masks zero
    what a roll carries across clip boundaries (TSM's zero padding)."""

    def __init__(self, num_frames: int, channels: int, fold_div: int = 8):
        super().__init__()
        self.num_frames, self.fold_div = num_frames, fold_div
        fold, ch = channels // fold_div, torch.arange(channels)
        self.back = nn.Parameter((ch < fold).float().view(1, channels, 1, 1), requires_grad=False)
        self.ahead = nn.Parameter(((ch >= fold) & (ch < 2 * fold)).float().view(1, channels, 1, 1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nt = x.shape[0]
        t = torch.arange(nt, device=x.device) % self.num_frames
        has_next = (t < self.num_frames - 1).to(x.dtype).view(nt, 1, 1, 1)
        has_prev = (t > 0).to(x.dtype).view(nt, 1, 1, 1)
        back, ahead = self.back.to(x.dtype), self.ahead.to(x.dtype)
        return (
            x * (1 - back - ahead) + torch.roll(x, -1, 0) * (back * has_next) + torch.roll(x, 1, 0) * (ahead * has_prev)
        )

    def channel_parameters(self) -> list[tuple[nn.Parameter, int]]:
        """Per-channel parameters and their channel dim, for structured pruning."""
        return [(self.back, 1), (self.ahead, 1)]

    def extra_repr(self) -> str:
        return f"num_frames={self.num_frames}, channels={self.back.shape[1]}, fold_div={self.fold_div}"


def _residual_blocks(backbone: nn.Module):
    """(block, name of its first conv) for blocks with a residual path: timm's ResNet blocks and
    MobileNet/EfficientNet blocks with a skip, and effvision's CIFAR ResNet blocks."""
    for module in backbone.modules():
        if hasattr(module, "conv1") and hasattr(module, "conv2"):  # ResNet basic/bottleneck blocks
            yield module, "conv1"
        elif getattr(module, "has_skip", False):
            for name in ("conv_pw", "conv_dw"):  # inverted residual, then depthwise-separable
                if isinstance(getattr(module, name, None), nn.Conv2d):
                    yield module, name
                    break


def insert_temporal_shift(backbone: nn.Module, num_frames: int, fold_div: int = 8) -> int:
    """Put a TemporalShift before the first conv of every residual branch; returns how many."""
    count = 0
    for block, name in list(_residual_blocks(backbone)):
        conv = getattr(block, name)
        setattr(block, name, nn.Sequential(TemporalShift(num_frames, conv.in_channels, fold_div), conv))
        count += 1
    if not count:
        raise EffvisionError(
            f"TSM: no residual blocks to shift in {type(backbone).__name__} (use a ResNet or MobileNet-style "
            "backbone, or tsn)"
        )
    return count


class FrameConsensus(nn.Module):
    """A 2D backbone on each of T frames, features averaged over time, then its classifier."""

    def __init__(self, backbone: nn.Module, num_frames: int):
        super().__init__()
        self.backbone, self.num_frames = backbone, num_frames

    @property
    def num_classes(self) -> int:
        return self.get_classifier().out_features

    def get_classifier(self) -> nn.Module:
        return self.backbone.get_classifier()

    def reset_classifier(self, num_classes: int) -> None:
        self.backbone.reset_classifier(num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t, h, w = x.shape
        if t != self.num_frames:
            raise ValueError(f"expected clips of {self.num_frames} frames, got {t}")
        return self.backbone.forward_features(x.transpose(1, 2).reshape(b * t, c, h, w))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        feats = self.backbone.forward_head(x, pre_logits=True)
        feats = feats.reshape(-1, self.num_frames, feats.shape[-1]).mean(1)
        return feats if pre_logits else self.get_classifier()(feats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _backbone(name: str, num_classes: int, frame_size: int, **kwargs) -> nn.Module:
    """The 2D network every frame goes through. A pretrained image card (weights an installed
    package ships) comes with its weights, loaded before TSM wraps its convolutions (the shift
    changes names, not shapes)."""
    card = get_card(name)
    if card is not None and card.package is not None:
        model = create_model(name, num_classes=num_classes, input_size=[3, frame_size, frame_size], **kwargs)
    else:
        model = build(resolve(name, num_classes, [3, frame_size, frame_size], **kwargs))
    for attr in ("forward_features", "forward_head", "get_classifier", "reset_classifier"):
        if not hasattr(model, attr):
            raise EffvisionError(f"backbone {name} lacks {attr}(): use a timm model or a registered effvision model")
    return model


@MODELS.register("tsn")
def tsn(
    num_classes: int = 10,
    backbone: str = "timm:mobilenetv3_small_100",
    num_frames: int = 8,
    frame_size: int = 112,
    **kwargs,
) -> FrameConsensus:
    """TSN: per-frame 2D backbone + temporal average; other kwargs go to the backbone."""
    return FrameConsensus(_backbone(backbone, num_classes, frame_size, **kwargs), num_frames)


@MODELS.register("tsm")
def tsm(
    num_classes: int = 10,
    backbone: str = "timm:resnet18",
    num_frames: int = 8,
    frame_size: int = 112,
    fold_div: int = 8,
    **kwargs,
) -> FrameConsensus:
    """TSM: TSN with residual temporal shifts; other kwargs go to the backbone."""
    model = FrameConsensus(_backbone(backbone, num_classes, frame_size, **kwargs), num_frames)
    insert_temporal_shift(model.backbone, num_frames, fold_div)
    return model


tsn.modality = tsm.modality = "video"  # for list_models(modality)
