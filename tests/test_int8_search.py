"""Int8 that keeps its accuracy and pays: the sensitivity ranking reverts a planted broken layer,
require_faster ships the faster file and speed groups stay float when measured slower. Timing is
real (ONNX Runtime, interleaved); where a test needs one file slower, a sleep is added to its
runs, so the decision still comes from measured times."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from effvision.deploy import backends, export_onnx
from effvision.int8 import Floor, Int8Settings, Timing, make_int8
from effvision.int8.node_search import drop_slow_groups
from effvision.runtimes import runtime_named
from effvision.runtimes.onnx_files import onnx_predictor
from effvision.runtimes.onnx_int8 import Int8Builder

SHAPE = [3, 8, 8]
PLANT = 1000.0
MAX_DROP = 0.1  # this random net agrees with itself in int8 on ~94% of inputs; planted, on ~12%


class Net(nn.Module):
    """conv1's channel 0 is always zero, and conv2 weighs it by PLANT: harmless in float, but
    int8's per-channel weight scale (max |w| / 127) then rounds every other weight of conv2 to 0."""

    def __init__(self, plant: bool):
        super().__init__()
        torch.manual_seed(0)
        self.conv1, self.conv2, self.conv3 = (
            nn.Conv2d(3, 8, 3, padding=1),
            nn.Conv2d(8, 8, 3, padding=1),
            nn.Conv2d(8, 8, 3, padding=1),
        )
        self.fc = nn.Linear(32, 10)
        with torch.no_grad():
            self.conv1.bias[0] = -1000  # channel 0 dead after the ReLU (all-zero weights would give int8 a 0 scale)
            # Centre the logits on random inputs, so that predictions vary with the input.
            self.fc.bias -= self(torch.randn(256, *SHAPE, generator=torch.Generator().manual_seed(1))).mean(0)
            if plant:
                self.conv2.weight[:, 0] = PLANT

    def forward(self, x):
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        x = torch.relu(self.conv3(x))
        return self.fc(nn.functional.adaptive_avg_pool2d(x, 2).flatten(1))


def _files(tmp_path, plant: bool):
    fp32 = export_onnx(Net(plant).eval(), tmp_path / "fp32.onnx", SHAPE)
    calib = [(torch.randn(16, *SHAPE, generator=torch.Generator().manual_seed(i)), None) for i in range(4)]
    builder = Int8Builder(fp32, calib, tmp_path / "work", method="minmax")
    samples = torch.randn(256, *SHAPE, generator=torch.Generator().manual_seed(99)).numpy()
    labels = onnx_predictor(fp32)(samples).argmax(1)  # top-1 here: agreement with the fp32 file

    def top1(path) -> float:
        return float((onnx_predictor(path)(samples).argmax(1) == labels).mean())

    return fp32, builder, samples, top1, calib


def _made(healthy_or_planted, dst, timing=None, require_faster=False, max_drop=MAX_DROP):
    """The one int8 maker on ONNX Runtime over the test's file, scored by its top1."""
    fp32, _, _, top1, calib = healthy_or_planted
    settings = Int8Settings(method="minmax", speed_aware=False, require_faster=require_faster, rank_samples=64)
    floor = None if max_drop is None else Floor(max_drop)
    return make_int8(runtime_named("onnxruntime"), fp32, dst, calib, settings, top1, floor, timing)


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    """One exported, pre-processed and calibrated net shared by the tests (each writes its own files)."""
    return _files(tmp_path_factory.mktemp("healthy"), plant=False)


def _planted_node(builder: Int8Builder) -> str:
    model = onnx.load(str(builder.pre))
    huge = {i.name for i in model.graph.initializer if np.abs(onnx.numpy_helper.to_array(i)).max() >= PLANT / 2}
    return next(n.name for n in builder.nodes if n.op_type == "Conv" and huge & set(n.input[1:2]))


def test_one_reader_calibrates_two_passes_alike(healthy, tmp_path):
    """The builder's calibration reader rewinds: a second quantizer pass reads every sample again
    and writes the same file (a reader that cannot rewind leaves the second pass no samples)."""
    _, builder, _, _, _ = healthy
    reader = builder.reader
    reader.rewind()
    first = [reader.get_next() for _ in range(65)]
    reader.rewind()
    again = [reader.get_next() for _ in range(65)]
    assert first[-1] is None and all(a is not None for a in first[:-1])  # 4 batches of 16, one at a time
    assert all(np.array_equal(a["input"], b["input"]) for a, b in zip(first[:-1], again[:-1], strict=True))

    def scales(path):
        model = onnx.load(str(path))
        return {i.name: onnx.numpy_helper.to_array(i).tolist() for i in model.graph.initializer if "scale" in i.name}

    one, two = builder._quantize(tmp_path / "one.onnx"), builder._quantize(tmp_path / "two.onnx")
    assert scales(one) and scales(one) == scales(two)


def test_a_builder_named_by_relative_paths_works(healthy, tmp_path, monkeypatch):
    """Paths relative to the working directory (a run folder given as runs/x) are resolved before
    the pre-processing step changes directory."""
    shutil.copy(healthy[0], tmp_path / "fp32.onnx")
    monkeypatch.chdir(tmp_path)
    builder = Int8Builder(Path("fp32.onnx"), healthy[1].reader.loader, Path("rel/work"), method="minmax")
    assert (tmp_path / "rel/work/pre.onnx").is_file() and builder.write(Path("rel/int8.onnx")).is_file()


