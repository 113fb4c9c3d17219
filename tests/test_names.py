"""An unknown name (timm or torchvision architecture, registered architecture, zoo card, dataset)
is said as unknown, with the closest names, before anything else is said or done about it, by
every command that takes one."""

import pytest
import yaml
from conftest import tiny_recipe, write_image_folder
from test_cli import assert_one_line_error, run

# (kind, what the user typed, what the line must say)
MODELS = [
    ("timm", "timm:mobilenetv3_smal_100", ["unknown timm model", "did you mean 'timm:mobilenetv3_small_100'"]),
    ("torchvision", "torchvision:resnet1", ["unknown torchvision model", "did you mean 'torchvision:resnet18'"]),
    ("registered", "cifar_resnt8", ["unknown model 'cifar_resnt8'", "did you mean 'cifar_resnet8'"]),
    ("card", "cifar_resnet8_100.digit", ["unknown model", "did you mean 'cifar_resnet8_100.digits'"]),
]


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("images")
    write_image_folder(root, per_class=1)
    return root


def model_commands(name: str, tmp_path, images) -> dict[str, list[str]]:
    out = str(tmp_path / "m.onnx")
    return {
        "export": ["export", name, "--format", "onnx", "--out", out],
        "export --random-weights": ["export", name, "--format", "onnx", "--out", out, "--random-weights"],
        "bench": ["bench", name, "--batch", "1", "--repeats", "2", "--warmup", "1"],
        "predict": ["predict", name, str(images)],
        "zoo show": ["zoo", "show", name],
    }


@pytest.mark.parametrize("command", ["export", "export --random-weights", "bench", "predict", "zoo show"])
@pytest.mark.parametrize("kind,name,said", MODELS, ids=[m[0] for m in MODELS])
def test_a_command_says_an_unknown_model_name_first(command, kind, name, said, tmp_path, images, capsys):
    code, out, err = run(capsys, *model_commands(name, tmp_path, images)[command])
    assert_one_line_error(code, err, *said)
    assert "random weights" not in out + err and "not a zoo card" not in err  # nothing else about it first
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("command", ["compress", "train"])
@pytest.mark.parametrize(
    "key,name,said",
    [("model", *m[1:]) for m in MODELS] + [("data", "digit", ["unknown dataset 'digit'", "did you mean 'digits'"])],
    ids=[f"model-{m[0]}" for m in MODELS] + ["dataset"],
)
def test_a_recipe_says_an_unknown_name_before_its_run_folder_exists(command, key, name, said, tmp_path, capsys):
    raw = tiny_recipe(**{key: {"name": name}})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    code, _, err = run(capsys, command, str(path), "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(code, err, *said)
    assert not (tmp_path / "run").exists()


def test_export_says_an_unknown_dataset_first(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    code, _, err = run(capsys, "export", "cifar_resnet8_100.digits", "--data", "digit", "--out", str(out))
    assert_one_line_error(code, err, "unknown dataset 'digit'", "did you mean 'digits'")
    assert not out.exists()
