"""The stage runner end to end on a tiny recipe: report fields, measured artifacts, resume."""

import json

import onnx
import pytest
import yaml
from conftest import tiny_recipe

from effvision.pipeline import run_pipeline
from effvision.recipe import validate_recipe
from effvision.report_fields import undescribed

REPORT_STAGE_FIELDS = {
    "name",
    "type",
    "params",
    "macs",
    "size_bytes",
    "accuracy",
    "evaluated_with",
    "latency_ms",
    "throughput",
    "wall_s",
    "time_to_accuracy_s",
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    raw = tiny_recipe()
    raw["stages"][-1]["reference"] = True  # the other tiny runs skip the reference's export to save time
    report = run_pipeline(validate_recipe(raw), run_dir)
    return run_dir, report


def test_run_folder_layout(tiny_run):
    run_dir, _ = tiny_run
    for f in ("recipe.yaml", "env.json", "report.json", "report.md", "report.html", "dataset.json"):
        assert (run_dir / f).is_file(), f
    names = sorted(p.name for p in (run_dir / "stages").iterdir())
    assert names == ["0-init", "1-baseline", "2-prune", "3-distill", "4-export", "5-quantize", "6-bench"]
    assert (run_dir / "stages/4-export/model.onnx").is_file() and (run_dir / "stages/5-quantize/model.onnx").is_file()
    assert yaml.safe_load((run_dir / "recipe.yaml").read_text())["stages"][1]["ratio"] == 0.5
    from effvision.models import load_checkpoint

    assert load_checkpoint(run_dir / "stages/3-distill/model.pt").effvision_spec["data"]["name"] == "digits"
    env = json.loads((run_dir / "env.json").read_text())
    assert env["torch"] and env["onnxruntime"] and env["cpu"]


def test_report_has_documented_fields(tiny_run):
    run_dir, report = tiny_run
    assert report == json.loads((run_dir / "report.json").read_text())
    assert report["dataset"] == {
        "name": "digits",
        "modality": "image",
        "train_size": 400,
        "val_size": 120,
        "num_classes": 10,
        "bad_samples": 0,
        "decision": None,  # no stage of the tiny recipe decides: nothing held out
    }
    for s in report["stages"]:
        assert REPORT_STAGE_FIELDS <= set(s), s["name"]
    assert report["artifacts"]["onnx"] == "stages/5-quantize/model.onnx"
    assert {"torch", "onnxruntime", "cpu", "gpu"} <= set(report["env"])


def test_each_stage_is_measured(tiny_run):
    _, report = tiny_run
    st = {s["name"]: s for s in report["stages"]}
    assert st["baseline"]["time_to_accuracy_s"] is not None  # target 0.12 is reachable
    assert st["prune"]["macs"] < 0.5 * st["baseline"]["macs"] and st["prune"]["params"] < st["baseline"]["params"]
    assert st["distill"]["teacher"] == "stages/1-baseline/model.pt"
    assert st["export"]["evaluated_with"] == "onnxruntime" and st["export"]["parity"]["max_abs_diff"] < 1e-3
    assert st["export"]["parity"]["top1_agreement"] == 1.0
    assert st["quantize"]["evaluated_with"] == "onnxruntime"
    assert st["quantize"]["size_bytes"] < st["export"]["size_bytes"]  # a 5k-param net: graph overhead dominates
    for name in ("baseline", "distill", "export", "quantize"):
        lat = st[name]["latency_ms"]
        assert lat and lat["p50"] > 0 and lat["p50"] <= lat["p90"] <= lat["p99"]
        assert st[name]["throughput"]["samples_per_s"] > 0
    assert st["bench"]["latency_ms"]["backend"] == "onnxruntime-cpu" and st["bench"]["artifact_of"] == "quantize"


def test_reference_row_and_headline_on_one_backend(tiny_run):
    """The uncompressed model (the baseline, entering prune) exported to fp32 ONNX, scored on the
    same validation split and timed interleaved with the final file; the headline is their ratio."""
    run_dir, report = tiny_run
    ref, head = report["reference"], report["headline"]
    st = {s["name"]: s for s in report["stages"]}
    assert ref["what"] == "uncompressed model, fp32 ONNX" and ref["stage"] == "input of prune"
    assert ref["backend"] == head["backend"] == "onnxruntime-cpu" and "interleaved" in ref["timed"]
    assert abs(ref["accuracy"] - st["baseline"]["accuracy"]) <= 1 / 120 + 1e-9  # same model, other runtime
    assert ref["size_bytes"] == (run_dir / "stages/6-bench/reference.onnx").stat().st_size
    assert head["final"] == "quantize" and head["batch"] == 1 and set(head["speedups"]) == {"1", "8"}
    for b in ("1", "8"):
        ratio = head["reference_p50_ms"][b] / head["final_p50_ms"][b]  # kept to 3 decimals: abs for ratios < 1
        assert head["speedups"][b] == pytest.approx(ratio, rel=2e-3, abs=6e-4)
    assert head["speedup"] == head["speedups"]["1"] and ref["latency_ms"]["p50"] == head["reference_p50_ms"]["1"]
    assert head["size_ratio"] == pytest.approx(st["quantize"]["size_bytes"] / ref["size_bytes"], rel=1e-3)
    assert head["accuracy_delta"] == pytest.approx(st["quantize"]["accuracy"] - ref["accuracy"], abs=1e-6)
    md = (run_dir / "report.md").read_text()
    assert "**Headline**: `quantize` against the uncompressed model, fp32 ONNX" in md
    # which data path each training stage took, and how fast it trained
    assert st["baseline"]["data"]["path"] == "batched, in memory" and st["baseline"]["data"]["train_samples_per_s"] > 0
    assert "Training data: baseline batched, in memory, " in md and "distill batched, in memory" in md
    from effvision.report_plots import pareto_points

    pts = {p["name"]: p for p in pareto_points(report)}  # latencies from onnxruntime-cpu only
    assert pts["reference"]["latency"] == ref["latency_ms"]["p50"] and pts["export"]["latency"] is not None
    assert pts["baseline"]["latency"] is None and pts["distill"]["latency"] is None  # eager: table only


def test_int8_onnx_is_qdq_with_uint8_activations_and_int8_weights(tiny_run):
    run_dir, _ = tiny_run
    model = onnx.load(str(run_dir / "stages/5-quantize/model.onnx"))
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    zero_points = {i.name: i.data_type for i in model.graph.initializer if i.name.endswith("zero_point")}
    assert onnx.TensorProto.UINT8 in zero_points.values() and onnx.TensorProto.INT8 in zero_points.values()


def test_report_md_and_html_show_every_stage(tiny_run):
    run_dir, report = tiny_run
    md, page = (run_dir / "report.md").read_text(), (run_dir / "report.html").read_text()
    for s in report["stages"]:
        assert f"| {s['name']} |" in md and s["name"] in page
    assert "<svg" in page
    # offline pictures: the Pareto plot and the bench stage's sweep plot, both inline PNGs
    assert page.count('src="data:image/png;base64,') == 2 and "Pareto" in page
    assert (run_dir / "stages/6-bench/bench.png").is_file() and "stages/6-bench/bench.png" in md
    bench = next(s for s in report["stages"] if s["type"] == "bench")
    assert bench["roofline"]["matmul_flops_per_s"]["fp32"] > 0 and bench["roofline"]["copy_bytes_per_s"] > 0


def test_pareto_front_marks_the_undominated_stages():
    from effvision.report_plots import pareto_points

    report = {
        "stages": [
            {"name": "a", "type": "train", "accuracy": 0.9, "latency_ms": {"p50": 10.0}, "size_bytes": 100},
            {"name": "b", "type": "export", "accuracy": 0.8, "latency_ms": {"p50": 2.0}, "size_bytes": 300},
            {"name": "c", "type": "quantize", "accuracy": 0.7, "latency_ms": {"p50": 5.0}, "size_bytes": 50},
            {"name": "bench", "type": "bench", "accuracy": 0.7, "latency_ms": {"p50": 1.0}},
        ]
    }
    pts = {p["name"]: p for p in pareto_points(report)}
    assert set(pts) == {"a", "b", "c"}
    assert (pts["a"]["front_latency"], pts["b"]["front_latency"], pts["c"]["front_latency"]) == (True, True, False)
    assert (pts["a"]["front_size"], pts["b"]["front_size"], pts["c"]["front_size"]) == (True, False, True)


def test_resume_skips_completed_stages(tmp_path):
    raw = tiny_recipe(stages=tiny_recipe()["stages"][:4])
    run_pipeline(validate_recipe(raw), tmp_path)

    def stamp(name):
        return (tmp_path / "stages" / name / "metrics.json").stat().st_mtime_ns

    before = {n: stamp(n) for n in ("0-init", "1-baseline", "2-prune", "3-distill")}
    exported = stamp("4-export")
    (tmp_path / "stages/4-export/model.onnx").unlink()  # a marker without its artifact is not a finished stage
    (tmp_path / "stages/3-distill/.model.pt.x.tmp").write_bytes(b"half")  # what a killed atomic write leaves
    report = run_pipeline(validate_recipe(raw), tmp_path)
    assert {n: stamp(n) for n in before} == before
    assert stamp("4-export") != exported and (tmp_path / "stages/4-export/model.onnx").is_file()
    assert not list(tmp_path.rglob("*.tmp"))
    assert [s["name"] for s in report["stages"]] == ["baseline", "prune", "distill", "export"]


def test_changed_stage_config_reruns_it_and_later_stages(tmp_path):
    raw = tiny_recipe(stages=tiny_recipe()["stages"][:3])
    run_pipeline(validate_recipe(raw), tmp_path)
    t_base = (tmp_path / "stages/1-baseline/metrics.json").stat().st_mtime_ns
    t_distill = (tmp_path / "stages/3-distill/metrics.json").stat().st_mtime_ns
    raw["stages"][1]["ratio"] = 0.3
    report = run_pipeline(validate_recipe(raw), tmp_path)
    assert (tmp_path / "stages/1-baseline/metrics.json").stat().st_mtime_ns == t_base
    assert (tmp_path / "stages/3-distill/metrics.json").stat().st_mtime_ns != t_distill
    assert report["stages"][1]["macs"] > 0


def test_busy_run_folder_is_refused_and_freed_after(tmp_path, capsys):
    from effvision.cli import main
    from effvision.errors import EffvisionError
    from effvision.runlock import run_lock

    with run_lock(tmp_path):
        with pytest.raises(EffvisionError, match=r"run folder .* is in use by another effvision run \(pid \d+ on "):
            run_pipeline(validate_recipe(tiny_recipe(stages=[])), tmp_path)
        capsys.readouterr()
        assert main(["report", str(tmp_path)]) == 1 and "is in use" in capsys.readouterr().err
    assert not (tmp_path / "stages").exists()  # the refused run wrote nothing
    with run_lock(tmp_path):  # released by the holder
        pass


def test_every_artifact_says_its_classes_preprocessing_and_accuracy(tiny_run):
    """The exported and int8 files carry the run's preprocessing, classes and measured top-1,
    readable with onnxruntime alone; the checkpoints carry the same under `metadata`."""
    import onnxruntime as ort

    from effvision.data import load_dataset
    from effvision.models.checkpoint import read_checkpoint

    run_dir, report = tiny_run
    card = load_dataset("digits").card
    st = {s["name"]: s for s in report["stages"]}
    for stage, folder in (("export", "4-export"), ("quantize", "5-quantize")):
        session = ort.InferenceSession(str(run_dir / f"stages/{folder}/model.onnx"), providers=["CPUExecutionProvider"])
        meta = json.loads(session.get_modelmeta().custom_metadata_map["effvision"])
        p = meta["preprocessing"]
        assert (p["size"], p["mean"], p["std"], p["interpolation"]) == (32, card.mean, card.std, card.interpolation)
        assert meta["classes"] == [str(i) for i in range(10)] and meta["modality"] == "image"
        assert meta["input"]["shape"] == ["batch", 3, 32, 32] and meta["input"]["dynamic_axes"] == {"0": "batch"}
        assert meta["accuracy"]["top1"] == st[stage]["accuracy"] and meta["accuracy"]["runtime"] == "onnxruntime"
        assert meta["accuracy"]["samples"] == 120 and meta["source"]["recipe"] == "tiny"
        assert meta["source"]["stage"] == folder and meta["source"]["precision"] == (
            "int8" if stage == "quantize" else "fp32"
        )
    ckpt = read_checkpoint(run_dir / "stages/1-baseline/model.pt")["metadata"]
    assert ckpt["accuracy"]["top1"] == st["baseline"]["accuracy"] and ckpt["accuracy"]["runtime"] == "torch"
    assert ckpt["preprocessing"] == meta["preprocessing"]


def test_the_run_ends_with_a_bundle_of_the_shipped_file(tiny_run, tmp_path):
    """runs/<name>/bundle: the shipped file, model.json, predict.py (run here on digits saved as
    PNG files in class folders) and a README saying what the model expects."""
    import subprocess
    import sys

    from PIL import Image

    from effvision.data import load_dataset

    run_dir, report = tiny_run
    bundle = run_dir / "bundle"
    assert (bundle / "model.onnx").read_bytes() == (run_dir / report["artifacts"]["onnx"]).read_bytes()
    meta = json.loads((bundle / "model.json").read_text())
    assert meta["file"] == "model.onnx" and meta["source"]["stage"] == "5-quantize"
    assert "centre crop 32 px" in (bundle / "README.md").read_text()
    val = load_dataset("digits").val
    for i in range(20):
        img, label = val[i]
        (tmp_path / str(label)).mkdir(exist_ok=True)
        Image.fromarray(img.permute(1, 2, 0).numpy()).save(tmp_path / str(label) / f"{i}.png")
    out = subprocess.run(
        [sys.executable, str(bundle / "predict.py"), str(tmp_path), "--json", str(tmp_path / "p.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "p.json").read_text())
    assert len(result["predictions"]) == 20 and result["top1"] is not None


def test_every_field_the_run_writes_is_described(tiny_run):
    # effvision/report_fields.py is the schema the docs' report.json reference is generated from
    _, report = tiny_run
    assert not undescribed(report), (
        f"report.json fields not described in effvision/report_fields.py: {undescribed(report)}"
    )
