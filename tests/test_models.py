"""Every registered architecture and zoo card through the conformance run, and the model utilities."""

import pytest
import torch

from effvision.compression import prune
from effvision.errors import EffvisionError
from effvision.models import count_macs, count_params, create_model, list_models, load_checkpoint, save_checkpoint
from effvision.models.zoo import list_cards
from effvision.registry import MODELS
from effvision.zoo.conformance import STEPS, run_conformance

NAMES = MODELS.names() + [c.name for c in list_cards()] + ["timm:resnet10t", "torchvision:mobilenet_v3_small"]
NAMES += ["torchvision:resnet18"]
VIDEO = {n for n in MODELS.names() if getattr(MODELS.get(n), "modality", "image") == "video"} | {
    c.name for c in list_cards("video")
}
POINTS = {n for n in MODELS.names() if getattr(MODELS.get(n), "modality", "image") == "points"} | {
    c.name for c in list_cards("points")
}

# make test keeps effvision's own architectures and the compact cards; the rest of the sweep (the
# 11-33M-parameter video nets, the ImageNet families) runs under `make test-all` (marker zoo).
# (The MobileNetV3 video cards and the digits MobileNetV3 repeat what tsm/tsn and timm:resnet10t cover;
# the tsm card runs the tsm architecture on a ResNet-8 in a third of the ResNet-18 default's time.)
FAST = set(MODELS.names()) | {c.name for c in list_cards() if not c.arch.startswith(("timm:", "torchvision:"))}
# torchvision's adapter on its ResNet-18 (the resnet18.cifar10 card's architecture): 7 s where its
# MobileNetV3 takes 15 s of ONNX export, and timm's MobileNetV3 already runs inside tsn.
FAST |= {"timm:resnet10t", "torchvision:resnet18"}
FAST -= {
    "tsm",
    "r3d_18",
    "mc3_18",
    "r2plus1d_18",
    "tsm_resnet18",
    "tsm_mobilenetv3_small_100",
    "tsn_mobilenetv3_small_100",
}
# Cards that only set their architecture's widths (or k, the embedding size) run the same code as
# the architecture's own run above: they too wait for `make test-all` (29 s of make test).
FAST -= {
    "cifar_resnet8_100.digits",
    "cifar_resnet8_100.cifar10",
    "cifar_resnet20_100.cifar10",
    "speednet_32.cifar10",
    "pointnet_050.synthetic_shapes",
    "dgcnn_050.synthetic_shapes",
}


@pytest.mark.parametrize("name", [n if n in FAST else pytest.param(n, marks=pytest.mark.zoo) for n in NAMES])
def test_conformance(name, tmp_path):
    """create -> forward -> backward -> prune 30% -> forward -> ONNX -> ORT parity -> int8 -> runs."""
    # video clips are (C, T, H, W); point clouds (C, N)
    shape = [3, 4, 32, 32] if name in VIDEO else [3, 512] if name in POINTS else [3, 32, 32]
    result = run_conformance(name, shape, num_classes=7, workdir=tmp_path)
    assert result.ok, f"{name} failed at {result.failed_step}: {result.reason}"
    assert result.passed == list(STEPS)
    assert result.pruned_macs < 0.8 * result.macs and result.pruned_params < result.params


class _TinyNet(torch.nn.Module):
    """conv -> pool -> fc, optionally with a layer the forward never uses."""

    def __init__(self, spare: bool = False):
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 16, 3), torch.nn.Linear(16, 7)
        self.spare = torch.nn.Linear(4, 4) if spare else None

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


def _conformance_of(builder, tmp_path):
    MODELS.register("test_tiny", builder)
    try:
        return run_conformance("test_tiny", [3, 16, 16], num_classes=7, workdir=tmp_path)
    finally:
        MODELS._entries.pop("test_tiny")


def test_conformance_reports_the_failing_step(tmp_path):
    """A model whose export cannot work fails at `export`, with the reason in one line."""

    class Sampler(_TinyNet):  # random sampling inside the network: refused before export
        export_blocker = "torch.multinomial: sampling inside the network"

    result = _conformance_of(lambda num_classes=7, **kw: Sampler(), tmp_path)
    assert (result.ok, result.failed_step) == (False, "export")
    assert result.passed == ["create", "forward", "backward", "prune", "pruned forward"]
    assert "multinomial" in result.reason and "\n" not in result.reason


def test_backward_names_a_parameter_without_gradient(tmp_path):
    result = _conformance_of(lambda num_classes=7, **kw: _TinyNet(spare=True), tmp_path)
    assert result.failed_step == "backward" and "spare.weight" in result.reason


def test_unknown_model_suggests():
    with pytest.raises(ValueError, match="did you mean 'cifar_resnet8'"):
        create_model("cifar_resnt8")
    with pytest.raises(ValueError, match="did you mean 'timm:mobilenetv3_small_100'"):
        create_model("timm:mobilenetv3_smal_100")
    with pytest.raises(ValueError, match="did you mean 'torchvision:resnet18'"):
        create_model("torchvision:resnet_18")


