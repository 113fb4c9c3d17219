"""Top-1 accuracy of any predictor (a torch model or an ONNX Runtime session) over a loader."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch


def accuracy(predict: Callable[[torch.Tensor], np.ndarray | torch.Tensor], loader) -> float:
    correct = total = 0
    for x, y in loader:
        logits = predict(x)
        pred = np.asarray(logits.detach().cpu() if isinstance(logits, torch.Tensor) else logits).argmax(1)
        correct += int((pred == np.asarray(y)).sum())
        total += len(y)
    return correct / max(total, 1)


def torch_predictor(model: torch.nn.Module, device: str | torch.device = "cpu", channels_last: bool = False):
    model.eval()

    @torch.inference_mode()
    def predict(x: torch.Tensor) -> torch.Tensor:
        x = x.to(device, non_blocking=True)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return model(x).float()

    return predict
