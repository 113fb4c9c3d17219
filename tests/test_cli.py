"""The command line: exit codes, one-line errors (no tracebacks), and the main commands."""

import json
from pathlib import Path

import torch
import yaml
from conftest import tiny_recipe, write_image_folder

from effvision.cli import main
from effvision.models import create_model, save_checkpoint


def run(capsys, *args):
    code = main(list(args))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def assert_one_line_error(code, err, *fragments):
    assert code == 1, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("effvision: error:"), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in err, (f, err)


def write_recipe(tmp_path, raw) -> str:
    p = tmp_path / "recipe.yaml"
    p.write_text(yaml.safe_dump(raw))
    return str(p)


def test_help_and_usage_errors(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "compress" in out and "zoo" in out and "bench" in out
    code, _, err = run(capsys, "no-such-command")
    assert code == 2
    code, _, _ = run(capsys, "compress")  # missing RECIPE
    assert code == 2


def test_unknown_model_name_in_recipe(tmp_path, capsys):
    raw = tiny_recipe(model={"name": "cifar_resnt8"})
    code, _, err = run(capsys, "compress", write_recipe(tmp_path, raw), "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(code, err, "unknown model 'cifar_resnt8'", "did you mean 'cifar_resnet8'")


def test_misspelled_recipe_key(tmp_path, capsys):
    raw = tiny_recipe()
    raw["stages"][2]["temprature"] = 3
    path = write_recipe(tmp_path, raw)
    code, _, err = run(capsys, "compress", path, "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(code, err, path, "stages.2.temprature", "did you mean 'temperature'")


def test_misspelled_set_key(tmp_path, capsys):
    code, _, err = run(capsys, "compress", write_recipe(tmp_path, tiny_recipe()), "--set", "stages.prune.raito=0.3")
    assert_one_line_error(code, err, "stages.1.raito", "did you mean 'ratio'")


def test_missing_data_path(tmp_path, capsys):
    raw = tiny_recipe(data={"name": "imagefolder", "root": str(tmp_path / "nowhere")})
    code, _, err = run(capsys, "compress", write_recipe(tmp_path, raw), "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(code, err, "data path not found", "nowhere")


def test_missing_recipe_file(capsys):
    code, _, err = run(capsys, "compress", "no/such.yaml")
    assert_one_line_error(code, err, "recipe not found: no/such.yaml")


def _corrupt_folder(tmp_path) -> Path:
    root = tmp_path / "imgs"
    write_image_folder(root / "train", per_class=16, size=16)
    write_image_folder(root / "val", per_class=4, size=16)
    (root / "train" / "cat" / "corrupt.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")
    return root


def test_corrupt_image_fails_with_its_path(tmp_path, capsys):
    root = _corrupt_folder(tmp_path)
    raw = tiny_recipe(
        data={"name": "imagefolder", "root": str(root), "image_size": 16, "on_bad_sample": "fail"},
        stages=[{"type": "train", "epochs": 1}],
    )
    code, _, err = run(capsys, "compress", write_recipe(tmp_path, raw), "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(code, err, "corrupt image", "corrupt.jpg")


def test_corrupt_image_skipped_and_counted(tmp_path, capsys):
    root = _corrupt_folder(tmp_path)
    raw = tiny_recipe(
        data={"name": "imagefolder", "root": str(root), "image_size": 16, "on_bad_sample": "skip", "batch_size": 8},
        stages=[{"type": "train", "epochs": 1}],
    )
    code, out, err = run(capsys, "compress", write_recipe(tmp_path, raw), "--run-dir", str(tmp_path / "run"))
    assert code == 0, err
    report = json.loads((tmp_path / "run/report.json").read_text())
    assert report["dataset"]["bad_samples"] == 1 and report["dataset"]["train_size"] == 32
    assert "corrupt.jpg" in (tmp_path / "run/dataset.json").read_text()


def test_checkpoint_shape_mismatch(tmp_path, capsys):
    torch.save(create_model("cifar_resnet8", width=0.5).state_dict(), tmp_path / "w.pth")
    raw = tiny_recipe(model={"name": "cifar_resnet8", "pretrained": str(tmp_path / "w.pth")})
    code, _, err = run(capsys, "compress", write_recipe(tmp_path, raw), "--run-dir", str(tmp_path / "run"))
    assert_one_line_error(code, err, "does not match the model", "w.pth")


def test_debug_shows_traceback(tmp_path, capsys):
    code, _, err = run(capsys, "compress", "no/such.yaml", "--debug")
    assert code == 1 and "Traceback" in err


def test_zoo_list_and_show(capsys):
    code, out, _ = run(capsys, "zoo", "list", "--json")
    assert code == 0
    rows = json.loads(out)
    card = next(r for r in rows if r["name"] == "cifar_resnet8_100.digits")
    assert card["params"] > 100_000 and card["macs"] > 1_000_000 and card["input_size"] == [3, 32, 32]
    assert card["recipe"] == "default" and 0 < card["accuracy"] <= 1
    code, out, _ = run(capsys, "zoo", "list")
    assert code == 0 and "cifar_resnet8_100.digits" in out and "MACs" in out
    code, out, _ = run(capsys, "zoo", "show", "cifar_resnet8_100.digits")
    assert code == 0 and json.loads(out)["arch"] == "cifar_resnet8"
    code, _, err = run(capsys, "zoo", "show", "cifar_resnet8_100.digit")
    assert_one_line_error(code, err, "did you mean 'cifar_resnet8_100.digits'")


def test_data_inspect_json(tmp_path, capsys):
    write_image_folder(tmp_path / "d", per_class=2)
    (tmp_path / "d" / "cat" / "x.png").write_bytes(b"nope")
    code, out, _ = run(capsys, "data", "inspect", str(tmp_path / "d"), "--json")
    assert code == 0
    rows = json.loads(out)
    assert len(rows) == 5 and sum(not r["ok"] for r in rows) == 1
    code, _, err = run(capsys, "data", "inspect", str(tmp_path / "missing"))
    assert_one_line_error(code, err, "path not found")


def test_train_then_compress_resumes_and_report(tmp_path, capsys):
    raw = tiny_recipe(stages=tiny_recipe()["stages"][:2])
    path, run_dir = write_recipe(tmp_path, raw), tmp_path / "run"
    code, out, err = run(capsys, "train", path, "--run-dir", str(run_dir))
    assert code == 0, err
    assert json.loads((run_dir / "report.json").read_text())["stages"][0]["type"] == "train"
    stamp = (run_dir / "stages/1-baseline/metrics.json").stat().st_mtime_ns
    code, out, err = run(capsys, "compress", path, "--run-dir", str(run_dir))
    assert code == 0, err
    assert (run_dir / "stages/1-baseline/metrics.json").stat().st_mtime_ns == stamp
    assert "report:" in out and "prune" in out
    code, out, err = run(capsys, "train", path, "--run-dir", str(run_dir))  # a partial run keeps later stages
    assert code == 0 and (run_dir / "stages/2-prune/metrics.json").is_file(), err
    code, out, _ = run(capsys, "report", str(run_dir))
    assert code == 0 and "baseline" in out
    code, _, err = run(capsys, "report", str(tmp_path))
    assert_one_line_error(code, err, "not a run folder")


def test_export_and_bench_commands(tmp_path, capsys):
    ckpt = save_checkpoint(create_model("cifar_resnet8", width=0.25).eval(), tmp_path / "m.pt")
    onnx_file = tmp_path / "m.onnx"
    code, out, err = run(capsys, "export", str(ckpt), "--format", "onnx", "--out", str(onnx_file))
    assert code == 0, err
    summary = json.loads((tmp_path / "m.onnx.parity.json").read_text())
    assert summary["max_abs_diff"] < 1e-3 and summary["top1_agreement"] == 1.0
    code, out, err = run(
        capsys,
        "export",
        str(ckpt),
        "--precision",
        "int8",
        "--out",
        str(tmp_path / "q.onnx"),
        "--calibration-samples",
        "32",
    )
    assert code == 0, err
    assert (tmp_path / "q.onnx").stat().st_size < 0.5 * onnx_file.stat().st_size
    res = tmp_path / "bench.json"
    code, out, err = run(
        capsys, "bench", str(onnx_file), "--batch", "1,4", "--repeats", "5", "--warmup", "1", "--json", str(res)
    )
    assert code == 0, err
    rows = json.loads(res.read_text())["results"]
    assert [r["batch"] for r in rows] == [1, 4] and all(r["p50"] > 0 for r in rows)
    code, out, err = run(
        capsys,
        "bench",
        str(ckpt),
        "--backend",
        "torch-eager,onnxruntime-cpu",
        "--batch",
        "2",
        "--repeats",
        "5",
        "--json",
        str(res),
    )
    assert code == 0, err
    assert {r["backend"] for r in json.loads(res.read_text())["results"]} == {"torch-eager", "onnxruntime-cpu"}
    # no --backend: each precision runs on the default backends that run it, the rest said in one line
    args = ["--precision", "fp32,int8", "--batch", "1", "--repeats", "3", "--no-roofline", "--json", str(res)]
    code, out, err = run(capsys, "bench", str(ckpt), *args)
    assert code == 0, err
    pairs = [(r["backend"], r["precision"]) for r in json.loads(res.read_text())["results"]]
    assert pairs == [("torch-eager", "fp32"), ("onnxruntime-cpu", "fp32"), ("onnxruntime-cpu", "int8")], pairs
    assert "skipped torch-eager int8: not run on cpu" in out
    code, _, err = run(capsys, "bench", str(ckpt), "--precision", "float8", "--batch", "1", "--no-roofline")
    assert_one_line_error(code, err, "no default backend", "runs float8 on cpu", "--backend")
    code, _, err = run(capsys, "bench", str(onnx_file), "--backend", "onnxruntime-gpuu")
    assert_one_line_error(code, err, "unknown backend", "did you mean 'onnxruntime-cpu'")
    code, _, err = run(capsys, "export", "cifar_resnt8")
    assert_one_line_error(code, err, "did you mean")


# A child that sends itself SIGTERM as the command starts importing torch.nn (torch is then
# half-loaded), as a scheduler's stop may arrive while a command is still starting up.
STOP_WHILE_IMPORTING = """
import os, signal, sys
class StopAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == "torch.nn":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGTERM)
        return None
sys.meta_path.insert(0, StopAtImport())
from effvision.cli import main
sys.exit(main(["compress", "compress/default.yaml", "--run-dir", sys.argv[1]]))
"""


def test_sigterm_while_the_command_is_still_importing_is_one_line_and_143(tmp_path):
    import subprocess
    import sys

    assert "torch" not in json.loads(
        subprocess.run(
            [sys.executable, "-c", "import json, sys; import effvision.cli; print(json.dumps(list(sys.modules)))"],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
    )  # (else the stop below would not land inside torch's import)
    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-c", STOP_WHILE_IMPORTING, str(tmp_path / "run")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=repo)
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert done.returncode == 143 and lines == ["effvision: interrupted by SIGTERM"], done.stderr
