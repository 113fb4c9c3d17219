"""Recipes: YAML -> typed, validated pydantic objects; `--set a.b=value` overrides; clear errors."""

from __future__ import annotations

import copy
import difflib
import re
import typing
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from . import yamlio
from .errors import EffvisionError
from .goals import Goal, goal_of
from .paths import find_file
from .registry import STAGES


class RecipeError(EffvisionError):
    """A recipe that cannot be used: names the file, the key path and what is allowed."""


class Strict(BaseModel):
    """Every config forbids unknown keys, so a typo is an error rather than a silent default."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Strict):
    name: str = Field("digits", description="dataset card (data/<name>.yaml) or registered dataset")
    root: Optional[str] = Field(None, description="folder or .zip holding the data (cards may need it)")
    image_size: Optional[int] = Field(None, gt=0, description="override the card's input size")
    batch_size: int = Field(64, gt=0, description="training batch (stages may set their own)")
    eval_batch_size: int = Field(256, gt=0, description="batch of evaluation and calibration passes")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes (0: in the main process)")
    on_bad_sample: Literal["skip", "fail"] = Field(
        "skip", description="an unreadable file: skip it (counted in the report) or stop with its name"
    )
    holdout: Optional[Union[int, float]] = Field(
        None,
        ge=0,
        description="training samples held out for decisions (a count, or a fraction < 1), stratified and fixed by "
        "holdout_seed, cut before selection and max_train_samples; no stage trains on them. Default: 10% (at most "
        "5000) where a stage decides, none where the recipe only trains; 0: none (a stage that decides then stops)",
    )
    holdout_seed: int = Field(
        0, description="the seed of the decision split's draw (not the run's seed: it stays fixed)"
    )
    max_train_samples: Optional[int] = Field(None, gt=0, description="stratified subset, for short runs")
    max_val_samples: Optional[int] = Field(None, gt=0, description="stratified subset of the validation split")
    num_frames: Optional[int] = Field(None, gt=0, description="video: override the card's frames per clip")
    sampler: Optional[str] = Field(None, description="video/points: override the card's frame or point sampler")
    num_points: Optional[int] = Field(None, gt=0, description="points: override the card's points per cloud")


class ModelConfig(Strict):
    name: str = Field(..., description="zoo card, registered model, timm:<name> or torchvision:<name>")
    pretrained: Optional[str] = Field(
        None,
        description="a local .pth/.safetensors file, hf-hub:<repo_id> (from the Hugging Face cache) or zoo (the "
        "card's weights)",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the model's builder")


class StageConfig(Strict):
    """Base of every stage's config; `type` selects the handler through the STAGES registry."""

    type: str
    name: Optional[str] = None

    def recipe_problem(self, recipe: Recipe) -> Optional[str]:
        """What is wrong with this stage in `recipe` that the stage alone cannot see (None: nothing)."""
        return None

    def decides(self, recipe: Recipe) -> bool:
        """Whether it makes a choice in `recipe` that is scored on the decision split (data.holdout)."""
        return False


class TargetConfig(Strict):
    """What the compressed artifact must achieve where it ships: a speed-up over the uncompressed
    reference (or an absolute latency) on one backend and batch, losing at most max_drop of top-1."""

    backend: str = Field("onnxruntime-cpu", description="where the artifact runs: onnxruntime-cpu, torch-eager, ...")
    batch: int = Field(1, gt=0, description="the batch size the latency is measured at")
    speedup: Optional[float] = Field(
        None,
        description="times faster than the uncompressed fp32 reference, > 1 (with neither this nor latency_ms: the "
        "fastest file within max_drop)",
    )
    latency_ms: Optional[float] = Field(None, gt=0, description="instead of speedup: the median latency to reach")
    max_drop: Optional[float] = Field(None, ge=0, lt=1, description="largest accepted top-1 loss (absolute)")
    resolutions: list[int] = Field(
        default_factory=list,
        description="lower input sizes a plan stage measures as levers (fp32 and int8), e.g. [96, 80]; each at most "
        "the model's own",
    )

    @field_validator("resolutions")
    @classmethod
    def _sizes(cls, v):
        if any(r < 8 for r in v):
            raise ValueError("input sizes must be at least 8 pixels")
        return sorted(set(v), reverse=True)

    @field_validator("speedup")
    @classmethod
    def _faster(cls, v):
        if v is not None and v <= 1:
            raise ValueError("must be > 1 (the compressed artifact's speed over the uncompressed reference's)")
        return v

    @model_validator(mode="after")
    def _one_goal(self):
        if self.speedup is not None and self.latency_ms is not None:
            raise ValueError("give exactly one of speedup (e.g. 2.0) and latency_ms")
        if self.speedup is None and self.latency_ms is None and self.max_drop is None:
            raise ValueError(
                "give exactly one of speedup (e.g. 2.0) and latency_ms, or max_drop alone (the fastest file within it)"
            )
        return self

    @property
    def goal(self) -> Goal:
        """What it asks of speed (goals.py): a speed-up, a latency, or the fastest file within max_drop."""
        return goal_of(self)


