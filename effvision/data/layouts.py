"""Dataset layouts shared by the video and point-cloud readers: class-per-folder trees,
ModelNet's `<class>/<split>/<file>` tree and annotation lists (`path label` lines or CSV)."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import EffvisionError

Accept = Callable[[str], bool]  # does a file name belong to the dataset (by extension)?


def _files(root: Path, accept: Accept) -> list[Path]:
    if not root.is_dir():
        raise EffvisionError(f"data path not found: {root}")
    return sorted(p for p in root.rglob("*") if p.is_file() and accept(p.name) and not p.name.startswith("."))


def folder_entries(root: Path, accept: Accept, kind: str = "files") -> tuple[list[str], list[tuple[Path, str]]]:
    """Class folders and (file, class) pairs of <root>/<class>/<file> (files may sit deeper)."""
    pairs = [(p, p.relative_to(root).parts[0]) for p in _files(root, accept) if len(p.relative_to(root).parts) >= 2]
    if not pairs:
        raise EffvisionError(f"no {kind} in class-per-folder layout (<class>/<file>) under {root}")
    return sorted({c for _, c in pairs}), pairs


def modelnet_entries(
    root: Path, split: str, accept: Accept, kind: str = "files"
) -> tuple[list[str], list[tuple[Path, str]]]:
    """(file, class) pairs of ModelNet's layout, <root>/<class>/<split>/<file>; the classes are
    every class folder (a class may lack files in one split)."""
    classes = (
        sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")) if root.is_dir() else []
    )
    pairs = [(p, c) for c in classes if (root / c / split).is_dir() for p in _files(root / c / split, accept)]
    if not pairs:
        raise EffvisionError(f"no {kind} in ModelNet layout (<class>/{split}/<file>) under {root}")
    return classes, pairs


def list_entries(list_file: Path, root: Path, accept: Accept) -> list[tuple[Path, str]]:
    """(file, label) pairs of an annotation list: `path label` lines (label a class name or an
    index; a line with only a path takes its folder as the class) or a CSV with path and label
    columns. Paths are relative to `root`."""
    if not list_file.is_file():
        raise EffvisionError(f"annotation list not found: {list_file}")
    text = list_file.read_text(errors="replace")
    if list_file.suffix.lower() == ".csv":
        rows = list(csv.reader(text.splitlines()))
        head = [h.strip().lower() for h in rows[0]] if rows else []
        if "path" in head and "label" in head:
            rows = [(r[head.index("path")], r[head.index("label")]) for r in rows[1:] if r]
        else:
            rows = [(r[0], r[1] if len(r) > 1 else "") for r in rows if r]
    else:
        rows = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.rsplit(maxsplit=1)
            rows.append((line, "") if len(parts) == 1 or accept(line) else (parts[0], parts[1]))
    pairs = []
    for n, (rel, label) in enumerate(rows, 1):
        rel = rel.strip()
        label = label.strip() or Path(rel).parent.name
        if not label:
            raise EffvisionError(
                f"{list_file}:{n}: no label for {rel} (write `path label`, or put the file in a class folder)"
            )
        pairs.append((root / rel, label))
    if not pairs:
        raise EffvisionError(f"annotation list {list_file} has no entries")
    return pairs


def class_names(labels: list[str]) -> list[str]:
    """Sorted class names; all-integer labels (UCF101's 1-based indices) sort as numbers."""
    uniq = set(labels)
    return sorted(uniq, key=int) if all(u.lstrip("-").isdigit() for u in uniq) else sorted(uniq)


def label_indices(pairs: list[tuple[Path, str]], classes: list[str]) -> list[tuple[Path, int]]:
    """(file, class index) pairs; a label outside `classes` (the training classes) is an error."""
    index = {c: k for k, c in enumerate(classes)}
    missing = sorted({c for _, c in pairs} - set(index))
    if missing:
        raise EffvisionError(f"labels not among the training classes: {', '.join(missing[:5])}")
    return [(p, index[c]) for p, c in pairs]


def folder_splits(
    card, config, accept: Accept, kind: str
) -> tuple[list[str], list[tuple[Path, str]], list[tuple[Path, str]]]:
    """(classes, train pairs, val pairs) of <root>/<train>/<class>/<file> and the val split
    (card train/val name the folders; defaults train, and val or test)."""
    root = data_root(card, config)
    classes, train = folder_entries(split_path(root, card.train, ("train",)), accept, kind)
    _, val = folder_entries(split_path(root, card.val, ("val", "test")), accept, kind)
    return classes, train, val


def list_splits(card, config, accept: Accept) -> tuple[list[str], list[tuple[Path, str]], list[tuple[Path, str]]]:
    """(classes, train pairs, val pairs) of the annotation lists a card names (train, val),
    relative to the data root like their entries."""
    root = data_root(card, config)
    if not card.train or not card.val:
        raise EffvisionError(f"dataset {card.name}: a {card.source} card names its train and val list files")
    train, val = list_entries(root / card.train, root, accept), list_entries(root / card.val, root, accept)
    return class_names([c for _, c in train]), train, val


@dataclass
class ScanReport:
    total: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)


def data_root(card, config) -> Path:
    """The folder a card's data lives in: data.root, else the card's root; it must exist."""
    root_str = config.root or card.root
    if not root_str:
        raise EffvisionError(
            f"dataset {card.name} needs a path: pass --set data.root=<folder holding {card.train or 'train/'}>"
        )
    root = Path(root_str).expanduser()
    if not root.exists():
        raise EffvisionError(f"data path not found: {root}")
    if root.is_file() and root.suffix.lower() == ".zip" and card.modality != "image":
        # decord, PyAV and open3d read files on disk: a video or point-cloud archive is
        # extracted once (safely) into the cache; images are read from the .zip in place
        from .archive import extract_once

        return extract_once(root, card.cache_dir)
    return root


def split_path(root: Path, given: str | None, defaults: tuple[str, ...]) -> Path:
    for name in [given] if given else list(defaults):
        if (root / name).exists():
            return root / name
    tried = given or " or ".join(defaults)
    raise EffvisionError(f"data path not found: {root / tried} (set data.root to the folder that holds it)")
