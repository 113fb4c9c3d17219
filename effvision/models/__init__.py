"""Model builders: our own compact nets, timm and torchvision adapters, checkpoints, profiling."""

# The built-in architectures register themselves in MODELS when imported; the package imports them
# first, so a name resolves whichever of its modules a caller imports.
from . import cifar_resnet, points, speednet, video  # noqa: F401
from .builder import build, create_model, list_models, model_card, resolve
from .checkpoint import load_checkpoint, save_checkpoint
from .factory import card_model, is_checkpoint_path, load_model
from .profile import count_macs, count_params, input_shape
from .weights import load_pretrained

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
