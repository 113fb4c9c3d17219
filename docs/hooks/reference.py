"""mkdocs hook: the reference pages, generated from the code at every build.

- reference/recipe.md: every recipe key (type, default, allowed values, description) from the
  pydantic models of effvision.recipe and of every registered stage type;
- reference/cli.md: every command and option of the typer app;
- reference/report.md: the report.json fields (effvision.report_fields);
- reference/architecture.md: the package's layers (tests/contract.py), each module's first docstring
  line, the imports between layers and the table of runtimes (effvision.runtimes);
- benchmarks.md: BENCHMARKS.md from the repository's root, its image links made relative to docs/.

Every key, command and field gets an anchor (`#prune-ratio`, `#effvision-search-show`,
`#report-stages-accuracy`): the guides link to them, and the build (strict, anchors validated)
fails where a guide still links to a key that was renamed."""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = (
    "reference/recipe.md",
    "reference/cli.md",
    "reference/report.md",
    "reference/architecture.md",
    "benchmarks.md",
)


# ---------------------------------------------------------------------------------------------- recipe


def _is_model(t) -> bool:
    from pydantic import BaseModel

    return isinstance(t, type) and issubclass(t, BaseModel)


def _members(annotation) -> list:
    """The alternatives of a Union/Optional annotation (itself when it is not one)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return [annotation]


def type_name(annotation) -> str:
    names = []
    for t in _members(annotation):
        origin, args = typing.get_origin(t), typing.get_args(t)
        if t is type(None):
            names.append("null")
        elif origin is typing.Literal:
            names.append("one of the allowed values")
        elif origin is typing.Annotated:
            names.append(type_name(args[0]))
        elif origin in (list, tuple, set):
            names.append(f"list of {type_name(args[0])}" if args else "list")
        elif origin is dict:
            names.append(f"map of {type_name(args[0])} to {type_name(args[1])}" if args else "map")
        elif _is_model(t):
            names.append("block (keys below)")
        elif t is typing.Any:
            names.append("any")
        elif isinstance(t, type) and issubclass(t, enum.Enum):
            names.append("one of the allowed values")
        else:
            names.append(getattr(t, "__name__", str(t)))
    return " or ".join(dict.fromkeys(names))


def allowed_values(annotation) -> list:
    found = []
    for t in _members(annotation):
        if typing.get_origin(t) is typing.Annotated:
            t = typing.get_args(t)[0]
        if typing.get_origin(t) is typing.Literal:
            found += list(typing.get_args(t))
        elif isinstance(t, type) and issubclass(t, enum.Enum):
            found += [m.value for m in t]
    return found


def constraints(field) -> str:
    signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "multiple_of": "multiple of"}
    parts = []
    for meta in field.metadata:
        for attr, sign in signs.items():
            value = getattr(meta, attr, None)
            if value is not None:
                parts.append(f"{sign} {value}")
    return ", ".join(parts)


def default_text(field) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
        return "(block)" if _is_model(type(value)) else f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "required"
    return "`null`" if field.default is None else f"`{field.default!r}`"


def _plain(text: str) -> str:
    """< and > shown as written outside `code`: descriptions name placeholders such as
    runs/<name>, which Markdown would take for HTML."""
    parts = str(text).split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _cell(text: str) -> str:
    """One table cell: on one line, pipes escaped."""
    return _plain(" ".join(str(text).split()).replace("|", "\\|"))


def anchor(*parts: str) -> str:
    return "-".join(p.lower() for p in parts if p)


def field_rows(model, section: str, prefix: tuple[str, ...] = (), skip=(), recurse: bool = True) -> list[str]:
    """Table rows for a model's fields (but `skip`) and, below them, each block-valued field's own."""
    rows, blocks = [], []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        key = (*prefix, name)
        allowed = ", ".join(f"`{v}`" for v in allowed_values(field.annotation))
        limits = constraints(field)
        row_id = anchor(section, *key)
        rows.append(
            f'| <a id="{row_id}" href="#{row_id}">`{".".join(key)}`</a> | {_cell(type_name(field.annotation))} '
            f"| {_cell(default_text(field))} | {_cell(' '.join(x for x in (allowed, limits) if x))} "
            f"| {_cell(field.description or '')} |"
        )
        blocks += [(key, t) for t in _members(field.annotation) if _is_model(t) and recurse]
    for key, sub in blocks:
        rows += field_rows(sub, section, key)
    return rows


def _table(rows: list[str]) -> list[str]:
    return ["| Key | Type | Default | Allowed | Description |", "|---|---|---|---|---|", *rows, ""]


def _doc(obj) -> str:
    text = inspect.getdoc(obj) or ""
    return text.split("\n\n")[0].replace("\n", " ")


def recipe_reference() -> str:
    from effvision.recipe import DataConfig, ModelConfig, Recipe, StageConfig, TargetConfig
    from effvision.registry import STAGES
    from effvision.stages import IN_PIPELINE_ORDER  # importing it registers every stage type

    lines = [
        "# Recipe reference",
        "",
        "Generated from the recipe's pydantic models at every build of this site: every key a recipe",
        "file takes, its type, default, allowed values and description. A misspelt key is an error",
        "that names the closest one. Keys are written as in YAML; `--set KEY=VALUE` takes the same",
        "dotted paths (stages by index or name: `--set stages.prune.ratio=0.4`).",
        "",
        "## Top level",
        "",
        _doc(Recipe),
        "",
        *_table(field_rows(Recipe, "recipe", recurse=False)),
    ]
    for section, model, what in [
        ("data", DataConfig, "the dataset: a card name and what the recipe overrides of it"),
        ("model", ModelConfig, "the network: a zoo card, a registered model, or timm/torchvision by name"),
        ("target", TargetConfig, "what compression aims at (optional); stages that can aim read it"),
    ]:
        lines += [f"## `{section}`", "", f"{what[0].upper()}{what[1:]}.", "", *_table(field_rows(model, section))]
    lines += [
        "## Stages",
        "",
        "`stages:` is a list; each item's `type` picks one of the stage types below, and `name`",
        "(default: the type) names its folder and its row in the report.",
        "",
    ]
    in_order = [*IN_PIPELINE_ORDER, *(k for k in STAGES.names() if k not in IN_PIPELINE_ORDER)]
    for kind in in_order:
        stage = STAGES.get(kind)
        rows = field_rows(stage.config, kind, skip=set(StageConfig.model_fields))
        lines += [f"### `{kind}`", "", _doc(stage.run) or _doc(stage.config), "", *_table(rows)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- CLI


def _param_row(command_anchor: str, p) -> str:
    if p.param_type_name == "argument":
        name = p.name.upper()
        row_id = anchor(command_anchor, p.name)
    else:
        name = ", ".join(sorted(p.opts + p.secondary_opts, key=len, reverse=True))
        row_id = anchor(command_anchor, p.opts[0].lstrip("-"))
    if getattr(p, "is_flag", False):
        kind = "flag"
    else:
        # typer's own parameters name their Python type; plain click ones their ParamType
        kind = p.bare_type() if hasattr(p, "bare_type") else getattr(p.type, "name", "text")
    if getattr(p, "multiple", False):
        kind += ", repeatable"
    if p.required:
        default = "required"
    elif callable(p.default) or p.default in (None, ()) or (getattr(p, "is_flag", False) and not p.default):
        default = ""
    else:
        default = f"`{p.default}`"
    described = _cell(getattr(p, "help", "") or "")
    return f'| <a id="{row_id}" href="#{row_id}">`{name}`</a> | {kind} | {default} | {described} |'


def cli_reference() -> str:
    import typer

    from effvision.cli import app

    lines = [
        "# Command-line reference",
        "",
        "Generated from the command line's own definitions at every build of this site. Every",
        "command also answers `--help`.",
        "",
    ]

    def walk(cmd, path: list[str]) -> None:
        title = " ".join(path)
        cmd_anchor = anchor(*path)
        level = "#" * min(len(path) + 1, 4)
        lines.extend([f"{level} `{title}` {{#{cmd_anchor}}}", ""])
        if cmd.help:
            lines.extend([_plain(inspect.cleandoc(cmd.help).replace("\b\n", "")), ""])
        params = [p for p in cmd.params if p.name != "help"]
        if hasattr(cmd, "commands"):
            lines.extend(["Commands: " + ", ".join(f"[`{n}`](#{anchor(*path, n)})" for n in sorted(cmd.commands)), ""])
        if params:
            lines.extend(["| Argument or option | Kind | Default | Description |", "|---|---|---|---|"])
            lines.extend([_param_row(cmd_anchor, p) for p in params] + [""])
        for name in sorted(getattr(cmd, "commands", {})):
            walk(cmd.commands[name], [*path, name])

    walk(typer.main.get_command(app), ["effvision"])
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- report


def report_reference() -> str:
    from effvision.report_fields import REPORT_FIELDS, REPORT_INTRO

    lines = ["# report.json reference", "", REPORT_INTRO, ""]
    for section, intro, fields in REPORT_FIELDS:
        lines += [f"## {section}", "", intro, "", "| Field | Meaning |", "|---|---|"]
        for path, meaning in fields:
            row_id = anchor("report", *re.split(r"[.\[\]]+", path))
            lines.append(f'| <a id="{row_id}" href="#{row_id}">`{path}`</a> | {_cell(meaning)} |')
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- benchmarks


def benchmarks_page() -> str:
    """BENCHMARKS.md as a page of the site: its figures (docs/x.png) and links are relative to the
    repository's root there, to docs/ here."""
    text = (ROOT / "BENCHMARKS.md").read_text()
    return re.sub(r"\]\(docs/", "](", text)


