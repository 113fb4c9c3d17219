"""OpenVINO as a runtime: IR export (fp32; int8 by NNCF) verified against PyTorch, metadata in the
IR's rt_info, predict, bench and the bundle through the runtime registry, and bad input as one line.
Skips where the [openvino] extra is not installed (except the line that says to install it).

Everything that loads OpenVINO runs in a child process: with OpenVINO and NNCF loaded, a later
test of the suite crashed the test process (SIGSEGV in a subprocess call) on this project's CI
machine; the suite's own process never imports them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import HIDE_TORCH, child_json, needs_openvino, one_error_line, run_cli, write_image_folder

from effvision.cli import main


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory):
    """One digits-shaped model with random weights (one checkpoint), as ONNX, as fp32 and int8 IRs
    and as an IR bundle."""
    from effvision.models import load_model, save_checkpoint

    out = tmp_path_factory.mktemp("openvino")
    common = [save_checkpoint(load_model("cifar_resnet8", random_weights=True), out / "m.pt"), "--data", "digits"]
    assert main(["export", *map(str, common), "--out", str(out / "m.onnx")]) == 0  # (ONNX: in this process)
    for extra in (
        ["--format", "openvino", "--out", out / "m.xml", "--bundle", out / "bundle"],
        ["--format", "openvino", "--precision", "int8", "--out", out / "q.xml"],
    ):
        done = run_cli("export", *common, *extra)
        assert done.returncode == 0, done.stderr
    return out


@needs_openvino
def test_an_ir_is_verified_against_pytorch_and_carries_its_metadata(digits_files):
    fp32 = json.loads((digits_files / "m.xml.parity.json").read_text())
    assert fp32["relative_diff"] < 1e-4 and fp32["top1_agreement"] == 1.0
    int8 = json.loads((digits_files / "q.xml.parity.json").read_text())
    assert int8["top1_agreement"] >= 0.9
    read = child_json(
        "import json; from effvision.deploy.metadata import read_metadata; "
        "from effvision.runtimes import runtime_of_path; "
        f"d = {str(digits_files)!r}; r = runtime_of_path('m.xml'); "
        "print(json.dumps({'meta': read_metadata(d + '/m.xml'), 'q': read_metadata(d + '/q.xml'), "
        "'precisions': [r.precision(d + '/m.xml'), r.precision(d + '/q.xml')], "
        "'shape': r.input_shape(d + '/m.xml'), 'bytes': r.file_bytes(d + '/m.xml')}))"
    )
    assert read["meta"]["source"]["format"] == "openvino" and read["meta"]["accuracy"]["runtime"] == "openvino"
    assert read["q"]["source"]["precision"] == "int8" and read["precisions"] == ["fp32", "int8"]
    assert read["shape"][0] == 0  # the batch stays dynamic
    assert read["bytes"] > (digits_files / "m.bin").stat().st_size


@needs_openvino
def test_predict_and_the_ir_bundle_agree_with_predict_on_the_onnx_file(digits_files, tmp_path):
    images = write_image_folder(tmp_path / "images", classes=("0", "1"), per_class=4)
    tops = {}
    for name in ("m.onnx", "m.xml"):
        done = run_cli("predict", digits_files / name, images, "--quiet", "--json", tmp_path / f"{name}.json")
        assert done.returncode == 0, done.stderr
        rows = json.loads((tmp_path / f"{name}.json").read_text())["predictions"]
        tops[name] = {r["input"]: r["top"][0]["class"] for r in rows}
    bundle = digits_files / "bundle"
    files = ["README.md", "model.bin", "model.json", "model.xml", "predict.py", "requirements.txt"]
    assert sorted(p.name for p in bundle.iterdir()) == files
    assert (bundle / "requirements.txt").read_text().split()[0] == "openvino"
    cmd = [sys.executable, "-I", "-c", HIDE_TORCH, str(bundle / "predict.py"), str(images)]
    out = subprocess.run(cmd + ["--json", str(tmp_path / "b.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp_path / "b.json").read_text())["predictions"]
    tops["bundle"] = {r["input"]: r["top"][0]["class"] for r in rows}
    assert len(tops["m.onnx"]) == 8 and tops["m.onnx"] == tops["m.xml"] == tops["bundle"]


@needs_openvino
def test_onnx_and_openvino_files_are_timed_side_by_side(digits_files):
    rows = child_json(
        "import json; from effvision.deploy.bench import compare; "
        "from effvision.runtimes import runtime_of_path; "
        f"d = {str(digits_files)!r}; shape = runtime_of_path('m.onnx').input_shape(d + '/m.onnx')[1:]; "
        "rows = compare({'m.xml': (d + '/m.xml', 'fp32'), 'q.xml': (d + '/q.xml', 'int8')}, shape, "
        "'openvino-cpu', [1, 4], 'cpu', warmup=2, repeats=8, rounds=2); "
        "print(json.dumps([[r['target'], r['batch'], r['p50']] for r in rows]))"
    )
    assert {(t, b) for t, b, _ in rows} == {(t, b) for t in ("m.xml", "q.xml") for b in (1, 4)}
    assert all(p50 > 0 for *_, p50 in rows)


@needs_openvino
def test_a_file_given_to_the_wrong_runtime_or_half_an_ir_is_one_line(digits_files, tmp_path):
    one_error_line(
        run_cli("predict", digits_files / "m.xml", tmp_path, "--backend", "onnxruntime-cpu"),
        "does not run an OpenVINO IR",
        "openvino-cpu",
    )
    lonely = tmp_path / "lonely.xml"
    lonely.write_bytes((digits_files / "m.xml").read_bytes())
    one_error_line(run_cli("bench", lonely), "no weights file beside it", "lonely.bin")
    fake = tmp_path / "fake.xml"  # OpenVINO reads files by their content: an ONNX file named .xml
    fake.write_bytes((digits_files / "m.onnx").read_bytes())
    fake.with_suffix(".bin").write_bytes(b"")
    one_error_line(run_cli("bench", fake), "cannot read", "as an OpenVINO IR")


def test_openvino_not_installed_is_one_line_naming_the_extra(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now fails, as where it is absent
    args = ["export", "cifar_resnet8", "--random-weights", "--data", "digits", "--format", "openvino"]
    code = main([*args, "--out", str(tmp_path / "m.xml")])
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, err
    assert "OpenVINO is not installed" in lines[0] and "effvision[openvino]" in lines[0]
    assert not list(tmp_path.iterdir())
