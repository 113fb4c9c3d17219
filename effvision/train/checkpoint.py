"""Epoch checkpoints of the one training loop: everything a killed training needs to continue from
its last finished epoch and end with the weights and figures of a run that was never stopped (same
seed, same machine): the model, optimizer, schedule, EMA, gradient scaler, feature adapters, the
random states (python, numpy, torch, the DataLoader's shuffling generator) of every process, and the
loop's record so far (history, training seconds, time-to-accuracy).

A stage's checkpoints live in its folder under resume/ (RESUME_DIR), one file per training call
(a stage may train more than once: a gradual prune fine-tunes after every step); the pipeline keeps
that folder for the stage's next attempt and removes it once the stage completes. The file of a
training that finished is kept until then too, so the next attempt skips that training whole.

Loaded with torch.load(weights_only=True): tensors and plain Python values only (convention 9)."""

from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import nn

from ..fileio import atomic_write
from ..interrupts import deferred_signals
from ..progress import log
from . import distributed

RESUME_DIR = "resume"
FORMAT = 1

# The last epoch checkpoint this process wrote or resumed from: what an interrupt line says is kept.
last_saved: dict = {}


@dataclass(frozen=True)
class EpochCheckpoint:
    """Where one training call keeps its epoch checkpoints, and how often (every `every` epochs,
    and always after the last one)."""

    path: Path
    every: int = 1

    def due(self, epochs_done: int, last: bool) -> bool:
        return last or epochs_done % self.every == 0


def for_stage(stage_dir: Path, label: str, every: int) -> Optional[EpochCheckpoint]:
    """The checkpoint of the training call named `label` in a stage (None when every is 0)."""
    if every <= 0:
        return None
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label).strip("-") or "train"
    return EpochCheckpoint(Path(stage_dir) / RESUME_DIR / f"{slug}.pt", every)


def structure(state_dict: dict) -> dict[str, list[int]]:
    """Every tensor's name and shape: a checkpoint resumes only the model it was taken of."""
    return {k: list(v.shape) for k, v in state_dict.items()}


def rng_state(loader) -> dict:
    """This process's random states: python, numpy, torch (CPU and CUDA) and the shuffling
    generator of a DataLoader (the batched loaders draw from (seed, epoch) alone)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state = {
        "python": [version, list(internal), gauss_next],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    gen = getattr(loader, "generator", None)
    if isinstance(gen, torch.Generator):
        state["loader"] = gen.get_state()
    return state


def set_rng_state(state: dict, loader) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    gen = getattr(loader, "generator", None)
    if "loader" in state and isinstance(gen, torch.Generator):
        gen.set_state(state["loader"])


def save(ck: EpochCheckpoint, state: dict, loader) -> float:
    """Write the checkpoint (rank 0; every rank's random states gathered into it); the seconds it
    took. A stop signal arriving meanwhile is raised once the file is complete."""
    start = time.perf_counter()
    rngs = distributed.gather_objects(rng_state(loader))
    if distributed.rank() == 0:
        state = {"format": FORMAT, "processes": len(rngs), "rng": rngs, **state}
        with deferred_signals():
            atomic_write(ck.path, lambda tmp: torch.save(state, tmp))
            last_saved.update(path=str(ck.path), label=state["label"], epoch=state["epoch"], epochs=state["epochs"])
    return time.perf_counter() - start


def load(ck: Optional[EpochCheckpoint], model: nn.Module, label: str) -> Optional[dict]:
    """The checkpoint this training can continue from, or None (none yet; or one of another model,
    process count or format, which is said and set aside: the training starts afresh)."""
    if ck is None or not ck.path.is_file():
        return None
    try:
        state = torch.load(ck.path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001  (a damaged file costs its epochs, never the run)
        log(f"[yellow]  {label}: checkpoint {ck.path.name} unreadable ({type(exc).__name__}); training afresh[/]")
        return None
    why = None
    if state.get("format") != FORMAT:
        why = f"format {state.get('format')}, this version writes {FORMAT}"
    elif structure(state.get("model", {})) != structure(model.state_dict()):
        why = "it is of a model of other layers or widths"
    elif state.get("processes") != distributed.world():
        why = f"it was taken with {state.get('processes')} processes, this run has {distributed.world()}"
    if why:
        log(f"[yellow]  {label}: epoch checkpoint not used ({why}); training afresh[/]")
        return None
    last_saved.update(path=str(ck.path), label=label, epoch=state["epoch"], epochs=state["epochs"])
    return state


def restore_rng(state: dict, loader) -> None:
    """This process's random states as they were when the checkpoint was taken."""
    set_rng_state(state["rng"][distributed.rank()], loader)
