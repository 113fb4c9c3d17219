"""LiteRT (TFLite) as a runtime: .tflite export by litert-torch in its own environment (fp32; the
LiteRT tools' int8) verified against PyTorch, metadata inside the file, predict, bench and the
bundle through the runtime registry, and bad input as one line. The conversion tests skip where
the converter is not set up (`make litert-converter`); the lines that say what to install do not.

As with OpenVINO, everything that loads LiteRT's native libraries runs in a child process: the
suite's own process never imports them."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import HIDE_TORCH, child_json, one_error_line, run_cli, write_image_folder

from effvision.cli import main
from effvision.runtimes.litert import converter_python

needs_litert = pytest.mark.skipif(
    importlib.util.find_spec("ai_edge_litert") is None or converter_python() is None,
    reason="LiteRT's interpreter ([litert] extra) or its converter (make litert-converter) is not set up",
)


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    """One digits model trained for two epochs (an int8 file of random weights, whose logits are all
    near zero, says little), as ONNX, as fp32 and int8 .tflite and a .tflite bundle."""
    import torch

    from effvision.data import load_dataset
    from effvision.models import load_model, save_checkpoint

    torch.manual_seed(0)
    model, data = load_model("cifar_resnet8", random_weights=True).train(), load_dataset("digits")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for _ in range(2):
        for x, y in data.train_loader(batch_size=64):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    out = tmp_path_factory.mktemp("litert")
    common = [save_checkpoint(model.eval(), out / "m.pt"), "--data", "digits"]
    assert main(["export", *map(str, common), "--out", str(out / "m.onnx")]) == 0  # (ONNX: in this process)
    for extra in (
        ["--format", "litert", "--out", out / "m.tflite", "--bundle", out / "bundle"],
        ["--format", "litert", "--precision", "int8", "--out", out / "q.tflite"],
    ):
        done = run_cli("export", *common, *extra)
        assert done.returncode == 0, done.stderr
    return out


@needs_litert
def test_a_tflite_file_is_verified_against_pytorch_and_carries_its_metadata(digits_files):
    fp32 = json.loads((digits_files / "m.tflite.parity.json").read_text())
    assert fp32["relative_diff"] < 1e-4 and fp32["top1_agreement"] == 1.0
    int8 = json.loads((digits_files / "q.tflite.parity.json").read_text())
    assert int8["top1_agreement"] >= 0.9 and int8["accuracy"] >= fp32["accuracy"] - 0.05, (int8, fp32)
    read = child_json(
        "import json; from effvision.deploy.metadata import read_metadata; "
        "from effvision.runtimes import runtime_of_path; "
        f"d = {str(digits_files)!r}; r = runtime_of_path('m.tflite'); "
        "print(json.dumps({'meta': read_metadata(d + '/m.tflite'), 'q': read_metadata(d + '/q.tflite'), "
        "'precisions': [r.precision(d + '/m.tflite'), r.precision(d + '/q.tflite')], "
        "'shape': r.input_shape(d + '/m.tflite')}))"
    )
    assert read["meta"]["source"]["format"] == "litert" and read["meta"]["accuracy"]["runtime"] == "litert"
    assert read["q"]["source"]["precision"] == "int8" and read["precisions"] == ["fp32", "int8"]
    assert read["shape"] == [0, 3, 32, 32]  # the batch is resized to what is given


@needs_litert
def test_predict_and_the_tflite_bundle_agree_with_predict_on_the_onnx_file(digits_files, tmp_path):
    images = write_image_folder(tmp_path / "images", classes=("0", "1"), per_class=4)
    tops = {}
    for name in ("m.onnx", "m.tflite"):
        done = run_cli("predict", digits_files / name, images, "--quiet", "--json", tmp_path / f"{name}.json")
        assert done.returncode == 0, done.stderr
        rows = json.loads((tmp_path / f"{name}.json").read_text())["predictions"]
        tops[name] = {r["input"]: r["top"][0]["class"] for r in rows}
    bundle = digits_files / "bundle"
    assert sorted(p.name for p in bundle.iterdir()) == [
        "README.md",
        "model.json",
        "model.tflite",
        "predict.py",
        "requirements.txt",
    ]
    assert (bundle / "requirements.txt").read_text().split()[0] == "ai-edge-litert"
    cmd = [sys.executable, "-I", "-c", HIDE_TORCH, str(bundle / "predict.py"), str(images)]
    out = subprocess.run(cmd + ["--json", str(tmp_path / "b.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "b.json").read_text())["predictions"]
    tops["bundle"] = {r["input"]: r["top"][0]["class"] for r in rows}
    assert len(tops["m.onnx"]) == 8 and tops["m.onnx"] == tops["m.tflite"] == tops["bundle"]


@needs_litert
def test_onnx_and_litert_files_are_timed_side_by_side(digits_files):
    rows = child_json(
        "import json; from effvision.deploy.bench import compare; "
        f"d = {str(digits_files)!r}; "
        "rows = compare({'m.tflite': (d + '/m.tflite', 'fp32'), 'q.tflite': (d + '/q.tflite', 'int8')}, "
        "[3, 32, 32], 'litert-cpu', [1, 4], 'cpu', warmup=2, repeats=8, rounds=2); "
        "print(json.dumps([[r['target'], r['batch'], r['p50']] for r in rows]))"
    )
    assert {(t, b) for t, b, _ in rows} == {(t, b) for t in ("m.tflite", "q.tflite") for b in (1, 4)}
    assert all(p50 > 0 for *_, p50 in rows)


@needs_litert
def test_a_file_given_to_the_wrong_runtime_is_one_line(digits_files, tmp_path):
    one_error_line(
        run_cli("predict", digits_files / "m.tflite", tmp_path, "--backend", "onnxruntime-cpu"),
        "does not run a LiteRT file",
        "litert-cpu",
    )
    fake = tmp_path / "fake.tflite"
    fake.write_bytes((digits_files / "m.onnx").read_bytes())
    one_error_line(run_cli("bench", fake), "cannot read", "not a .tflite flatbuffer")
    one_error_line(run_cli("bench", digits_files / "m.onnx", "--backend", "litert-cpu"), "does not run an ONNX file")


@pytest.mark.skipif(importlib.util.find_spec("ai_edge_litert") is None, reason="the [litert] extra is not installed")
def test_a_converter_not_set_up_is_one_line_and_writes_nothing(tmp_path):
    args = ["export", "cifar_resnet8", "--random-weights", "--data", "digits", "--format", "litert"]
    done = run_cli(*args, "--out", tmp_path / "m.tflite", env={"EFFVISION_LITERT_PYTHON": str(tmp_path / "none")})
    one_error_line(done, "LiteRT converter is not set up", "make litert-converter", "EFFVISION_LITERT_PYTHON")
    assert not list(tmp_path.iterdir())


def test_litert_not_installed_is_one_line_naming_the_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)  # the import fails, as where absent
    args = ["export", "cifar_resnet8", "--random-weights", "--data", "digits", "--format", "litert"]
    code = main([*args, "--out", str(tmp_path / "m.tflite")])
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, lines
    assert "LiteRT is not installed" in lines[0] and "effvision[litert]" in lines[0]
    assert not list(tmp_path.iterdir())
