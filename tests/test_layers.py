"""The package's imports point down only: every import inside effvision/ (at module level or inside
a function) goes to a module of the same layer or a lower one, in the order written here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "effvision"

DATA_SHARED = [
    f"effvision.data.{name}"
    for name in ("archive", "cards", "layouts", "generated", "selectors", "samplers", "timing", "tensor_batches")
]
DATA_MODALITIES = ["effvision.data.images", "effvision.data.video", "effvision.data.points"]

# effvision/models/, lowest first; every module of it is listed by its full name (test_every_model_module_is_placed)
MODELS_LAYERS = [
    # base pieces: the model contract, timm/torchvision adapters, the caller's modules, profiling, the plain
    # architectures, the zoo card schema
    [
        f"effvision.models.{name}"
        for name in ("contract", "adapters", "caller", "profile", "cifar_resnet", "points", "speednet", "cards")
    ],
    # reading and checking weights
    ["effvision.models.weights"],
    # where weights come from: the zoo's card files, the Hugging Face cache, installed packages (and their layouts)
    ["effvision.models.zoo", "effvision.models.hub", "effvision.models.layouts", "effvision.models.packaged"],
    # building an architecture from a name: resolve, build, create_model
    ["effvision.models.builder"],
    # video classifiers, whose builders compose an image backbone through create_model
    ["effvision.models.video"],
    # checkpoints of built (and pruned) models
    ["effvision.models.checkpoint"],
    # the models a command line names, the package (which registers the architectures), scoring a model
    ["effvision.models.factory", "effvision.models", "effvision.scoring"],
]

# Lowest first. A module belongs to the layer of its longest listed prefix.
LAYERS = [
    # base: no knowledge of models, data or recipes
    [
        "effvision.errors",
        "effvision.paths",
        "effvision.yamlio",
        "effvision.fileio",
        "effvision.native_stderr",
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
    # what a stage works on: models from the bottom up (MODELS_LAYERS), then data from the bottom up
    *MODELS_LAYERS,
    # data shared by every modality: archives, cards, layouts, generated data, selection, samplers' constructor,
    # timing, batches of tensors
    DATA_SHARED,
    # one sub-package per modality (never importing each other: test_modalities_stay_apart)
    DATA_MODALITIES,
    # what joins the modalities: load_dataset (the package itself), the caller's data, compression, inspection
    ["effvision.data"],
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


MODELS_SOURCES = sorted((PACKAGE / "models").glob("*.py"))


def test_every_model_module_is_placed():
    # "effvision.models" (the package) would take in an unlisted module at the top of models/: list it
    listed = {name for names in MODELS_LAYERS for name in names}
    unplaced = sorted(module_name(p) for p in MODELS_SOURCES if module_name(p) not in listed)
    assert not unplaced, f"give {unplaced} a layer in MODELS_LAYERS ({Path(__file__).name})"


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as [a, b, ..., a], or [] when it has none (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the search path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


def test_import_cycle_is_found():
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_models_import_no_circle():
    # Every import between modules of effvision/models/, at module level or inside a function: a circle
    # (a imports b, b imports a, however late) means neither can be read or tested without the other.
    modules = {module_name(p): p for p in MODELS_SOURCES}

    def owner(target: str) -> str | None:  # the models module an import reaches (its longest prefix)
        found = [m for m in modules if target == m or target.startswith(m + ".")]
        return max(found, key=len) if found else None

    graph = {
        own: {o for _, target in imports_of(path) if (o := owner(target)) not in (None, own)}
        for own, path in modules.items()
    }
    cycle = import_cycle(graph)
    assert not cycle, "effvision/models/ imports in a circle: " + " -> ".join(cycle)


def modality_of(module: str) -> str | None:
    return next((m for m in DATA_MODALITIES if module == m or module.startswith(m + ".")), None)


@pytest.mark.parametrize("modality", DATA_MODALITIES)
def test_modalities_stay_apart(modality):
    # images, video and points share only what lies below them: none imports another
    crossing = [
        f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}"
        for path in SOURCES
        if modality_of(module_name(path)) == modality
        for line, target in imports_of(path)
        if modality_of(target) not in (None, modality)
    ]
    assert not crossing, "\n".join(crossing)


def test_the_data_package_stays_small():
    # the top of effvision/data/ holds the shared modules and what joins the modalities; the rest lives
    # in a modality's sub-package
    top = sorted(p.name for p in (PACKAGE / "data").glob("*.py"))
    assert len(top) <= 12, top
    assert {p.name for p in (PACKAGE / "data").iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "images",
        "video",
        "points",
    }
