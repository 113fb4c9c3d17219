"""The shipped demo recipe meets its promises (the figures `make demo` prints)."""

import pytest

from effvision.pipeline import run_pipeline
from effvision.recipe import load_recipe


@pytest.mark.slow  # 2-2.5 min on 2 cores, the heaviest test: `make bench` runs it, `make demo` is the same recipe
def test_default_recipe_meets_acceptance(tmp_path):
    report = run_pipeline(load_recipe("compress/default.yaml"), tmp_path / "demo")
    st = {s["name"]: s for s in report["stages"]}
    base, fp32, int8 = st["baseline"], st["export"], st["quantize"]
    assert base["accuracy"] >= 0.95
    assert int8["evaluated_with"] == "onnxruntime" and int8["accuracy"] >= base["accuracy"] - 0.02
    assert int8["macs"] <= 0.5 * base["macs"]
    assert base["time_to_accuracy_s"] is not None
    assert report["artifacts"]["onnx"].endswith("quantize/model.onnx")
    # int8 ships only where it measured faster than the fp32 file at the batch the model ships at:
    # the demo sets no target.batch, so batch 1, and the report says so
    check = int8["speed_check"]
    assert check["batches"] == [1] and int8["decision"].startswith(f"ships {int8['shipped']}")
    assert int8["decided_at"] == {
        "batches": [1],
        "why": "batch 1, where the model ships (the recipe sets no target.batch)",
    }
    faster = check["p50_ms"]["int8"]["1"] < check["p50_ms"]["fp32"]["1"]
    assert int8["shipped"] == ("int8" if faster else "fp32")
    if int8["shipped"] == "int8":
        assert int8["size_bytes"] <= 0.35 * fp32["size_bytes"]
    # the shipped file against the uncompressed model, both in ONNX Runtime, timed interleaved
    head = report["headline"]
    assert head["backend"] == report["reference"]["backend"] == "onnxruntime-cpu"
    assert min(head["speedups"].values()) > 1.0 and head["accuracy_delta"] >= -0.02
