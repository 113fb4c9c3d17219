"""The classifier half of the model contract, for networks whose last layer is `self.fc`."""

from __future__ import annotations

from torch import nn


class LinearHead:
    """num_classes, num_features, get_classifier and reset_classifier read from `self.fc` (an
    nn.Linear), so a pruned or re-headed model reports its true sizes."""

    fc: nn.Linear

    @property
    def num_classes(self) -> int:
        return self.fc.out_features

    @property
    def num_features(self) -> int:
        return self.fc.in_features

    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int) -> None:
        self.fc = nn.Linear(self.fc.in_features, num_classes, bias=self.fc.bias is not None)