def test_zoo_cards_are_listed():
    assert "cifar_resnet8_100.digits" in list_models()


@pytest.mark.parametrize("card", list_cards(), ids=lambda c: c.name)
def test_card_params_and_macs_are_what_the_model_has(card):
    from effvision.models import build, resolve

    model = build(resolve(card.name))
    assert card.params is not None and card.macs is not None, f"{card.name}: the card lacks params/macs"
    assert (count_params(model), count_macs(model, card.input_size)) == (card.params, card.macs)


def test_macs_count_subclassed_layers():
    """torchvision's video nets use subclasses of nn.Conv3d: they are counted, not free."""

    class MyConv(torch.nn.Conv3d):
        pass

    plain, sub = torch.nn.Conv3d(3, 8, 3, padding=1), MyConv(3, 8, 3, padding=1)
    assert (
        count_macs(sub, [3, 4, 8, 8]) == count_macs(plain, [3, 4, 8, 8]) >= 8 * 27 * 4 * 8 * 8
    )  # (+ the bias, as torch-pruning counts)


def test_pruned_checkpoint_rebuilds_exactly(tmp_path):
    m = create_model("cifar_resnet8", num_classes=10).eval()
    prune(m, 0.4, importance="l1")
    save_checkpoint(m, tmp_path / "p.pt")
    again = load_checkpoint(tmp_path / "p.pt")
    x = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        assert torch.allclose(m(x), again(x), atol=1e-6)
    assert count_params(again) == count_params(m)


def test_checkpoint_is_loadable_with_weights_only(tmp_path):
    m = create_model("cifar_resnet8")
    save_checkpoint(m, tmp_path / "c.pt")
    payload = torch.load(tmp_path / "c.pt", weights_only=True)
    assert payload["format"].startswith("effvision-checkpoint")


def test_pretrained_weights_reset_head_when_classes_differ(tmp_path):
    from safetensors.torch import save_file

    src = create_model("cifar_resnet8", num_classes=10)
    save_file(src.state_dict(), str(tmp_path / "w.safetensors"))
    torch.save({"state_dict": src.state_dict()}, tmp_path / "w.pth")
    for f in ("w.safetensors", "w.pth"):
        dst = create_model("cifar_resnet8", num_classes=4, pretrained=str(tmp_path / f))
        assert torch.equal(dst.stem[0].weight, src.stem[0].weight)
        assert dst.fc.out_features == 4
    same = create_model("cifar_resnet8", num_classes=10, pretrained=str(tmp_path / "w.pth"))
    assert torch.equal(same.fc.weight, src.fc.weight)


def test_checkpoint_with_mismatched_shapes_is_a_clear_error(tmp_path):
    other = create_model("cifar_resnet8", width=0.5)
    torch.save(other.state_dict(), tmp_path / "w.pth")
    with pytest.raises(EffvisionError, match=r"does not match the model: stem\.0\.weight has shape"):
        create_model("cifar_resnet8", pretrained=str(tmp_path / "w.pth"))


def test_unreadable_checkpoint(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(EffvisionError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(EffvisionError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "missing.pt")


@pytest.mark.parametrize("importance", ["l1", "l2", "bn_scale", "taylor"])
def test_prune_importances(importance):
    from effvision.data import load_dataset
    from effvision.recipe import DataConfig

    data = load_dataset(DataConfig(name="digits", max_train_samples=64, batch_size=16))
    m = create_model("cifar_resnet8", width=0.5)
    before = count_macs(m)
    prune(m, 0.5, importance=importance, calib_loader=data.train_loader())
    assert count_macs(m) < 0.4 * before
    assert m(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_prune_layer_overrides_by_name_and_regex():
    m = create_model("cifar_resnet8")
    prune(m, 0.5, ignore=["re:stages\\.2\\..*"])
    assert m.stages[2].conv1.out_channels == 128
    with pytest.raises(EffvisionError, match="no layer matches"):
        prune(create_model("cifar_resnet8"), 0.5, ignore=["nonexistent.layer"])


def test_conformance_parity_fails_on_an_export_that_is_off(tmp_path, monkeypatch):
    """The parity step can fail: an ONNX file whose logits are off by 1% of their scale (far
    above rounding, far below a wrong operator) is FAIL with its figures, on real photographs."""
    import effvision.runtimes.onnx_files as runtime

    plain = runtime.run_session
    monkeypatch.setattr(runtime, "run_session", lambda s, x: plain(s, x) * 1.01)
    result = _conformance_of(lambda num_classes=7, **kw: _TinyNet(), tmp_path)
    assert (result.ok, result.failed_step) == (False, "parity"), result.reason
    assert "relative" in result.reason and result.parity_relative > 1e-3


def test_conformance_parity_runs_on_real_photographs():
    from effvision.zoo.conformance import real_images

    photos = real_images([3, 24, 24], 6)
    assert photos.shape == (6, 3, 24, 24) and len({float(p.std()) for p in photos}) == 6  # six different crops
    assert real_images([3, 512], 6) is None  # point clouds: random inputs instead
