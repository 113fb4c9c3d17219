"""The package's imports point down only: every import inside effvision/ (at module level or inside
a function) goes to a module of the same layer or a lower one, in the order written here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "effvision"

# Lowest first. A module belongs to the layer of its longest listed prefix.
LAYERS = [
    # base: no knowledge of models, data or recipes
    [
        "effvision.errors",
        "effvision.paths",
        "effvision.yamlio",
        "effvision.fileio",
        "effvision.cache",
        "effvision.progress",
        "effvision.interrupts",
        "effvision.device",
        "effvision.env",
        "effvision.runlock",
        "effvision.registry",
    ],
    # typed configuration: recipes and the stage contract
    ["effvision.recipe", "effvision.stage"],
    # what a stage works on
    ["effvision.models", "effvision.data", "effvision.scoring"],
    # what a stage does
    ["effvision.train", "effvision.compression", "effvision.deploy"],
    # running stages: the registration of every stage type, the stage runner, its report
    ["effvision.stages", "effvision.pipeline", "effvision.report"],
    # tools built on whole runs: studies, zoo conformance/compatibility/publishing
    ["effvision.studies", "effvision.zoo"],
    # front ends
    ["effvision.cli", "effvision"],
]


def layer_of(module: str) -> int:
    best, found = -1, None
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), index
    if found is None:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {Path(__file__).name}")
    return found


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    own = module_name(path)
    return imports_in(path.read_text(), own if path.name == "__init__.py" else own.rpartition(".")[0])


def imports_in(source: str, package: str) -> list[tuple[int, str]]:
    """(line, imported module) for every effvision import in the source, relative ones resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from . import stages` imports a module, not a name: resolve it to that module
            names = [f"{target}.{a.name}" for a in node.names] if node.module is None else [target]
            found += [(node.lineno, n) for n in names if n.startswith("effvision")]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("effvision")]
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    assert len(SOURCES) > 50
    for path in SOURCES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_point_down(path):
    own = module_name(path)
    upward = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target} (layer {layer_of(target)} > {layer_of(own)})"
        for line, target in imports_of(path)
        if layer_of(target) > layer_of(own)
    ]
    assert not upward, "\n".join(upward)


def test_an_upward_import_is_caught():
    # The walker itself: a function-level import of the pipeline from recipe.py is an upward import.
    source = (PACKAGE / "recipe.py").read_text() + "\n\ndef _late():\n    from . import pipeline\n"
    upward = [t for _, t in imports_in(source, "effvision") if layer_of(t) > layer_of("effvision.recipe")]
    assert upward == ["effvision.pipeline"]
