"""The package's house rules, read off its source (every import statement counts, those inside
functions too): no import cycles between modules, imports that point down the layers below, no
module importing another's private name, and no function over 80 lines or file over 500.
`make lint` runs it; `python tests/contract.py [PACKAGE_DIR]` prints each breach on a line and
exits 1 when there is one."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

DATA_SHARED = [
    f"effvision.data.{name}"
    for name in ("archive", "cards", "layouts", "generated", "selectors", "samplers", "timing", "tensor_batches")
]
DATA_MODALITIES = ["effvision.data.images", "effvision.data.video", "effvision.data.points"]

# effvision/models/, top first; every module of it is listed by its full name (test_layers.py checks)
MODELS_LAYERS = [
    # the models a command line names, the package (which registers the architectures), scoring a model
    ["effvision.models.factory", "effvision.models", "effvision.scoring"],
    # checkpoints of built (and pruned) models
    ["effvision.models.checkpoint"],
    # video classifiers, whose builders compose an image backbone through create_model
    ["effvision.models.video"],
    # building an architecture from a name: resolve, build, create_model
    ["effvision.models.builder"],
    # where weights come from: the zoo's card files, the Hugging Face cache, installed packages (and their layouts)
    ["effvision.models.zoo", "effvision.models.hub", "effvision.models.layouts", "effvision.models.packaged"],
    # reading and checking weights
    ["effvision.models.weights"],
    # base pieces: the model contract, timm/torchvision adapters, the caller's modules, profiling, the plain
    # architectures, the zoo card schema
    [
        f"effvision.models.{name}"
        for name in ("contract", "adapters", "caller", "profile", "cifar_resnet", "points", "speednet", "cards")
    ],
]

# Top to bottom: a module may import its own layer and the layers below it, never one above. A
# module belongs to the layer of its longest listed prefix ("effvision" alone: the package's __init__).
LAYERS = [
    # front ends
    ["effvision.cli", "effvision"],
    ["effvision.gpu_plan"],
    # tools built on whole runs: the Python API, studies, zoo conformance/compatibility/publishing
    ["effvision.api", "effvision.studies", "effvision.zoo"],
    # running stages: the stage runner and its report
    ["effvision.pipeline", "effvision.report", "effvision.report_text", "effvision.report_plots"],
    ["effvision.report_fields", "effvision.run_context"],
    # the registration of every stage type; a recipe's data as a run loads it
    ["effvision.stages", "effvision.run_data"],
    # what the stages do: compression (plan, prune, distill, quantize, qat) ...
    ["effvision.compression"],
    # ... making int8 in any runtime ...
    ["effvision.int8"],
    # ... verified exports, evaluation, the benchmark harness, predict and bundles ...
    ["effvision.deploy"],
    # ... every runtime's files: export, int8 tool, open, batch rule, metadata
    ["effvision.runtimes"],
    # the one training loop
    ["effvision.train"],
    # what a stage works on: data from the top down (what joins the modalities, each modality, what they share)
    ["effvision.data"],
    DATA_MODALITIES,
    DATA_SHARED,
    # and the models from the top down
    *MODELS_LAYERS,
    # typed configuration: recipes, goals and the stage contract
    ["effvision.recipe", "effvision.stage", "effvision.goals"],
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
]
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 500


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of the package at `root`."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = list(f.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports(name: str, file: Path, known: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(module imported, name imported or "", line) for every import of the package in the file."""
    package = name.split(".")[0]
    base = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == package]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            elif (node.module or "").split(".")[0] == package:
                target = node.module
            else:
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub, "", node.lineno) if sub in known else (target, alias.name, node.lineno))
    return [(_existing(t, known), what, line) for t, what, line in found if _existing(t, known)]


def _existing(target: str, known: dict[str, Path]) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def layer_of(name: str) -> int:
    """The index in LAYERS (0: the top) of a module: its longest listed prefix's layer."""
    best, found = -1, None
    for index, names in enumerate(LAYERS):
        for prefix in names:
            matches = name == prefix or (prefix != "effvision" and name.startswith(prefix + "."))
            if matches and len(prefix) > best:
                best, found = len(prefix), index
    if found is None:
        raise KeyError(f"{name} is in no layer of tests/contract.py: add it to LAYERS")
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round (Tarjan's strongly connected components)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def breaches(root: Path) -> list[str]:
    known = modules(root)
    graph: dict[str, set[str]] = defaultdict(set)
    found = []
    for name in known:
        try:
            layer_of(name)
        except KeyError as exc:
            found.append(str(exc).strip("'\""))
    if found:
        return found
    for name, file in known.items():
        graph[name]
        where = file.relative_to(root.parent)
        for target, what, line in imports(name, file, known):
            if target == name:
                continue
            graph[name].add(target)
            if layer_of(target) < layer_of(name):
                found.append(f"{where}:{line}: imports {target}, a layer above it (LAYERS in tests/contract.py)")
            if what.startswith("_") and not what.startswith("__"):
                found.append(f"{where}:{line}: imports the private name {what} of {target}")
        found += lengths(file, where)
    found += [f"import cycle: {' -> '.join(group)}" for group in cycles(graph)]
    return found


def lengths(file: Path, where: Path) -> list[str]:
    text = file.read_text()
    out = []
    if len(text.splitlines()) > MAX_FILE_LINES:
        out.append(f"{where}: {len(text.splitlines())} lines, over {MAX_FILE_LINES}")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out.append(f"{where}:{node.lineno}: {node.name} is {n} lines, over {MAX_FUNCTION_LINES}")
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parent.parent / "effvision")
    found = breaches(root)
    for line in found:
        print(line)
    if found:
        print(f"contract: {len(found)} breach(es) of the house rules in {root}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
