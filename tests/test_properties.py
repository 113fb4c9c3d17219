"""Property-based tests (hypothesis): the recipe parser and `--set` overrides, the video frame
samplers and the point-cloud samplers keep their promises for any input, and bad user input is
always a RecipeError (one clear line), never a raw exception."""

from __future__ import annotations

import copy
import re
import tempfile
import types
import typing
from itertools import pairwise
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import yaml
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import effvision.data  # noqa: F401  (registers every sampler)
import effvision.stages  # noqa: F401  (registers every stage type)
from effvision import yamlio
from effvision.data.points.samplers import get_point_sampler
from effvision.data.video import frame_samplers
from effvision.data.video.frame_samplers import get_sampler, segment_indices
from effvision.data.video.io import Video
from effvision.recipe import (
    DataConfig,
    Recipe,
    RecipeError,
    apply_overrides,
    apply_preset,
    load_recipe,
    parse_set,
    recipe_to_dict,
    validate_recipe,
)
from effvision.registry import SAMPLERS, STAGES

# Reproducible in CI: the same examples every run, no example database, and a failure prints
# the blob that replays it (@reproduce_failure).
settings.register_profile("effvision-properties", derandomize=True, database=None, print_blob=True, deadline=None)
settings.load_profile("effvision-properties")

VIDEO_SAMPLERS = [n for n in SAMPLERS.names() if getattr(SAMPLERS.get(n), "modality", None) == "video"]
POINT_SAMPLERS = [n for n in SAMPLERS.names() if getattr(SAMPLERS.get(n), "modality", None) == "points"]


def same(a, b) -> bool:
    """Equal, NaN included (a parsed '.nan' equals itself here)."""
    return a == b or repr(a) == repr(b)


# ============================================================================ strategies: recipes
# Fragments that steer the text toward YAML's sharp corners: tags whose constructors raise
# ValueError/AttributeError, implicit timestamps, flow collections, anchors, odd digits.
YAML_BITS = [
    "!!int ",
    "!!float ",
    "!!bool ",
    "!!timestamp ",
    "!!binary ",
    "!!str ",
    "!!set ",
    "!!omap ",
    "!!python/name:os.system ",
    "!!python/object/apply:os.system ",
    "2020-13-01",
    "2001-12-14t21:59:43.10-05:00",
    "1e-4",
    "0x1F",
    "0o17",
    "0b101",
    "1_000",
    "190:20:30",
    ".inf",
    ".nan",
    "~",
    "null",
    "yes",
    "no",
    "on",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ": ",
    "- ",
    "&a ",
    "*a",
    "? ",
    "'",
    '"',
    "#",
    "|",
    ">",
    "\n",
    "\t",
    " ",
    "=",
    ".",
    "%YAML 1.1\n",
    "---",
    "...",
    "\x00",
    "\ufeff",
    "\\",
    "1" * 5000,
]
yamlish = st.lists(st.one_of(st.sampled_from(YAML_BITS), st.text(max_size=4)), max_size=10).map("".join)
KEY_BITS = [
    "stages",
    "data",
    "model",
    "name",
    "type",
    "ratio",
    "epochs",
    "kwargs",
    "presets",
    "0",
    "1",
    "-1",
    "7",
    "train",
    "prune",
    "",
    " ",
    "²",
    "٣",
    "--1",
    "-",
    "1" * 30,
    "1" * 5000,
]
key_paths = st.lists(st.one_of(st.sampled_from(KEY_BITS), st.text(max_size=4)), min_size=1, max_size=4).map(".".join)
set_items = st.one_of(
    st.text(), yamlish, st.tuples(key_paths, yamlish).map("=".join), st.tuples(key_paths, st.text()).map("=".join)
)

