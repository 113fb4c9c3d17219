"""The shipped model on its own: `effvision predict`, `effvision.load`, exports of zoo cards by
name and the deployment bundle's predict.py without torch or effvision."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import HIDE_TORCH, SHARED, needs_shared, write_image_folder, zip_folder
from PIL import Image

import effvision
from effvision.cli import main
from effvision.models import model_card
from effvision.runtimes.executorch import executorch_missing

CIFAR_IMAGES = SHARED / "testdata/images/cifar10_test"
CARD = "speednet_32.cifar10"


def cli(capsys, *args):
    code = main([str(a) for a in args])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def one_line_error(code, err, *fragments):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("effvision: error:"), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.fixture(scope="module")
def digits_onnx(tmp_path_factory) -> Path:
    """A digits-shaped model with random weights: the mechanics, not the accuracy."""
    out = tmp_path_factory.mktemp("digits") / "m.onnx"
    assert main(["export", "cifar_resnet8", "--random-weights", "--data", "digits", "--out", str(out)]) == 0
    return out


def test_a_name_without_weights_is_refused_unless_random_weights_are_asked_for(capsys, tmp_path):
    code, _, err = cli(capsys, "export", "cifar_resnet8", "--out", tmp_path / "a.onnx")
    one_line_error(code, err, "not a zoo card with weights", "--random-weights")
    code, _, err = cli(capsys, "export", "resnet18.cifar10", "--out", tmp_path / "b.onnx")
    one_line_error(code, err, "resnet18.cifar10 has no weights", "effvision train", "--random-weights")
    assert not list(tmp_path.iterdir())


def test_the_export_carries_the_datasets_preprocessing_and_classes(digits_onnx):
    from effvision.data import load_dataset

    card = load_dataset("digits").card
    props = {p.key: p.value for p in onnx.load(str(digits_onnx)).metadata_props}
    meta = json.loads(props["effvision"])
    assert meta["preprocessing"]["mean"] == card.mean and meta["preprocessing"]["std"] == card.std
    assert meta["classes"] == card.classes and meta["accuracy"]["data"] == "digits"
    assert meta["source"]["exported_from"] == "cifar_resnet8" and meta["source"]["precision"] == "fp32"


def test_predict_goes_on_past_a_corrupt_image_and_reads_folders_and_zips(digits_onnx, capsys, tmp_path):
    folder = write_image_folder(tmp_path / "imgs", classes=("3", "7"), per_class=3, size=20)
    (folder / "3" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    (folder / "notes.txt").write_text("not an image")  # other files in a folder are not inputs
    archive = zip_folder(folder, tmp_path / "imgs.zip")
    code, out, err = cli(capsys, "predict", digits_onnx, folder, archive, "--json", tmp_path / "p.json", "--topk", 2)
    assert code == 0, err
    assert "broken.png: skipped:" in out and "Traceback" not in out + err
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["summary"]["predicted"] == 12 and result["summary"]["skipped"] == 2
    assert result["summary"]["labelled"] == 12 and 0 <= result["summary"]["top1"] <= 1
    assert all(len(r["top"]) == 2 for r in result["predictions"])
    assert any(r["input"].endswith("imgs.zip!7/0.png") for r in result["predictions"])
    assert "top-1 against folder labels" in out


def test_bad_inputs_are_one_line(digits_onnx, capsys, tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model at all")
    image = write_image_folder(tmp_path / "one", classes=("x",), per_class=1) / "x" / "0.png"
    code, _, err = cli(capsys, "predict", garbage, image)
    one_line_error(code, err, "garbage.onnx")
    code, _, err = cli(capsys, "predict", tmp_path / "missing.onnx", image)
    one_line_error(code, err, "artifact not found")
    video = tmp_path / "clip.mp4"
    video.write_bytes(b"\x00" * 64)
    code, _, err = cli(capsys, "predict", digits_onnx, video)
    one_line_error(code, err, "the model takes images", "clip.mp4")
    (tmp_path / "empty").mkdir()
    code, _, err = cli(capsys, "predict", digits_onnx, tmp_path / "empty")
    one_line_error(code, err, "no image files")
    code, _, err = cli(capsys, "predict", digits_onnx, image, "--backend", "executorch")
    one_line_error(code, err, "does not run an ONNX file")


def test_a_plain_onnx_file_predicts_when_told_its_preprocessing(digits_onnx, capsys, tmp_path):
    model = onnx.load(str(digits_onnx))
    del model.metadata_props[:]
    plain = tmp_path / "plain.onnx"
    onnx.save(model, str(plain))
    image = write_image_folder(tmp_path / "imgs", classes=("x",), per_class=2, size=40) / "x" / "0.png"
    code, _, err = cli(capsys, "predict", plain, image)
    one_line_error(code, err, "carries no effvision metadata", "--mean", "--std")
    code, out, err = cli(
        capsys, "predict", plain, image, "--mean", "0.3,0.3,0.3", "--std", "0.32,0.32,0.32", "--size", 32
    )
    assert code == 0 and "1 predicted, 0 skipped" in out, err


def test_load_predicts_paths_pil_images_and_arrays_alike(digits_onnx, tmp_path):
    predictor = effvision.load(digits_onnx)
    path = write_image_folder(tmp_path / "imgs", classes=("x",), per_class=1, size=32) / "x" / "0.png"
    pil = Image.open(path).convert("RGB")
    by_path, by_pil, by_array = predictor.predict([path, pil, np.asarray(pil)], topk=10)
    assert by_path == by_pil == by_array
    assert [c for c, _ in by_path] != [] and sum(p for _, p in by_path) == pytest.approx(1.0, abs=1e-6)
    assert {c for c, _ in by_path} == set(predictor.classes) == {str(i) for i in range(10)}
    assert predictor.predict(path, topk=1)[0][0] == by_path[0][0]


# ------------------------------------------------------------------ the trained CIFAR-10 card


@pytest.fixture(scope="module")
def cifar_exports(tmp_path_factory):
    """The card exported by name (fp32, and int8 with a bundle), verified and scored on the shared
    CIFAR-10 test split (the .pte: make bench, below)."""
    if not (SHARED / "datasets").is_dir():
        pytest.skip("../shared (real test data) is not present")
    d = tmp_path_factory.mktemp("cifar")
    root = str(SHARED / "datasets")
    files = {"fp32": d / "sn.onnx", "int8": d / "sn8.onnx"}
    assert main(["export", CARD, "--out", str(files["fp32"]), "--data-root", root]) == 0
    args = ["--precision", "int8", "--out", str(files["int8"]), "--bundle", str(d / "bundle")]
    assert main(["export", CARD, *args, "--data-root", root]) == 0
    return files, d / "bundle"


@needs_shared
@pytest.mark.slow  # 40-50 s: the Lite0 card exported twice and verified on the shared images
def test_a_card_exported_by_name_is_the_cards_model(cifar_exports):
    files, _ = cifar_exports
    card = model_card(CARD).trained.accuracy
    for path in files.values():
        parity = json.loads(Path(str(path) + ".parity.json").read_text())
        assert parity["data"] == "cifar10" and abs(parity["accuracy"] - card) <= 0.03, (path, parity)


def _predict_real_images(path, out_json):
    """`effvision predict` on the 300 real CIFAR-10 images in a new process: its summary and seconds."""
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "effvision.cli", "predict", str(path), str(CIFAR_IMAGES), "--quiet"]
        + ["--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.perf_counter() - start
    assert out.returncode == 0, out.stderr
    return json.loads(out_json.read_text())["summary"], seconds


@needs_shared
@pytest.mark.slow  # the card's exports (40-50 s, above); make test checks predict and bundles on digits
def test_predict_on_the_real_images_scores_the_cards_accuracy(cifar_exports, tmp_path):
    files, _ = cifar_exports
    card = model_card(CARD).trained.accuracy
    for precision, path in files.items():
        summary, _ = _predict_real_images(path, tmp_path / f"{precision}.json")
        assert summary["labelled"] == summary["predicted"] == 300 and summary["skipped"] == 0
        assert abs(summary["top1"] - card) <= 0.03, (precision, summary)


@needs_shared
@pytest.mark.slow  # an ExecuTorch export verified on 10,000 images: 20 s more of make test
def test_the_card_exported_to_executorch_is_the_cards_model_and_predicts(tmp_path):
    if executorch_missing() is not None:
        pytest.skip(executorch_missing())
    pte = tmp_path / "sn.pte"
    assert (
        main(["export", CARD, "--format", "executorch", "--out", str(pte), "--data-root", str(SHARED / "datasets")])
        == 0
    )
    card = model_card(CARD).trained.accuracy
    parity = json.loads(Path(str(pte) + ".parity.json").read_text())
    assert parity["data"] == "cifar10" and abs(parity["accuracy"] - card) <= 0.03, parity
    summary, _ = _predict_real_images(pte, tmp_path / "pte.json")
    assert summary["predicted"] == 300 and abs(summary["top1"] - card) <= 0.03, summary


@needs_shared
@pytest.mark.slow  # the Lite0 card verified on 10,000 images at 112 px, as ONNX and as an OpenVINO IR: 2 min
def test_a_card_fine_tuned_at_another_size_than_its_dataset_exports_at_its_own(tmp_path):
    """The Lite0 CIFAR-10 card takes 112 px; CIFAR-10 is 32 px: the card's export sees the images at
    112 (it refused them as not fitting), and its OpenVINO IR and ONNX file score the card's top-1."""
    import importlib.util

    lite0, root = "tf_efficientnet_lite0.cifar10", str(SHARED / "datasets")
    card = model_card(lite0).trained.accuracy
    formats = ["onnx"] + (["openvino"] if importlib.util.find_spec("openvino") else [])
    for fmt in formats:
        out = tmp_path / f"lite0.{'xml' if fmt == 'openvino' else 'onnx'}"
        args = ["export", lite0, "--format", fmt, "--out", str(out), "--data-root", root]
        # (a child process: OpenVINO stays out of the test process, as tests/test_openvino.py says why)
        done = subprocess.run([sys.executable, "-m", "effvision.cli", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        parity = json.loads(Path(str(out) + ".parity.json").read_text())
        assert parity["input_shape"] == [3, 112, 112] and abs(parity["accuracy"] - card) <= 0.002, (fmt, parity)


@needs_shared
@pytest.mark.slow
def test_predict_on_300_images_takes_seconds(cifar_exports, tmp_path):
    """A wall-clock bound (process start, imports, 300 decodes): `make bench`, not `make test`, where a
    loaded machine would fail it (BENCHMARKS.md, "Predict")."""
    summary, seconds = _predict_real_images(cifar_exports[0]["fp32"], tmp_path / "fp32.json")
    assert summary["predicted"] == 300 and seconds < 10, f"predict on 300 images took {seconds:.1f} s"


@needs_shared
@pytest.mark.slow  # the card's exports (40-50 s, above); make test checks predict and bundles on digits
def test_the_bundle_runs_without_torch_and_agrees_with_predict(cifar_exports, tmp_path):
    files, bundle = cifar_exports
    cmd = [sys.executable, "-I", "-c", HIDE_TORCH, str(bundle / "predict.py"), str(CIFAR_IMAGES)]
    out = subprocess.run(cmd + ["--json", str(tmp_path / "b.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    code = main(["predict", str(files["int8"]), str(CIFAR_IMAGES), "--quiet", "--json", str(tmp_path / "e.json")])
    assert code == 0
    ours = {r["input"]: r["top"][0]["class"] for r in json.loads((tmp_path / "e.json").read_text())["predictions"]}
    theirs = {r["input"]: r["top"][0]["class"] for r in json.loads((tmp_path / "b.json").read_text())["predictions"]}
    assert len(ours) == 300 and ours == theirs


@needs_shared
@pytest.mark.slow  # the card exported to two more runtimes with bundles, 1,200 predictions: about 2 min
def test_every_runtime_and_its_bundle_predicts_the_real_images_as_the_onnx_file_does(cifar_exports, tmp_path):
    """`effvision predict` on an OpenVINO IR and a LiteRT file, and their bundles' predict.py without
    torch, give each of the 300 real images the top-1 class predict gives it on the ONNX file."""
    from effvision.runtimes.litert import converter_python

    files, _ = cifar_exports
    formats = {"openvino": ".xml", "litert": ".tflite"}
    if converter_python() is None:
        formats.pop("litert")  # (its converter is set up by make litert-converter)

    def tops(json_file):
        return {r["input"]: r["top"][0]["class"] for r in json.loads(json_file.read_text())["predictions"]}

    _predict_real_images(files["fp32"], tmp_path / "onnx.json")
    want = tops(tmp_path / "onnx.json")
    assert len(want) == 300
    for fmt, suffix in formats.items():
        path, bundle = tmp_path / f"sn{suffix}", tmp_path / f"{fmt}-bundle"
        args = ["export", CARD, "--format", fmt, "--out", str(path), "--bundle", str(bundle)]
        done = subprocess.run(  # (child processes: the runtimes' native libraries stay out of this one)
            [sys.executable, "-m", "effvision.cli", *args, "--data-root", str(SHARED / "datasets")],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        _predict_real_images(path, tmp_path / f"{fmt}.json")
        cmd = [sys.executable, "-I", "-c", HIDE_TORCH, str(bundle / "predict.py"), str(CIFAR_IMAGES)]
        out = subprocess.run(cmd + ["--json", str(tmp_path / f"{fmt}-b.json")], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert tops(tmp_path / f"{fmt}.json") == want and tops(tmp_path / f"{fmt}-b.json") == want, fmt


# ------------------------------------------------------------------ real clips and clouds


@needs_shared
@pytest.mark.parametrize(
    "card, folder, exts",
    [
        ("tsm_resnet8_050.synthetic_motion", "videos", None),
        ("pointnet_050.synthetic_shapes", "pointclouds", None),
    ],
)
def test_every_real_clip_and_cloud_gets_a_prediction_or_a_status_line(card, folder, exts, tmp_path, capsys):
    files = [p for p in (SHARED / "testdata" / folder).rglob("*") if p.is_file()]
    code, out, err = cli(capsys, "predict", card, SHARED / "testdata" / folder, "--json", tmp_path / "p.json")
    assert code == 0 and "Traceback" not in out + err, err
    result = json.loads((tmp_path / "p.json").read_text())
    assert len(result["predictions"]) + len(result["skipped"]) == len(files), result["summary"]
    assert len(result["predictions"]) >= len(files) // 2
