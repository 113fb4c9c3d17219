"""Checkpoints are data: state_dict + the spec and layer sizes needed to rebuild a pruned model.

Read with weights.read_weights_file (torch.load(weights_only=True)): no pickled Python objects
from a user's file, ever.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from ..errors import EffvisionError
from ..fileio import atomic_write
from .builder import build
from .caller import CALLER, remember
from .weights import FORMAT, load_state, read_weights_file

# Constructor sizes that structured pruning changes; everything else comes from the spec.
_SIZE_ATTRS = (
    "in_channels",
    "out_channels",
    "groups",
    "in_features",
    "out_features",
    "num_features",
    "normalized_shape",
    "num_channels",
    "num_groups",
    "embed_dim",
    "num_heads",
    "head_dim",
)


def layer_sizes(model: nn.Module) -> dict[str, dict]:
    sizes = {}
    for name, m in model.named_modules():
        attrs = {a: getattr(m, a) for a in _SIZE_ATTRS if isinstance(getattr(m, a, None), (int, tuple))}
        if attrs and any(p is not None for p in m.parameters(recurse=False)):
            sizes[name] = {k: list(v) if isinstance(v, tuple) else v for k, v in attrs.items()}
    return sizes


def save_checkpoint(model: nn.Module, path: str | Path, **extra) -> Path:
    spec = getattr(model, "effvision_spec", None)
    if spec is None:
        raise EffvisionError("cannot save a model that was not built by effvision.create_model")
    payload = {"format": FORMAT, "spec": spec, "layers": layer_sizes(model), "state_dict": model.state_dict(), **extra}

    def write(tmp: Path) -> None:
        torch.save(payload, tmp)

    return atomic_write(path, write)


def read_checkpoint(path: str | Path) -> dict:
    """The payload of an effvision checkpoint (spec, layers, state_dict, metadata), read safely."""
    ckpt = read_weights_file(path)
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise EffvisionError(
            f"{path} is not an effvision checkpoint (use --pretrained / model.pretrained for plain weights)"
        )
    return ckpt


def _resize(model: nn.Module, layers: dict[str, dict], state: dict) -> None:
    """Give every pruned layer the sizes and parameter shapes recorded in the checkpoint (every
    module's tensors, so custom modules with per-channel parameters follow too)."""
    for name, m in model.named_modules():
        for k, v in layers.get(name, {}).items():
            setattr(m, k, tuple(v) if isinstance(v, list) else v)
        for pname, p in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
            key = f"{name}.{pname}" if name else pname
            if p is not None and key in state and state[key].shape != p.shape:
                new = torch.empty(state[key].shape, dtype=p.dtype)
                if isinstance(p, nn.Parameter):
                    setattr(m, pname, nn.Parameter(new, requires_grad=p.requires_grad))
                else:
                    m.register_buffer(pname, new)


def load_checkpoint(path: str | Path, model: nn.Module | None = None) -> nn.Module:
    """Rebuild the (possibly pruned) model saved by save_checkpoint(). A checkpoint of a model
    effvision.compress was given (the caller's own module) is rebuilt from `model`, a new
    instance of that module (unpruned, any weights)."""
    ckpt = read_checkpoint(path)
    if model is not None and str(ckpt["spec"].get("arch", "")).startswith(CALLER):
        remember(ckpt["spec"], model)
    model = build(ckpt["spec"])
    _resize(model, ckpt["layers"], ckpt["state_dict"])
    load_state(model, ckpt["state_dict"], path, strict=True)
    model.effvision_metadata = ckpt.get("metadata")  # what the file says of itself (deploy/metadata.py)
    return model.eval()
