"""The zoo's cards: fields, default recipes, pretrained weights (local, Hugging Face cache, the
card's own trained file) and the errors a user meets."""

import hashlib

import pytest
import torch
from conftest import SHARED, tiny_recipe

from effvision.cli import main
from effvision.errors import EffvisionError
from effvision.models import create_model
from effvision.models.zoo import _cards, get_card, list_cards
from effvision.recipe import RecipeError, load_recipe


@pytest.fixture
def own_models(tmp_path, monkeypatch):
    """A working folder with its own models/ (searched before the project's)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    _cards.cache_clear()
    yield tmp_path / "models"
    _cards.cache_clear()


def test_at_least_fifteen_cards_across_modalities():
    cards = list_cards()
    assert len(cards) >= 15
    assert {c.modality for c in cards} == {"image", "video", "points"}
    for name in (
        "mobilenetv3_small_100",
        "mobilenetv3_large_100",
        "efficientnet_b0",
        "ghostnet_100",
        "regnetx_002",
        "mobilevit_xxs",
        "convnext_atto",
        "fastvit_t8",
        "repvit_m0_9",
        "r2plus1d_18",
        "pointnet_050.synthetic_shapes",
    ):
        assert get_card(name) is not None, name


@pytest.mark.parametrize("card", list_cards(), ids=lambda c: c.name)
def test_every_card_names_a_recipe_of_its_modality(card):
    assert card.recipe, f"{card.name} has no default recipe"
    recipe = load_recipe(card.recipe, [f"model.name={card.name}"])
    modality = {"digits": "image", "cifar10": "image", "synthetic-motion": "video", "synthetic-shapes": "points"}[
        recipe.data.name
    ]
    assert modality == card.modality


def test_card_missing_a_field_names_it(own_models):
    (own_models / "broken.yaml").write_text("name: broken\nmodality: image\nnum_classes: 10\ninput_size: [3, 32, 32]\n")
    with pytest.raises(RecipeError, match=r"broken\.yaml.*arch"):
        list_cards()
    assert main(["zoo", "list"]) == 1


def test_card_with_a_misspelled_field_names_it(own_models):
    (own_models / "typo.yaml").write_text("name: typo\narch: cifar_resnet8\nnum_clases: 10\ninput_size: [3, 32, 32]\n")
    with pytest.raises(RecipeError, match="num_clases"):
        list_cards()


def test_unknown_card_on_the_command_line_suggests(capsys):
    assert main(["zoo", "show", "mobilenetv3_smal_100"]) == 1
    err = capsys.readouterr().err
    assert "did you mean 'mobilenetv3_small_100'" in err and "Traceback" not in err


def _write_hub_cache(cache, repo_id: str, state: dict) -> None:
    """The layout huggingface_hub reads offline: refs/main -> snapshots/<commit>/<file>."""
    from safetensors.torch import save_file

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(repo / "snapshots" / commit / "model.safetensors"))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_pretrained_from_the_hugging_face_cache_offline(hub_cache):
    src = create_model("timm:mobilenetv3_small_050", num_classes=1000)
    _write_hub_cache(hub_cache, "timm/mobilenetv3_small_050.test_in1k", src.state_dict())
    dst = create_model(
        "timm:mobilenetv3_small_050", num_classes=5, pretrained="hf-hub:timm/mobilenetv3_small_050.test_in1k"
    )
    assert torch.equal(dst.conv_stem.weight, src.conv_stem.weight)
    assert dst.get_classifier().out_features == 5  # head reset for the new class count
    with pytest.raises(EffvisionError, match=r"not.*cache|none of model\.safetensors.*HF_HUB_OFFLINE=1"):
        create_model("timm:mobilenetv3_small_050", pretrained="hf-hub:timm/not_cached_anywhere")


def test_pretrained_zoo_reads_the_cards_hub_repo(hub_cache):
    card = get_card("mobilenetv3_small_100")
    src = create_model("mobilenetv3_small_100")
    _write_hub_cache(hub_cache, card.hub, src.state_dict())
    dst = create_model("mobilenetv3_small_100", num_classes=10, pretrained="zoo", input_size=[3, 32, 32])
    assert torch.equal(dst.blocks[1][0].conv_pw.weight, src.blocks[1][0].conv_pw.weight)
    assert dst.get_classifier().out_features == 10


def test_pretrained_zoo_without_weights_is_a_clear_error():
    with pytest.raises(EffvisionError, match="has no pretrained weights"):
        create_model("r3d_18", pretrained="zoo")


def test_publish_round_trip_and_tampered_weights(own_models, tmp_path):
    """A run's stage becomes the card's trained weights; re-scoring them gives the run's accuracy."""
    from effvision.pipeline import run_pipeline
    from effvision.recipe import validate_recipe
    from effvision.zoo.publish import append_trained_block, publish, score_trained

    (own_models / "tiny_resnet8.digits.yaml").write_text(
        "name: tiny_resnet8.digits\narch: cifar_resnet8\nnum_classes: 10\ninput_size: [3, 32, 32]\nkwargs: {width: "
        "0.25}\ndataset: digits\n"
    )
    (tmp_path / "compress").mkdir()
    raw = tiny_recipe(model={"name": "tiny_resnet8.digits"})
    raw["stages"] = raw["stages"][:1]
    (tmp_path / "compress" / "tiny.yaml").write_text(__import__("yaml").safe_dump(raw))
    recipe = validate_recipe(raw, "compress/tiny.yaml")
    recipe._source = "compress/tiny.yaml"
    report = run_pipeline(recipe, tmp_path / "run")
    path, block = publish(tmp_path / "run", "baseline")
    assert path == own_models / "weights" / "tiny_resnet8.digits.safetensors"
    assert block["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert block["accuracy"] == round(report["stages"][-1]["accuracy"], 4)
    append_trained_block("tiny_resnet8.digits", block)
    _cards.cache_clear()
    card = get_card("tiny_resnet8.digits")
    assert card.trained.recipe == "tiny"
    assert score_trained(card) == pytest.approx(card.trained.accuracy, abs=1e-4)
    path.write_bytes(path.read_bytes()[:-1] + b"\0")
    with pytest.raises(EffvisionError, match="does not match the card's sha256"):
        create_model("tiny_resnet8.digits", pretrained="zoo")


def _root_for(card):
    recipe = load_recipe(card.trained.recipe)
    if recipe.data.name == "cifar10":
        return ["data.root=" + str(SHARED / "datasets")] if (SHARED / "datasets").is_dir() else None
    return []


TRAINED = [c for c in list_cards() if c.trained is not None]


# make test re-scores the digits card; the generated clips and shapes (20-30 s each) and CIFAR-10
# (../shared) run under make test-all.
@pytest.mark.parametrize(
    "card",
    [
        c
        if c.dataset == "digits"
        else pytest.param(c, marks=pytest.mark.slow if c.dataset == "cifar10" else pytest.mark.zoo)
        for c in TRAINED
    ],
    ids=lambda c: c.name,
)
def test_trained_cards_score_what_they_claim(card):
    from effvision.models.cards import trained_weights_path
    from effvision.zoo.publish import score_trained

    overrides = _root_for(card)
    if overrides is None:
        pytest.skip("../shared/datasets (CIFAR-10) is not present")
    if not trained_weights_path(card).is_file():  # not committed (over the size limit) or not rebuilt yet
        pytest.skip(f"{card.name}'s weights are not here; rebuild them: {card.trained.command}")
    assert score_trained(card, overrides) == pytest.approx(card.trained.accuracy, abs=1e-4)


@pytest.mark.zoo  # a fresh process per model: about 20 s
def test_zoo_compat_writes_the_table(tmp_path, capsys):
    import json

    from effvision.zoo.conformance import STEPS

    out = tmp_path / "compat.md"
    assert main(["zoo", "compat", "--models", "mobilenetv3_small_050", "--size", "32", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| mobilenetv3_small_050 |" in text and "**1 of 1 pass every step (100%).**" in text
    assert "effvision zoo compat --models mobilenetv3_small_050 --size 32" in text  # the command that wrote it
    row = json.loads(out.with_suffix(".json").read_text())["rows"][0]
    assert row["passed"] == list(STEPS) and row["pruned_params"] < row["params"]


def test_zoo_compat_unknown_model_fails_before_running(tmp_path, capsys):
    assert main(["zoo", "compat", "--models", "mobilenetv3_smal_050", "--out", str(tmp_path / "c.md")]) == 1
    assert "did you mean 'mobilenetv3_small_050'" in capsys.readouterr().err
    assert not (tmp_path / "c.md").exists()