class Recipe(Strict):
    name: str = Field("run", description="the run's name; the CLI's default run folder is runs/<name>")
    description: str = Field("", description="free text, kept with the recipe in the run folder")
    seed: int = Field(0, description="seeds every random draw: data order, augmentation, initialisation, selection")
    device: str = Field("auto", description="auto, cpu or cuda")
    data: DataConfig = Field(default_factory=DataConfig, description="the dataset (keys below)")
    model: ModelConfig = Field(..., description="the network (keys below)")
    target: Optional[TargetConfig] = Field(None, description="what compression aims at; stages that can aim read it")
    stages: list[Any] = Field(
        default_factory=list, description="the stages, in order (each item's type: one of the stage types below)"
    )  # each becomes its type's StageConfig in validate_recipe
    presets: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="named sets of key.path: value overrides (--preset NAME)"
    )
    _source: Optional[str] = PrivateAttr(None)  # the file it came from, for run folders and errors
    _decided_by: Optional[str] = PrivateAttr(None)  # a caller that chooses among runs by their scores (a search)


# ----------------------------------------------------------------------------- overrides
def parse_set(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise RecipeError(f"--set {item!r}: expected key.path=value")
    key, value = item.split("=", 1)
    if not key.strip():
        raise RecipeError(f"--set {item!r}: empty key")
    try:
        return key.strip().split("."), yamlio.load(value) if value != "" else None
    except yamlio.YAMLError:
        raise RecipeError(f"--set {item!r}: the value is not valid YAML (quote it)") from None


def apply_overrides(raw: dict, sets: list[str]) -> dict:
    """Apply `a.b.1.c=value` overrides; list items may also be named by a stage's name."""
    raw = copy.deepcopy(raw)
    for item in sets or []:
        keys, value = parse_set(item)
        _assign(raw, keys, value, f"--set {item}")
    return raw


def apply_preset(raw: dict, name: str, source: str) -> dict:
    """Apply the recipe's own preset `name` (a mapping of key.path: value, like --set)."""
    presets = raw.get("presets") or {}
    if not isinstance(presets, dict) or name not in presets:
        have = (
            ", ".join(map(str, presets)) if isinstance(presets, dict) and presets else "none"
        )  # YAML keys may be ints
        raise RecipeError(f"{source}: unknown preset '{name}' (this recipe defines: {have})")
    if not isinstance(presets[name], dict):
        raise RecipeError(f"{source}: presets.{name}: must map key.path to a value, e.g. stages.train.lr: 0.1")
    raw = copy.deepcopy(raw)
    for key, value in presets[name].items():
        # A copy: a later key (x.y) must not write into the preset's own value of an earlier one (x).
        _assign(raw, str(key).split("."), copy.deepcopy(value), f"{source}: presets.{name}.{key}")
    return raw


def _assign(raw: dict, keys: list[str], value: Any, what: str) -> None:
    node: Any = raw
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        where = ".".join(keys[: depth + 1])
        if isinstance(node, list):
            idx = _list_index(node, key, f"{what}: {where}")
            if last:
                node[idx] = value
            else:
                node = node[idx]
        elif isinstance(node, dict):
            if last:
                node[key] = value
            else:
                node = node.setdefault(key, {})
        else:
            raise RecipeError(f"{what}: '{'.'.join(keys[:depth])}' is not a mapping or list")


def _list_index(items: list, key: str, where: str) -> int:
    # ASCII digits only: str.isdigit() accepts '²' and lstrip("-") accepts '--1', which int() refuses.
    if re.fullmatch(r"-?[0-9]+", key):
        idx = int(key) if len(key) <= 18 else None  # int() refuses over 4300 digits; any such index is out of range
        if idx is None or not -len(items) <= idx < len(items):
            raise RecipeError(f"{where}: index {key} out of range ({len(items)} items)")
        return idx
    # One entry per item (None for non-mappings), so a name's position is its index in items.
    names = [(s.get("name") or s.get("type")) if isinstance(s, dict) else None for s in items]
    if key in names:
        return names.index(key)
    named = [str(n) for n in names if n is not None]
    raise RecipeError(f"{where}: no item named '{key}' (items: {', '.join(named)})")


# ----------------------------------------------------------------------------- validation
def _unwrap(annotation: Any) -> Any:
    """The BaseModel class inside Optional[...] / list[...] annotations, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _unwrap(arg)
        if found is not None:
            return found
    return None


def _model_at(cls: type[BaseModel], loc: tuple) -> Optional[type[BaseModel]]:
    for key in loc:
        if isinstance(key, int) or cls is None:
            continue
        field = cls.model_fields.get(key)
        cls = _unwrap(field.annotation) if field else None
    return cls


def _format_errors(err: ValidationError, cls: type[BaseModel], prefix: str, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = f"{prefix}{'.'.join(str(p) for p in loc)}"
        if e["type"] == "extra_forbidden":
            parent = _model_at(cls, loc[:-1])
            valid = sorted(parent.model_fields) if parent else []
            close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            lines.append(f"{source}: {path}: unknown key{hint} (valid keys: {', '.join(valid)})")
        elif e["type"] == "missing":
            lines.append(f"{source}: {path}: required key is missing")
        else:
            msg = e["msg"].removeprefix("Value error, ")  # pydantic's prefix on our own validators' messages
            lines.append(f"{source}: {path}: {msg} (got {e.get('input')!r})")
    return "; ".join(lines)


def validate_stage(raw: Any, index: int, source: str) -> StageConfig:
    where = f"stages.{index}"
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: {where}: a stage must be a mapping with a 'type' key")
    if "type" not in raw:
        raise RecipeError(f"{source}: {where}.type: required key is missing (choices: {', '.join(STAGES.names())})")
    try:
        stage = STAGES.get(str(raw["type"]))
    except ValueError as exc:
        raise RecipeError(f"{source}: {where}.type: {exc}") from None
    try:
        return stage.config.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError(_format_errors(exc, stage.config, f"{where}.", source)) from None


def validate_recipe(raw: Any, source: str = "<recipe>") -> Recipe:
    """Turn a raw mapping into a Recipe whose stages are each their own typed config."""
    if not STAGES.names():
        # The stage modules sit above this one and register themselves when imported.
        raise RuntimeError("no stage types are registered: import effvision.stages before validating a recipe")
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: a recipe must be a YAML mapping")
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError(_format_errors(exc, Recipe, "", source)) from None
    typed = [validate_stage(s, i, source) for i, s in enumerate(recipe.stages)]
    names = [s.name or s.type for s in typed]
    for i, s in enumerate(typed):
        s.name = names[i]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecipeError(f"{source}: stages: names must be unique; repeated: {', '.join(dupes)} (give each a 'name:')")
    for s in typed:
        problem = s.recipe_problem(recipe)
        if problem:
            raise RecipeError(f"{source}: stages.{s.name}.{problem}")
    recipe.stages = typed
    return recipe


def load_card(path: Path, cls: type[BaseModel], default_name: str) -> BaseModel:
    """A declarative YAML card (model or dataset) validated like a recipe, errors naming the file."""
    raw = read_yaml(path) or {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a card must be a YAML mapping")
    raw.setdefault("name", default_name)
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise RecipeError(_format_errors(exc, cls, "", str(path))) from None


def read_yaml(path: Path) -> Any:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: is not a UTF-8 text file (a YAML recipe or card is expected)") from None
    try:
        return yamlio.load(text)
    except yamlio.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise RecipeError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', None) or exc})") from None


def load_recipe(path: str | Path, overrides: list[str] | None = None, preset: str | None = None) -> Recipe:
    """Load a recipe file (or a name under compress/), apply a preset of its own, then --set
    overrides, and validate."""
    file, raw = raw_recipe(path, overrides, preset)
    return recipe_from_raw(raw, file)


def raw_recipe(path: str | Path, overrides: list[str] | None = None, preset: str | None = None) -> tuple[Path, dict]:
    """A recipe file (or a name under compress/) as the mapping it holds, with a preset of its own
    and --set overrides applied, before validation."""
    file = find_file(path, "compress", "recipe")
    raw = read_yaml(file) or {}
    if preset:
        raw = apply_preset(raw if isinstance(raw, dict) else {}, preset, str(file))
    return file, apply_overrides(raw, overrides or [])


def with_value(raw: dict, key: str, value: Any, what: str) -> dict:
    """A copy of a raw recipe with `key` (a.b.1.c, list items also by a stage's name) set to value."""
    raw = copy.deepcopy(raw)
    _assign(raw, key.split("."), value, what)
    return raw


def recipe_from_raw(raw: Any, file: str | Path) -> Recipe:
    recipe = validate_recipe(raw, str(file))
    recipe._source = str(file)
    return recipe


def recipe_to_dict(recipe: Recipe) -> dict:
    out = recipe.model_dump(mode="json", exclude={"stages"})
    out["stages"] = [s.model_dump(mode="json") for s in recipe.stages]
    return out
