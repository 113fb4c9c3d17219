"""Reading and checking weights: a weights file read safely, its state_dict checked against a model
and loaded (load_pretrained), and a file's sha256.

Loaded with torch.load(weights_only=True): no pickled Python objects from a user's file, ever.
"""

from __future__ import annotations

import hashlib
import pickle
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import EffvisionError
from .adapters import classifier_of

# The format of an effvision checkpoint (checkpoint.py writes it); load_pretrained takes its weights too.
FORMAT = "effvision-checkpoint/1"


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_weights_file(path: str | Path) -> dict:
    """What a .safetensors file or a torch-saved file (a state_dict or a checkpoint) holds, read
    without unpickling Python objects; a file that cannot be read so is a one-line error."""
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


def load_state(model: nn.Module, state: dict, path, strict: bool) -> None:
    """Load `state` into `model`, refusing in one line a tensor of another shape and, when `strict`,
    any missing or unexpected tensor (else more than half the model's tensors missing)."""
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
    state = read_weights_file(path) if state is None else state
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
    load_state(model, state, path, strict=False)
    return reset
