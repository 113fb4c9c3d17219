"""Model builders: our own compact nets, timm and torchvision adapters, checkpoints, profiling."""

from .checkpoint import load_checkpoint, load_pretrained, save_checkpoint
from .factory import build, card_model, create_model, is_checkpoint_path, list_models, load_model, model_card, resolve
from .profile import count_macs, count_params, input_shape

__all__ = [
    "build",
    "card_model",
    "is_checkpoint_path",
    "load_model",
    "create_model",
    "list_models",
    "model_card",
    "resolve",
    "load_checkpoint",
    "load_pretrained",
    "save_checkpoint",
    "count_macs",
    "count_params",
    "input_shape",
]
