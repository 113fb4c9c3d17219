"""Checkpoints are data: state_dict + the spec and layer sizes needed to rebuild a pruned model.

Loaded with torch.load(weights_only=True): no pickled Python objects from a user's file, ever.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import EffvisionError
from ..fileio import atomic_write
from .adapters import classifier_of

FORMAT = "effvision-checkpoint/1"
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


def _read(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise EffvisionError(f"checkpoint not found: {path}")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        with warnings.catch_warnings():
            # torch notes files pickled with a newer protocol before it refuses or reads them; the
            # refusal (our one line) says what matters, the note would be a second line on stderr.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's advice (load it again with weights_only=False) is the opposite of ours; its
        # unpickler cannot tell a damaged file from one carrying code, so neither do we.
        why = str(exc).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
        raise EffvisionError(
            f"cannot read checkpoint {path}: Weights only load failed ({why}): the file is damaged or holds "
            "pickled Python objects, which effvision never loads (save weights as a state_dict or .safetensors)"
        ) from None
    except Exception as exc:  # noqa: BLE001  (any unreadable file is the user's input problem)
        raise EffvisionError(f"cannot read checkpoint {path}: {str(exc).splitlines()[0]}") from None


def read_checkpoint(path: str | Path) -> dict:
    """The payload of an effvision checkpoint (spec, layers, state_dict, metadata), read safely."""
    ckpt = _read(path)
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
    from .caller import CALLER, remember
    from .factory import build

    ckpt = read_checkpoint(path)
    if model is not None and str(ckpt["spec"].get("arch", "")).startswith(CALLER):
        remember(ckpt["spec"], model)
    model = build(ckpt["spec"])
    _resize(model, ckpt["layers"], ckpt["state_dict"])
    _load_state(model, ckpt["state_dict"], path, strict=True)
    model.effvision_metadata = ckpt.get("metadata")  # what the file says of itself (deploy/metadata.py)
    return model.eval()


def _load_state(model: nn.Module, state: dict, path, strict: bool) -> None:
    own = model.state_dict()
    bad = [k for k, v in state.items() if k in own and own[k].shape != v.shape]
    if bad:
        k = bad[0]
        raise EffvisionError(
            f"checkpoint {path} does not match the model: {k} has shape {tuple(state[k].shape)} in the file, "
            f"{tuple(own[k].shape)} in the model ({len(bad)} mismatched tensors)"
        )
    missing, unexpected = model.load_state_dict(state, strict=False)
    if strict and (missing or unexpected):
        raise EffvisionError(
            f"checkpoint {path} does not match the model: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    if not strict and len(missing) > len(own) // 2:
        raise EffvisionError(
            f"checkpoint {path} does not match the model: {len(missing)} of {len(own)} tensors missing (e.g. "
            f"{missing[0]})"
        )


def load_pretrained(model: nn.Module, path: str | Path, state: dict | None = None) -> list[str]:
    """Load plain weights (.pth/.safetensors or an effvision checkpoint, or `state` already read
    from `path`) into model; when the class count differs the classifier keeps its fresh
    initialisation. Returns the reset keys."""
    state = _read(path) if state is None else state
    if isinstance(state, dict) and state.get("format") == FORMAT:
        state = state["state_dict"]
    for key in ("state_dict", "model", "state_dict_ema"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise EffvisionError(f"{path} holds no state_dict of tensors")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    own = model.state_dict()
    head = classifier_of(model)
    head_keys = {
        f"{n}.{p}" for n, m in model.named_modules() if m is head for p, _ in m.named_parameters(recurse=False)
    }
    reset = [k for k in head_keys if k in state and state[k].shape != own[k].shape]
    for k in reset:
        state.pop(k)
    _load_state(model, state, path, strict=False)
    return reset
