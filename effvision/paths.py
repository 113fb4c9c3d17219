"""Where the user-editable YAML lives: the working folder first, then the project checkout."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import EffvisionError

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def search_dirs(kind: str) -> list[Path]:
    """Folders holding cards of one kind (models, compress, data), most specific first."""
    dirs = [Path.cwd() / kind]
    home = os.environ.get("EFFVISION_HOME")
    if home:
        dirs.append(Path(home) / kind)
    dirs.append(PROJECT_ROOT / kind)
    seen, out = set(), []
    for d in dirs:
        r = d.resolve()
        if r not in seen:
            seen.add(r)
            out.append(d)
    return out


def find_file(path: str | Path, kind: str, what: str) -> Path:
    """A path as given, or a bare name looked up as <kind>/<name>.yaml."""
    p = Path(path)
    if p.is_file():
        return p
    for d in search_dirs(kind):
        for cand in (d / p, d / f"{p}.yaml"):
            if cand.is_file():
                return cand
    raise EffvisionError(f"{what} not found: {path} (give a path, or a name from {kind}/)")


def card_files(kind: str) -> dict[str, Path]:
    """name -> file for every card of one kind, earlier search folders winning."""
    found: dict[str, Path] = {}
    for d in reversed(search_dirs(kind)):
        if d.is_dir():
            for f in sorted(d.glob("*.yaml")):
                found[f.stem] = f
    return found
