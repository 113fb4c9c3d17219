"""OpenVINO as a runtime: IR export (fp32; int8 by NNCF) verified against PyTorch, metadata in the
IR's rt_info, predict and bench through the runtime registry, and bad input as one line. Skips
where the [openvino] extra is not installed (except the line that says to install it)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from effvision.cli import main
from effvision.deploy.openvino_export import openvino_missing

needs_openvino = pytest.mark.skipif(openvino_missing() is not None, reason="the [openvino] extra is not installed")


def one_line_error(capsys, code, *fragments):
    cap = capsys.readouterr()
    err = cap.err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("effvision: error:"), err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    """One digits-shaped model with random weights (one checkpoint), as ONNX and as fp32 and int8 IRs."""
    from effvision.models import load_model, save_checkpoint

    out = tmp_path_factory.mktemp("openvino")
    common = [str(save_checkpoint(load_model("cifar_resnet8", random_weights=True), out / "m.pt")), "--data", "digits"]
    assert main(["export", *common, "--out", str(out / "m.onnx")]) == 0
    assert main(["export", *common, "--format", "openvino", "--out", str(out / "m.xml")]) == 0
    assert main(["export", *common, "--format", "openvino", "--precision", "int8", "--out", str(out / "q.xml")]) == 0
    return out


@needs_openvino
def test_an_ir_is_verified_against_pytorch_and_carries_its_metadata(digits_files):
    import json

    from effvision.deploy.metadata import read_metadata
    from effvision.deploy.runtimes import runtime_of_path

    fp32 = json.loads((digits_files / "m.xml.parity.json").read_text())
    assert fp32["relative_diff"] < 1e-4 and fp32["top1_agreement"] == 1.0
    int8 = json.loads((digits_files / "q.xml.parity.json").read_text())
    assert int8["top1_agreement"] >= 0.9
    meta = read_metadata(digits_files / "m.xml")
    assert meta["source"]["format"] == "openvino" and meta["accuracy"]["runtime"] == "openvino"
    assert read_metadata(digits_files / "q.xml")["source"]["precision"] == "int8"
    files = runtime_of_path(digits_files / "q.xml")
    assert files.precision(digits_files / "q.xml") == "int8" and files.precision(digits_files / "m.xml") == "fp32"
    assert files.input_shape(digits_files / "m.xml")[0] == 0  # the batch stays dynamic
    assert files.file_bytes(digits_files / "m.xml") > (digits_files / "m.bin").stat().st_size


@needs_openvino
def test_predict_on_the_ir_agrees_with_predict_on_the_onnx_file(digits_files):
    import effvision
    from effvision.deploy.runtimes import runtime_of_path

    shape = runtime_of_path("m.xml").input_shape(digits_files / "m.xml")[1:]
    x = np.random.default_rng(0).standard_normal((16, *shape)).astype(np.float32)
    onnx, ir = effvision.load(digits_files / "m.onnx"), effvision.load(digits_files / "m.xml")
    assert ir.runtime == "openvino-cpu"
    a, b = onnx.run(x), ir.run(x)
    assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()
    assert (a.argmax(1) == b.argmax(1)).all()


@needs_openvino
def test_onnx_and_openvino_files_are_timed_side_by_side(digits_files):
    from effvision.deploy.bench import compare
    from effvision.deploy.runtimes import runtime_of_path

    shape = runtime_of_path("m.onnx").input_shape(digits_files / "m.onnx")[1:]
    for backend, files in (("onnxruntime-cpu", ("m.onnx",)), ("openvino-cpu", ("m.xml", "q.xml"))):
        targets = {f: (str(digits_files / f), "int8" if f.startswith("q") else "fp32") for f in files}
        rows = compare(targets, shape, backend, [1, 4], "cpu", warmup=2, repeats=8, rounds=2)
        assert {(r["target"], r["batch"]) for r in rows} == {(f, b) for f in files for b in (1, 4)}
        assert all(r["p50"] > 0 for r in rows)


@needs_openvino
def test_a_file_given_to_the_wrong_runtime_or_half_an_ir_is_one_line(digits_files, capsys, tmp_path):
    code = main(["predict", str(digits_files / "m.xml"), str(tmp_path), "--backend", "onnxruntime-cpu"])
    one_line_error(capsys, code, "does not run an OpenVINO IR", "openvino-cpu")
    lonely = tmp_path / "lonely.xml"
    lonely.write_bytes((digits_files / "m.xml").read_bytes())
    code = main(["bench", str(lonely)])
    one_line_error(capsys, code, "no weights file beside it", "lonely.bin")
    fake = tmp_path / "fake.xml"
    fake.write_bytes((digits_files / "m.onnx").read_bytes())
    fake.with_suffix(".bin").write_bytes(b"")
    code = main(["bench", str(fake)])
    one_line_error(capsys, code, "cannot read", "as an OpenVINO IR")


def test_openvino_not_installed_is_one_line_naming_the_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now fails, as where it is absent
    args = ["export", "cifar_resnet8", "--random-weights", "--data", "digits", "--format", "openvino"]
    code = main([*args, "--out", str(tmp_path / "m.xml")])
    one_line_error(capsys, code, "OpenVINO is not installed", "effvision[openvino]")
    assert not list(tmp_path.iterdir())
