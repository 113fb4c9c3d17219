import pytest
import yaml
from conftest import tiny_recipe

import effvision.stages  # noqa: F401  (populates STAGES for parametrize)
from effvision.recipe import RecipeError, apply_overrides, load_recipe, recipe_to_dict, validate_recipe
from effvision.registry import STAGES


def write(tmp_path, raw) -> str:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def test_valid_recipe_types_each_stage(tmp_path):
    r = load_recipe(write(tmp_path, tiny_recipe()))
    assert [s.type for s in r.stages] == ["train", "prune", "distill", "export", "quantize", "bench"]
    assert r.stages[1].ratio == 0.5 and r.stages[1].name == "prune"


def test_misspelled_key_names_file_path_and_choices(tmp_path):
    raw = tiny_recipe()
    raw["stages"][1]["ratoi"] = 0.3
    path = write(tmp_path, raw)
    with pytest.raises(RecipeError) as err:
        load_recipe(path)
    msg = str(err.value)
    assert path in msg and "stages.1.ratoi" in msg and "did you mean 'ratio'" in msg and "importance" in msg


def test_misspelled_top_level_key(tmp_path):
    raw = tiny_recipe()
    raw["dta"] = raw.pop("data")
    with pytest.raises(RecipeError, match=r"dta: unknown key; did you mean 'data'"):
        load_recipe(write(tmp_path, raw))


def test_nested_key_error_has_full_path(tmp_path):
    raw = tiny_recipe()
    raw["data"]["on_bad_sampel"] = "skip"
    with pytest.raises(RecipeError, match=r"data\.on_bad_sampel: unknown key; did you mean 'on_bad_sample'"):
        load_recipe(write(tmp_path, raw))


def test_unknown_stage_type_suggests(tmp_path):
    raw = tiny_recipe()
    raw["stages"][1]["type"] = "prunee"
    with pytest.raises(RecipeError, match=r"stages\.1\.type: unknown stage type 'prunee'; did you mean 'prune'"):
        load_recipe(write(tmp_path, raw))


def test_bad_value_lists_choices(tmp_path):
    raw = tiny_recipe()
    raw["stages"][1]["importance"] = "l3"
    with pytest.raises(RecipeError, match=r"stages\.1\.importance: .*'l1'.*'taylor'"):
        load_recipe(write(tmp_path, raw))


def test_duplicate_stage_names_rejected(tmp_path):
    raw = tiny_recipe()
    raw["stages"].append({"type": "prune"})
    with pytest.raises(RecipeError, match="repeated: prune"):
        load_recipe(write(tmp_path, raw))


def test_invalid_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nstages: [\n")
    with pytest.raises(RecipeError, match="bad.yaml"):
        load_recipe(p)


def test_missing_recipe_file():
    from effvision.errors import EffvisionError

    with pytest.raises(EffvisionError, match="recipe not found"):
        load_recipe("no/such/recipe.yaml")


def test_overrides_by_index_name_and_nested(tmp_path):
    path = write(tmp_path, tiny_recipe())
    r = load_recipe(path, ["stages.1.ratio=0.6", "stages.distill.temperature=2", "data.root=/x", "seed=3"])
    assert r.stages[1].ratio == 0.6 and r.stages[2].temperature == 2.0 and r.data.root == "/x" and r.seed == 3


def test_override_errors_are_clear(tmp_path):
    path = write(tmp_path, tiny_recipe())
    with pytest.raises(RecipeError, match="index 9 out of range"):
        load_recipe(path, ["stages.9.ratio=0.1"])
    with pytest.raises(RecipeError, match="expected key.path=value"):
        load_recipe(path, ["stages.1.ratio"])
    with pytest.raises(RecipeError, match=r"--set.*no item named 'prunne'"):
        apply_overrides(tiny_recipe(), ["stages.prunne.ratio=0.1"])
    with pytest.raises(RecipeError, match=r"stages\.1\.ratiox: unknown key"):
        load_recipe(path, ["stages.1.ratiox=0.1"])


def test_shipped_recipes_validate():
    for name in ("default", "cifar10"):
        r = load_recipe(name)
        assert r.stages, name


@pytest.mark.parametrize("stage_type", STAGES.names())
def test_every_stage_config_round_trips_through_yaml(stage_type):

    cfg = STAGES.get(stage_type).config(type=stage_type)
    again = STAGES.get(stage_type).config.model_validate(yaml.safe_load(yaml.safe_dump(cfg.model_dump(mode="json"))))
    assert again == cfg


def test_resolved_recipe_round_trips():
    r = validate_recipe(tiny_recipe())
    again = validate_recipe(yaml.safe_load(yaml.safe_dump(recipe_to_dict(r))))
    assert recipe_to_dict(again) == recipe_to_dict(r)


def test_exponent_numbers_are_floats_where_no_type_converts_them(tmp_path):
    """`1e-4` means a number to whoever types it (YAML 1.1 alone would keep the string) — in untyped
    fields such as model.kwargs and a card's sampler options too; strings that look like one survive quoted."""
    from effvision.data.cards import DatasetCard
    from effvision.recipe import load_card

    r = load_recipe(write(tmp_path, tiny_recipe()), ["model.kwargs.drop_rate=5e-2", "stages.baseline.lr=3E-3"])
    assert r.model.kwargs["drop_rate"] == 0.05 and r.stages[0].lr == 0.003
    card = tmp_path / "pts.yaml"
    card.write_text("modality: points\nsource: folder\nsampler: voxel\nsampler_options: {voxel_size: 3e-2}\n")
    assert load_card(card, DatasetCard, "pts").sampler_options == {"voxel_size": 0.03}
    assert load_recipe(write(tmp_path, tiny_recipe()), ["model.kwargs.tag='1e5'"]).model.kwargs["tag"] == "1e5"
