"""What the import contract (tests/contract.py, run by make lint) does not say by itself: every
module of effvision/models/ has its own layer, the data modalities never import each other, and the
top of effvision/data/ stays small."""

from __future__ import annotations

from pathlib import Path

import pytest
from contract import DATA_MODALITIES, MODELS_LAYERS, imports, modules

PACKAGE = Path(__file__).resolve().parents[1] / "effvision"
KNOWN = modules(PACKAGE)


def test_every_model_module_is_placed():
    # "effvision.models" (the package) would take in an unlisted module at the top of models/: list it
    listed = {name for names in MODELS_LAYERS for name in names}
    unplaced = sorted(m for m in KNOWN if m.startswith("effvision.models.") and m not in listed)
    assert not unplaced, f"give {unplaced} a layer in MODELS_LAYERS (tests/contract.py)"


def modality_of(module: str) -> str | None:
    return next((m for m in DATA_MODALITIES if module == m or module.startswith(m + ".")), None)


@pytest.mark.parametrize("modality", DATA_MODALITIES)
def test_modalities_stay_apart(modality):
    # images, video and points share only what lies below them: none imports another
    crossing = [
        f"{file.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for name, file in KNOWN.items()
        if modality_of(name) == modality
        for target, _, line in imports(name, file, KNOWN)
        if modality_of(target) not in (None, modality)
    ]
    assert not crossing, "\n".join(crossing)


def test_the_data_package_stays_small():
    # the top of effvision/data/ holds the shared modules and what joins the modalities; the rest lives
    # in a modality's sub-package
    top = sorted(p.name for p in (PACKAGE / "data").glob("*.py"))
    assert len(top) <= 13, top
    assert {p.name for p in (PACKAGE / "data").iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "images",
        "video",
        "points",
    }