PLAUSIBLE_KEYS = [
    "name",
    "data",
    "model",
    "stages",
    "type",
    "ratio",
    "epochs",
    "lr",
    "seed",
    "device",
    "batch_size",
    "kwargs",
    "presets",
    "description",
    "root",
    "sampler",
    "0",
    "a",
    "b",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.sampled_from(sorted(STAGES.names())),
)
dict_keys = st.one_of(st.sampled_from(PLAUSIBLE_KEYS), st.text(max_size=6))
json_like = st.recursive(
    scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(dict_keys, c, max_size=4), max_leaves=16
)
stage_like = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(STAGES.names())},
        optional={"name": st.sampled_from(["a", "b", "train", "prune"]), "ratio": json_like, "epochs": json_like},
    ),
    json_like,
)
raw_recipes = st.dictionaries(dict_keys, json_like, max_size=6) | st.fixed_dictionaries(
    {
        "model": st.one_of(st.fixed_dictionaries({"name": st.text(max_size=8)}), json_like),
        "stages": st.lists(stage_like, max_size=4),
    },
    optional={
        "name": json_like,
        "data": st.one_of(st.fixed_dictionaries({}, optional={"name": scalars, "batch_size": scalars}), json_like),
        "seed": scalars,
        "device": scalars,
        "presets": json_like,
        "bogus": scalars,
    },
)


