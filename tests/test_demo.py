"""The shipped demo recipe meets its promises (the figures `make demo` prints)."""

from effvision.pipeline import run_pipeline
from effvision.recipe import load_recipe


def test_default_recipe_meets_acceptance(tmp_path):
    report = run_pipeline(load_recipe("compress/default.yaml"), tmp_path / "demo")
    st = {s["name"]: s for s in report["stages"]}
    base, fp32, int8 = st["baseline"], st["export"], st["quantize"]
    assert base["accuracy"] >= 0.95
    assert int8["evaluated_with"] == "onnxruntime" and int8["accuracy"] >= base["accuracy"] - 0.02
    assert int8["macs"] <= 0.5 * base["macs"]
    assert int8["size_bytes"] <= 0.35 * fp32["size_bytes"]
    assert base["time_to_accuracy_s"] is not None
    assert report["artifacts"]["onnx"].endswith("quantize/model.onnx")
