"""Generated datasets are written once into a folder and reused while their parameters match:
each sample is rendered into a temporary folder that replaces the old one only when complete."""

from __future__ import annotations

import inspect
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import EffvisionError
from ..fileio import new_temporary_dir
from .layouts import Accept, folder_entries


def write_once(
    root: Path,
    params: dict,
    classes: list[str],
    per_split: dict[str, int],
    write_sample: Callable,
    description: str,
    progress=None,
) -> Path:
    """<root>/<split>/<class>/<n>.<ext> for every split and class, written by
    write_sample(folder, label, n, rng) with a generator seeded by (seed, split, label, n);
    nothing is written when <root>/dataset.json already holds `params`."""
    meta = root / "dataset.json"
    if meta.is_file() and json.loads(meta.read_text()) == params:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(root)
    tmp = new_temporary_dir(root)
    try:
        jobs = [
            (k, split, label, n)
            for k, (split, count) in enumerate(per_split.items())
            for label in range(len(classes))
            for n in range(count)
        ]
        for k, split, label, n in (progress or (lambda it, **_: it))(jobs, description=description):
            folder = tmp / split / classes[label]
            folder.mkdir(parents=True, exist_ok=True)
            write_sample(folder, label, n, np.random.default_rng([params["seed"], k, label, n]))
        (tmp / "dataset.json").write_text(json.dumps(params))
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)  # readers see the old set or the complete new one
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return root


def _remove_abandoned(root: Path) -> None:
    """Delete the temporary folders of earlier generations whose process died (killed mid-way):
    each is named .<root>.<pid>.<random>; a live writer's folder is left alone."""
    for folder in root.parent.glob(f".{root.name}.*.*"):
        pid = folder.name[len(root.name) + 2 :].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's
        pass
    return True


def generated_splits(
    card, config, generate: Callable, accept: Accept, kind: str, progress=None
) -> tuple[Path, list, list]:
    """(root, train pairs, val pairs) of a generated dataset: generate(root, **card.generate)
    under data.root (default runs/data/<card name>), written once and reused."""
    options = [p for p in inspect.signature(generate).parameters if p not in ("root", "progress")]
    unknown = sorted(set(card.generate) - set(options))
    if unknown:
        raise EffvisionError(
            f"dataset {card.name}: unknown generate option {', '.join(unknown)} (choices: {', '.join(options)})"
        )
    root = Path(config.root or card.root or f"runs/data/{card.name}").expanduser()
    generate(root, progress=progress, **card.generate)
    _, train = folder_entries(root / "train", accept, kind)
    _, val = folder_entries(root / "val", accept, kind)
    return root, train, val