def _optional(annotation):
    """(inner annotation, True) for Optional[X], else (annotation, False)."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    return annotation, False


def field_strategy(field, text: bool) -> st.SearchStrategy | None:
    """Valid values of a simple pydantic field (bool, Literal, bounded int/float, and free str
    when `text`), from its annotation and Field(gt=, ge=, lt=, le=) bounds; None for the rest
    (those keep their default)."""
    ann, optional = _optional(field.annotation)
    bound = {
        k: getattr(m, k) for m in field.metadata for k in ("gt", "ge", "lt", "le") if getattr(m, k, None) is not None
    }
    if typing.get_origin(ann) is typing.Literal:
        base = st.sampled_from(typing.get_args(ann))
    elif ann is bool:
        base = st.booleans()
    elif ann is int:
        lo = bound["ge"] if "ge" in bound else bound["gt"] + 1 if "gt" in bound else -(10**9)
        hi = bound["le"] if "le" in bound else bound["lt"] - 1 if "lt" in bound else 10**9
        base = st.integers(lo, hi)
    elif ann is float:
        base = st.floats(
            min_value=bound.get("gt", bound.get("ge", -1e9)),
            max_value=bound.get("lt", bound.get("le", 1e9)),
            exclude_min="gt" in bound,
            exclude_max="lt" in bound,
            allow_nan=False,
            allow_infinity=False,
        )
    elif ann is str and text and not field.is_required():
        base = st.text(max_size=10)
    else:
        return None
    return st.none() | base if optional else base


def config_values(cls, skip=("type", "name"), text: bool = False) -> st.SearchStrategy[dict]:
    """A dict of valid values for any subset of cls's simple fields; str fields only with `text`
    (stage configs check theirs against registries: selector, format, backends)."""
    optional = {
        k: s for k, f in cls.model_fields.items() if k not in skip and (s := field_strategy(f, text)) is not None
    }
    return st.fixed_dictionaries({}, optional=optional)


@st.composite
def valid_recipes(draw) -> dict:
    stages = []
    for i in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(STAGES.names()))
        cfg = STAGES.get(kind).config
        values = draw(config_values(cfg))
        stage = {"type": kind, **values}
        if draw(st.booleans()):
            stage["name"] = f"{kind}{i}"  # unique: a repeated name is an error (tested below)
        stages.append(stage)
    names = [s.get("name", s["type"]) for s in stages]
    if len(set(names)) < len(names):  # two unnamed stages of one type: name them all
        for i, s in enumerate(stages):
            s["name"] = f"{s['type']}{i}"
    recipe = {
        "name": draw(st.text(max_size=10)),
        "description": draw(st.text(max_size=10)),
        "seed": draw(st.integers(-(2**31), 2**31)),
        "device": draw(st.sampled_from(["auto", "cpu", "cuda"])),
        "data": draw(config_values(DataConfig, skip=(), text=True)),
        "model": {
            "name": draw(st.text(min_size=1, max_size=10)),
            "kwargs": draw(st.dictionaries(st.text(max_size=5), scalars, max_size=3)),
        },
        "stages": stages,
        "presets": draw(
            st.dictionaries(st.text(max_size=5), st.dictionaries(key_paths, scalars, max_size=2), max_size=2)
        ),
    }
    if any(s["type"] == "plan" for s in stages):  # the plan spends the recipe's target: valid only with one
        recipe["target"] = {"speedup": draw(st.floats(1.01, 100)), "max_drop": draw(st.floats(0, 1))}
    return recipe


def resolve_path(raw, keys: list[str]) -> list:
    """keys with list items named by name/type replaced by their index in `raw` (the documented
    meaning of `--set stages.train.lr=...`), walking raw as it is before the override."""
    out, node = [], raw
    for key in keys:
        if isinstance(node, list):
            if re.fullmatch(r"-?[0-9]+", key):
                idx = int(key)
            else:
                idx = next(
                    i for i, s in enumerate(node) if isinstance(s, dict) and (s.get("name") or s.get("type")) == key
                )
            out.append(idx)
            node = node[idx]
        else:
            out.append(key)
            node = node.get(key, {}) if isinstance(node, dict) else None
    return out


def lookup(raw, path: list):
    for key in path:
        raw = raw[key]
    return raw


# ============================================================================ recipes: --set
@settings(max_examples=200)
@given(item=set_items)
@example("a=2020-13-01")  # a date that does not exist: PyYAML's constructor raises ValueError
@example("a=!!int x")
@example("a=!!float y")
@example("a=!!timestamp 5")  # AttributeError inside PyYAML
@example("a=" + "1" * 5000)  # int() refuses more than 4300 digits
@example("a=" + "[" * 600 + "]" * 600)  # RecursionError inside PyYAML
@example("a=!!python/object/apply:os.system ['true']")
@example("no equals sign")
@example(" =1")
def test_parse_set_returns_keys_and_value_or_a_recipe_error(item):
    try:
        keys, value = parse_set(item)
    except RecipeError as exc:
        assert str(exc).startswith(f"--set {item!r}: ") and "\n" not in str(exc)
        return
    key, text = item.split("=", 1)
    assert key.strip() and keys == key.strip().split(".") and all(isinstance(k, str) for k in keys)
    assert same(
        value, yamlio.load(text) if text else None
    )  # the value is exactly what a recipe file would make of the text


@settings(max_examples=300)
@given(text=st.from_regex(r"[-+]?[0-9_]{1,4}(\.[0-9_]{0,3})?([eE][-+]?[0-9_]{0,3})?", fullmatch=True))
def test_effvision_yaml_departs_from_yaml_1_1_only_to_read_exponents_as_floats(text):
    ours, theirs = yamlio.load(text), yaml.safe_load(text)
    if not same(ours, theirs):
        assert (
            isinstance(theirs, str)
            and "e" in text.lower()
            and isinstance(ours, float)
            and ours == float(text.replace("_", ""))
        )
    assert same(yamlio.load(yamlio.dump(theirs)), theirs)  # a string that looks like a number is quoted when written


@settings(max_examples=120)
@given(
    raw=st.dictionaries(dict_keys, json_like, max_size=5)
    | st.fixed_dictionaries({"stages": st.lists(stage_like, max_size=4)}),
    sets=st.lists(
        st.one_of(set_items, st.tuples(key_paths, st.sampled_from(["1", "x", "[1, 2]", "{a: 1}", "~"])).map("=".join)),
        max_size=3,
    ),
)
@example(raw={"stages": [{"type": "train"}] * 3}, sets=["stages.²=1"])  # a digit int() refuses
@example(raw={"stages": [{"type": "train"}] * 3}, sets=["stages.--1=1"])
@example(raw={"stages": [{"type": "train"}] * 3}, sets=["stages." + "1" * 5000 + "=1"])
@example(raw={"stages": [5, {"name": "b", "type": "train"}]}, sets=["stages.b=1"])  # a named item after a non-mapping
@example(raw={"a": 1}, sets=["a.b=1"])
def test_apply_overrides_applies_or_raises_recipe_error_and_never_mutates(raw, sets):
    before = copy.deepcopy(raw)
    try:
        out = apply_overrides(raw, sets)
    except RecipeError as exc:
        assert str(exc).startswith("--set ")
        out = None
    assert same(raw, before), "apply_overrides changed its input"
    if out is not None and len(sets) == 1:
        keys, value = parse_set(sets[0])
        path = resolve_path(raw, keys)
        assert same(lookup(out, path), value)
        assert out is not raw


@settings(max_examples=100)
@given(
    value=st.one_of(
        st.integers(),
        st.floats(allow_nan=False),
        st.booleans(),
        st.none(),
        st.text(),
        st.text(alphabet=st.characters(codec="ascii", categories=["L", "N"]), min_size=1),
    ),
    path=st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=3),
)
def test_set_value_round_trips_through_its_yaml(value, path):
    out = apply_overrides({}, [f"{'.'.join(path)}={yamlio.dump(value)}"])
    assert lookup(out, path) == value and type(lookup(out, path)) is type(value)


@settings(max_examples=100)
@given(
    i=st.integers(),
    b=st.booleans(),
    lr=st.floats(min_value=1e-12, max_value=1e6, exclude_min=True),
    ratio=st.floats(0, 1, exclude_min=True, exclude_max=True),
)
def test_set_as_typed_on_the_command_line_reaches_the_typed_stage(i, b, lr, ratio):
    """`--set` as people type it (repr gives 1e-05: a float to effvision's YAML, as to YAML 1.2)."""
    raw = {"model": {"name": "m"}, "stages": [{"type": "train"}, {"type": "prune"}]}
    r = load_overrides(
        raw, [f"seed={i}", f"stages.train.lr={lr!r}", f"stages.train.ema={str(b).lower()}", f"stages.1.ratio={ratio!r}"]
    )
    assert (r.seed, r.stages[0].lr, r.stages[0].ema, r.stages[1].ratio) == (i, lr, b, ratio)


def load_overrides(raw: dict, sets: list[str]) -> Recipe:
    return validate_recipe(apply_overrides(raw, sets))


# ============================================================================ recipes: presets
@settings(max_examples=100)
@given(
    raw=st.dictionaries(dict_keys, json_like, max_size=3),
    presets=st.one_of(
        st.dictionaries(
            st.one_of(st.text(max_size=4), st.integers()), st.dictionaries(key_paths, json_like, max_size=3), max_size=3
        ),
        json_like,
    ),
    name=st.sampled_from(["fast", "a", "1", ""]) | st.text(max_size=4),
)
@example(raw={}, presets={"fast": {"x": {}, "x.y": 1}}, name="fast")  # a later key writes into an earlier value
@example(raw={}, presets={1: {}}, name="fast")  # a YAML int key among the presets
def test_apply_preset_applies_or_raises_recipe_error_and_never_mutates(raw, presets, name):
    raw = {**raw, "presets": presets}
    before = copy.deepcopy(raw)
    try:
        out = apply_preset(raw, name, "r.yaml")
    except RecipeError as exc:
        assert str(exc).startswith("r.yaml: ")
        if not isinstance(presets, dict) or name not in presets:
            assert f"unknown preset '{name}'" in str(exc)
        out = None
    assert same(raw, before), "apply_preset changed its input"
    if out is not None:
        assert same(apply_preset(raw, name, "r.yaml"), out), (
            "a second application differs: the first one changed shared state"
        )


# ============================================================================ recipes: validation
@settings(max_examples=120)
@given(raw=st.one_of(raw_recipes, json_like))
@example(raw={"model": {"name": "m"}, "stages": [{"type": "os.system"}]})
@example(raw={"model": {"name": "m"}, "stages": [{"type": "train"}, {"type": "train"}]})
@example(raw={"model": {"name": "m"}, "data": {"bogus": 1}})
@example(raw={1: 2, "model": {"name": "m"}})
def test_validate_recipe_returns_a_recipe_or_raises_recipe_error(raw):
    try:
        recipe = validate_recipe(raw, "r.yaml")
    except RecipeError as exc:
        assert str(exc).startswith("r.yaml: ")
        return
    assert isinstance(recipe, Recipe) and isinstance(raw, dict)
    for stage in recipe.stages:
        assert type(stage) is STAGES.get(stage.type).config
    names = [s.name for s in recipe.stages]
    assert len(set(names)) == len(names) and all(names)


@settings(max_examples=40)
@given(raw=valid_recipes())
def test_a_valid_recipe_round_trips_through_recipe_to_dict_and_yaml(raw):
    recipe = validate_recipe(raw)
    as_dict = recipe_to_dict(recipe)
    assert recipe_to_dict(validate_recipe(as_dict)) == as_dict
    assert recipe_to_dict(validate_recipe(yamlio.load(yamlio.dump(as_dict)))) == as_dict  # as written to the run folder
    assert [s.type for s in recipe.stages] == [s["type"] for s in raw["stages"]]


@settings(max_examples=150)
@given(
    kind=st.one_of(
        st.sampled_from(
            [
                "os.system",
                "__import__",
                "eval",
                "builtins.exec",
                "subprocess.Popen",
                "effvision.stages",
                "Train",
                "train ",
                " prune",
                "TRAIN",
                "StageConfig",
                "lambda: 0",
            ]
        ),
        st.text(max_size=12),
        st.integers(),
        st.none(),
        st.booleans(),
        st.lists(st.text(max_size=3), max_size=2),
    ),
    index=st.integers(0, 2),
)
def test_an_unregistered_stage_type_is_refused_naming_the_choices(kind, index):
    assume(not (isinstance(kind, str) and kind in STAGES))  # registered names: covered by the round trip
    stages = [{"type": "export", "name": f"e{i}"} for i in range(index)] + [{"type": kind}]
    with pytest.raises(RecipeError) as err:
        validate_recipe({"model": {"name": "m"}, "stages": stages}, "r.yaml")
    msg = str(err.value)
    assert msg.startswith(f"r.yaml: stages.{index}.type: unknown stage type")
    assert all(name in msg for name in STAGES.names())


@settings(max_examples=40)
@given(
    text=st.one_of(yamlish, st.binary(max_size=40)),
    sets=st.lists(set_items, max_size=2),
    preset=st.none() | st.sampled_from(["fast", "x"]),
)
@example(text=b"\xff\xfe\x00binary", sets=[], preset=None)  # not UTF-8 text
@example(text="when: 2020-13-01\n", sets=[], preset=None)  # a date that does not exist
@example(text="presets: {1: {seed: 2}}\nmodel: {name: m}\n", sets=[], preset="fast")
@example(text="presets: {fast: {seed: 2}}\nmodel: {name: m}\n", sets=["stages=[{type: prune}]"], preset="fast")
def test_load_recipe_reads_any_file_into_a_recipe_or_a_recipe_error(text, sets, preset):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        try:
            recipe = load_recipe(path, sets, preset)
        except RecipeError as exc:
            assert str(exc).startswith((str(path), "--set "))
            if text == b"\xff\xfe\x00binary":
                assert "not a UTF-8 text file" in str(exc)
            return
    assert isinstance(recipe, Recipe) and recipe._source == str(path)
    if text == "presets: {fast: {seed: 2}}\nmodel: {name: m}\n":
        assert recipe.seed == 2 and [s.type for s in recipe.stages] == ["prune"]


# ============================================================================ frame samplers
class FakeVideo(Video):
    """A video of n tiny synthetic frames: len, key frames and frames() without any decoding."""

    backend = "fake"

    def __init__(self, n: int, keys: list[int], levels: int, seed: int):
        super().__init__("fake.mp4")
        self.n, self.keys = n, keys
        # Few grey levels: runs of identical frames (ties in motion scores) as in real still shots.
        self.grey = np.random.default_rng(seed).integers(0, levels, n).astype(np.uint8) * (255 // max(1, levels - 1))

    def __len__(self) -> int:
        return self.n

    def key_indices(self) -> list[int]:
        return self.keys

    def frames(self, indices: list[int]) -> np.ndarray:
        assert all(0 <= i < self.n for i in indices), "a sampler asked for a frame outside the video"
        self.decoded += len(set(indices))
        return np.broadcast_to(
            self.grey[np.asarray(indices, dtype=np.int64)][:, None, None, None], (len(indices), 2, 2, 3)
        ).copy()


@st.composite
def videos(draw) -> FakeVideo:
    n = draw(st.one_of(st.integers(1, 80), st.integers(1, 5000)))
    keys = draw(
        st.one_of(
            st.just([0]),
            st.lists(st.integers(0, n - 1), min_size=1, max_size=40, unique=True).map(sorted),
            st.integers(1, max(1, n)).map(lambda step: list(range(0, n, step))),
        )
    )
    return FakeVideo(n, keys, draw(st.integers(1, 6)), draw(st.integers(0, 2**16)))


def sampler_options(name: str) -> st.SearchStrategy[dict]:
    return {
        "dense": st.fixed_dictionaries({}, optional={"stride": st.integers(1, 8)}),
        "motion": st.fixed_dictionaries({}, optional={"max_scan": st.integers(1, 300)}),
    }.get(name, st.just({}))


@pytest.mark.parametrize("name", VIDEO_SAMPLERS)
@settings(max_examples=80)
@given(
    data=st.data(),
    video=videos(),
    k=st.integers(1, 64),
    train=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    position=st.floats(0, 1),
)
def test_every_frame_sampler_gives_k_indices_inside_the_clip(name, data, video, k, train, seed, position):
    sampler = get_sampler(name, k, **data.draw(sampler_options(name)))
    with mock.patch.object(
        frame_samplers, "open_video", lambda *a, **kw: video
    ):  # motion's low-res scan: the same fake
        idx, scanned = sampler.select(video, train, np.random.default_rng(seed), position)
        again, _ = sampler.select(video, train, np.random.default_rng(seed), position)
        other, _ = sampler.select(video, train, np.random.default_rng(seed + 1), position)
    n = len(video)
    assert len(idx) == k and all(isinstance(i, (int, np.integer)) for i in idx)
    assert all(0 <= i < n for i in idx), (n, idx)
    assert scanned >= 0
    assert list(again) == list(idx), "the same rng gave other frames"
    if not train:
        assert list(other) == list(idx), "an evaluation clip depends on the rng"
    if name == "dense" and n >= (k - 1) * sampler.stride + 1:  # fits: consecutive frames `stride` apart
        assert all(b - a == sampler.stride for a, b in pairwise(idx))
    elif name != "dense":  # tsn, keyframes, motion promise temporal order
        assert all(a <= b for a, b in pairwise(idx)), idx
    if name == "keyframes":
        assert set(idx) <= set(video.key_indices())


@settings(max_examples=200)
@given(
    n=st.integers(1, 5000), k=st.integers(1, 64), position=st.floats(0, 1, exclude_max=True), seed=st.integers(0, 2**16)
)
def test_segment_indices_take_one_frame_per_segment(n, k, position, seed):
    rng = np.random.default_rng(seed)
    for idx in (segment_indices(n, k, True, rng), segment_indices(n, k, False, rng, position)):
        assert len(idx) == k and all(0 <= i < n for i in idx) and idx == sorted(idx)
    if n >= k:  # every segment is at least one frame wide: evaluation never repeats a frame
        assert len(set(segment_indices(n, k, False, rng, position))) == k


# ============================================================================ point samplers
@st.composite
def clouds(draw) -> np.ndarray:
    n = draw(st.one_of(st.integers(1, 64), st.integers(1, 5000)))
    distinct = draw(st.one_of(st.just(n), st.integers(1, n)))
    channels = draw(st.sampled_from([3, 4, 6]))
    scale = draw(st.sampled_from([1e-3, 0.05, 1.0, 1e3]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    base = (rng.standard_normal((distinct, channels)) * scale).astype(np.float32)
    if draw(st.booleans()):
        base[:, 2] = 0  # a flat cloud (a plane scan)
    return base[rng.integers(0, distinct, n)] if distinct < n else base


@pytest.mark.parametrize("name", POINT_SAMPLERS)
@settings(max_examples=15)
@given(
    points=clouds(),
    k=st.one_of(st.integers(1, 64), st.integers(1, 2048)),
    train=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_point_sampler_returns_k_input_points(name, points, k, train, seed):
    sampler = get_point_sampler(name, k)
    out = sampler(points, train, np.random.default_rng(seed))
    n, c = points.shape
    assert out.points.shape == (k, c) and out.points.dtype == np.float32 and np.isfinite(out.points).all()
    rows = {r.tobytes() for r in points}
    assert all(r.tobytes() in rows for r in out.points), "a sampled point is not one of the input points"
    assert 1 <= out.kept <= min(n, k) and out.bytes_kept == out.kept * c * 4
    idx = np.asarray(sampler.indices(points, train, np.random.default_rng(seed)))
    assert len(idx) == out.kept and len(np.unique(idx)) == len(idx) and ((0 <= idx) & (idx < n)).all()
    if name in ("random", "uniform"):  # index samplers: every point is distinct to them
        assert out.kept == min(n, k)
    again = sampler(points, train, np.random.default_rng(seed))
    assert np.array_equal(again.points, out.points), "the same rng gave other points"