# ---------------------------------------------------------------------------------------------- architecture


def _first_line(path: Path) -> str:
    import ast

    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return _cell(doc.split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip("."))


def architecture_page() -> str:
    """The package's rooms from the code itself: the layers the import contract holds, every
    module with the first sentence of its docstring, what each layer imports, and the runtimes."""
    import sys
    from collections import Counter

    sys.path.insert(0, str(ROOT / "tests"))
    from contract import LAYERS, imports, layer_of, modules

    package = ROOT / "effvision"
    known = modules(package)
    lines = [
        "# Architecture",
        "",
        "Generated from the code at every build: the layers below are the import contract `make lint` holds "
        "(`tests/contract.py`: a module imports its own layer and those below it, never one above; no import "
        "cycles, counting imports inside functions; no private names across modules; functions of at most 80 "
        "lines and files of at most 500). A run flows down them: the command line and the Python API call the "
        "pipeline, which runs the stages; compression stages make their int8 through the one int8 maker, which "
        "times files with the benchmark harness; deploy verifies, evaluates and benchmarks files; every file is "
        "written, opened and quantized by its runtime object.",
        "",
        "**Where a change goes.** A new runtime: one module in `effvision/runtimes/` with a `Runtime` subclass "
        "registered in `RUNTIMES` (export, int8, open, batch rule, metadata); its benchmark backends follow from its "
        "targets. A new lever of the target plan: `effvision/compression/plan.py` (`make_levers`), scored on the "
        "decision split by `compression/decisions.py`. A new kind of goal: a class in `effvision/goals.py`. A new "
        "stage: a config and a handler registered with `register_stage`, in the layer of what it uses.",
        "",
        "## Layers, top to bottom",
        "",
    ]
    edges: Counter = Counter()
    for name, file in known.items():
        for target, _, _ in imports(name, file, known):
            if target != name and layer_of(target) != layer_of(name):
                edges[(layer_of(name), layer_of(target))] += 1
    for i, layer in enumerate(LAYERS):
        below = sorted({j for (a, j) in edges if a == i})
        uses = "; ".join(f"{', '.join(LAYERS[j])} ({edges[(i, j)]})" for j in below) or "nothing of the package"
        lines += [f"### {i + 1}. {', '.join(layer)}", "", f"Imports: {uses}.", "", "| module | what it is for |"]
        lines += ["|---|---|"]
        for name, file in known.items():
            parts = name.split(".")
            top = parts[1] if len(parts) > 1 else "__init__"
            if top in layer:
                lines.append(f"| `{name}` | {_first_line(file)} |")
        lines.append("")
    lines += _runtime_table()
    return "\n".join(lines) + "\n"


def _runtime_table() -> list[str]:
    from effvision.runtimes import all_runtimes

    rows = ["## Runtimes", "", "| runtime | files | export format | backends | batch | int8 by | keeps nodes float |"]
    rows.append("|---|---|---|---|---|---|---|")
    for r in all_runtimes():
        rows.append(
            f"| {r.name} | {r.suffix or 'torch model'} | {r.format or '-'} | {', '.join(r.backends())} | "
            f"{r.batch_rule} | {_cell(r.int8_tool or '-')} | {'yes' if r.keeps_float else 'no'} |"
        )
    return rows + [""]


def page(uri: str) -> str:
    return {
        "reference/recipe.md": recipe_reference,
        "reference/cli.md": cli_reference,
        "reference/report.md": report_reference,
        "reference/architecture.md": architecture_page,
        "benchmarks.md": benchmarks_page,
    }[uri]()


def on_files(files, config):
    from mkdocs.structure.files import File

    for uri in GENERATED:
        files.append(File.generated(config, uri, content=page(uri)))
    return files
