"""Top-1 accuracy of any predictor (a torch model or an ONNX Runtime session) over a loader."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

Predictor = Callable[[torch.Tensor], np.ndarray | torch.Tensor]


def _numpy(out: np.ndarray | torch.Tensor) -> np.ndarray:
    return np.asarray(out.detach().cpu() if isinstance(out, torch.Tensor) else out)


def accuracy(predict: Predictor, loader) -> float:
    correct = total = 0
    for x, y in loader:
        pred = _numpy(predict(x)).argmax(1)
        correct += int((pred == np.asarray(y)).sum())
        total += len(y)
    return correct / max(total, 1)


def outputs(predict: Predictor, loader) -> tuple[np.ndarray, np.ndarray]:
    """Every output of the predictor over the loader, and the labels, in order."""
    outs, labels = [], []
    for x, y in loader:
        outs.append(_numpy(predict(x)))
        labels.append(np.asarray(y))
    return np.concatenate(outs), np.concatenate(labels)


def torch_predictor(model: torch.nn.Module, device: str | torch.device = "cpu", channels_last: bool = False):
    model.eval()

    @torch.inference_mode()
    def predict(x: torch.Tensor) -> torch.Tensor:
        x = x.to(device, non_blocking=True)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return model(x).float()

    return predict