def test_sensitivity_ranking_reverts_the_planted_layer(tmp_path):
    planted_files = _files(tmp_path, plant=True)
    fp32, builder, samples, top1, _ = planted_files
    planted = _planted_node(builder)
    result = _made(planted_files, tmp_path / "model.onnx")
    search = result.accuracy_search
    assert search["int8_accuracy"] < 0.8  # the plant breaks plain int8
    assert search["ranking"][0]["layer"] == planted and search["ranking"][0]["decision"] == "reverted"
    assert search["ranking"][0]["sensitivity"] > 10 * max(r["sensitivity"] for r in search["ranking"][1:])
    assert search["met"] and result.float_nodes == {planted}  # one revert was enough: nothing else went float
    assert search["steps"] == [
        {"reverted": 1, "accuracy": pytest.approx(top1(result.path)), "drop": search["steps"][0]["drop"]}
    ]
    assert top1(result.path) >= 1 - MAX_DROP and result.shipped == "int8"
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in onnx.load(str(result.path)).graph.node}


def test_accuracy_search_leaves_a_healthy_model_alone(healthy, tmp_path):
    result = _made(healthy, tmp_path / "model.onnx")
    assert result.accuracy_search["met"] and result.accuracy_search["ranking"] == [] and not result.float_nodes


def _slow_runs(monkeypatch, is_slow):
    """Every ONNX Runtime session whose file is_slow(path) sleeps 3 ms per run."""
    load = backends.FileBackend.load

    def slowed(self, path, shape, opts):
        loaded = load(self, path, shape, opts)
        if is_slow(path):
            run = loaded.run
            loaded.run = lambda x: (time.sleep(0.003), run(x))[1]
        return loaded

    monkeypatch.setattr(backends.FileBackend, "load", slowed)


@pytest.mark.parametrize("slow", ["int8", "fp32"])
def test_require_faster_ships_the_faster_file(slow, healthy, tmp_path, monkeypatch):
    from effvision.runtimes.onnx_files import onnx_precision

    _slow_runs(monkeypatch, lambda path: onnx_precision(path) == slow)
    timing = Timing(SHAPE, [1, 4], warmup=1, repeats=8, rounds=4)
    result = _made(healthy, tmp_path / "model.onnx", timing, require_faster=True, max_drop=None)
    check = result.speed_check
    assert result.shipped == ("fp32" if slow == "int8" else "int8")
    assert onnx_precision(result.path) == result.shipped
    assert check["int8_slower_at"] == ([1, 4] if slow == "int8" else [])
    for b in (1, 4):  # both timings recorded, and the slowed file measured slower
        other = "fp32" if slow == "int8" else "int8"
        assert check["p50_ms"][slow][b] > check["p50_ms"][other][b] + 2.5
    assert ("not faster than fp32" in result.decision) == (slow == "int8")


def test_a_group_measured_slower_in_int8_stays_float(healthy, tmp_path, monkeypatch):
    fp32, builder, samples, _, _ = healthy

    def classifier_in_int8(path) -> bool:
        graph = onnx.load(str(path)).graph
        dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
        return any(n.op_type == "Gemm" and dequantized & set(n.input[:1]) for n in graph.node)

    _slow_runs(monkeypatch, classifier_in_int8)
    timing = Timing(SHAPE, [1], warmup=1, repeats=8, rounds=4)
    float_nodes, decisions = drop_slow_groups(builder, timing, tmp_path, set())
    by_group = {d["group"]: d["decision"] for d in decisions}
    assert by_group["classifier"] == "float"
    gemm = next(n.name for n in builder.nodes if n.op_type == "Gemm")
    assert gemm in float_nodes
    assert set(by_group) == {"stem conv", "classifier", "element-wise and pooling"}


def test_float_nodes_compute_in_float_in_onnx_runtime(tmp_path):
    """Every node kept float gives back the fp32 file's logits exactly (no quantize-dequantize
    left, the ReLUs the quantizer folded applied again, HardSwish's inlined unnamed nodes found
    by name); float layers read float weights, not dequantized ones."""
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.Hardswish(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    ).eval()
    fp32 = export_onnx(net, tmp_path / "fp32.onnx", SHAPE)
    calib = [(torch.randn(16, *SHAPE, generator=torch.Generator().manual_seed(0)), None)]
    builder = Int8Builder(fp32, calib, tmp_path / "work", method="minmax")
    x = torch.randn(32, *SHAPE, generator=torch.Generator().manual_seed(1)).numpy()
    ref = onnx_predictor(fp32)(x)
    every = builder.write(tmp_path / "all.onnx", [n.name for n in builder.nodes])
    assert np.abs(onnx_predictor(every)(x) - ref).max() < 1e-5
    assert not {"QuantizeLinear", "DequantizeLinear"} & {n.op_type for n in onnx.load(str(every)).graph.node}
    layers = onnx.load(str(builder.write(tmp_path / "layers.onnx", builder.layers))).graph
    dequantized = {o for n in layers.node if n.op_type == "DequantizeLinear" for o in n.output}
    weighted = [n for n in layers.node if n.name in builder.layers]
    assert len(weighted) == 3 and not any(dequantized & set(n.input[1:]) for n in weighted)
    assert np.abs(onnx_predictor(tmp_path / "layers.onnx")(x) - ref).max() > 0  # activations still int8
