"""Models the caller built (effvision.compress on any nn.Module): a checkpoint of one cannot be
rebuilt from a name, so this process keeps a pristine copy of each caller module, keyed by its
fingerprint, and build() starts from a deep copy of it (the checkpoint's layer sizes and weights
then make it the pruned, trained model). Nothing of the caller's code is pickled into a file."""

from __future__ import annotations

import copy
import hashlib

import torch
from torch import nn

from ..errors import EffvisionError

CALLER = "caller:"  # the arch of a spec made here: caller:<fingerprint>
_bases: dict[str, nn.Module] = {}


def class_name(model: nn.Module) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


def architecture_hash(model: nn.Module) -> str:
    """The module's class, layers and tensor shapes (not its values)."""
    h = hashlib.sha256(class_name(model).encode())
    h.update(repr(model).encode())
    for k, v in model.state_dict().items():
        h.update(f"{k}:{tuple(v.shape)}:{v.dtype}".encode())
    return h.hexdigest()[:16]


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's raw bytes, for hashing."""
    return t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def weights_hash(model: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(tensor_bytes(v))
    return h.hexdigest()[:16]


def adopt(model: nn.Module, num_classes: int, input_size: list[int]) -> tuple[dict, dict]:
    """The spec effvision builds the caller's model from (build() deep-copies a pristine copy
    kept here; the caller's own object is never touched again), and its identity: class,
    architecture and weights hashes."""
    identity = {"class": class_name(model), "architecture": architecture_hash(model), "weights": weights_hash(model)}
    key = f"{identity['architecture']}-{identity['weights']}"
    _bases[key] = copy.deepcopy(model).cpu().eval()
    spec = {
        "name": f"{CALLER}{identity['class']}",
        "arch": f"{CALLER}{key}",
        "num_classes": num_classes,
        "input_size": list(input_size),
        "kwargs": {},
        "weights": None,
        "class": identity["class"],
        # the first train stage fine-tunes a trained body; a head create_model started afresh stays new
        "transfer": getattr(model, "effvision_spec", {}).get("transfer", {"new_head": False}),
    }
    return spec, identity


def remember(spec: dict, model: nn.Module) -> None:
    """Rebuild the checkpoint of spec from this module (effvision.load_checkpoint(path, model=...))."""
    _bases[spec["arch"][len(CALLER) :]] = copy.deepcopy(model).cpu()


def build_caller(spec: dict) -> nn.Module:
    base = _bases.get(spec["arch"][len(CALLER) :])
    if base is None:
        cls = spec.get("class", "your own module")
        raise EffvisionError(
            f"this checkpoint holds a model built from the caller's module {cls}, which effvision cannot "
            f"rebuild by name: load it in Python with effvision.load_checkpoint(path, model={cls.split('.')[-1]}(...))"
        )
    model = copy.deepcopy(base)
    model.effvision_spec = dict(spec)
    return model
