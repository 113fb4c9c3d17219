"""One training loop for every modality and task (classify, distill)."""

from .config import TrainSettings
from .loop import FitResult, fit

__all__ = ["TrainSettings", "FitResult", "fit"]
