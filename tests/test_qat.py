"""Quantization-aware training: the simulated model and its int8 ONNX file agree, ranges move only
while training, and what QAT cannot do ends in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from conftest import write_image_folder
from torch import nn

from effvision.cli import main
from effvision.compression.qat import prepare_qat
from effvision.errors import EffvisionError
from effvision.runtimes.onnx_files import onnx_predictor

SHAPE = [3, 16, 16]


class Net(nn.Module):
    """Conv (+ batch norm) + ReLU twice, a residual add, and one ReLU module called at three places
    (the stock x86 annotation rejects a module reused like this)."""

    def __init__(self, op=None, bn: bool = False):
        super().__init__()
        norm = nn.BatchNorm2d if bn else lambda c: nn.Identity()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1), norm(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1, groups=4), norm(16)
        self.act = nn.ReLU()
        self.fc = nn.Linear(16, 10)
        self.op = op

    def forward(self, x):
        y = self.act(self.bn1(self.conv1(x)))
        y = self.act(self.bn2(self.conv2(y)) + y)
        y = self.act(y).mean((2, 3))
        return self.fc(self.op(y) if self.op else y)


def _batches(n: int, seed: int, size: int = 32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(size, *SHAPE, generator=g) for _ in range(n)]


def _trained_float(bn: bool) -> Net:
    torch.manual_seed(0)
    net = Net(bn=bn).train()
    with torch.no_grad():  # a channel whose weights are all negative (stock QAT gave it a zero-point)
        net.conv1.weight[0] = -net.conv1.weight[0].abs()
    with torch.no_grad():
        for x in _batches(4, 1):  # batch-norm statistics of the data
            net(x)
    return net.eval()


# Batch norm is folded before fake quantization, so both cases are quick; the case with batch norm
# (the fold, then the folded bias rounded as ONNX Runtime rounds it) runs in `make test`.
@pytest.mark.parametrize("bn", [True, pytest.param(False, marks=pytest.mark.slow)])
def test_qat_simulation_and_its_onnx_file_agree(tmp_path, bn):
    net = _trained_float(bn)
    qat = prepare_qat(net, torch.zeros(2, *SHAPE), reduce_range=True)
    assert qat.calibrate([(x,) for x in _batches(2, 2)], "cpu") == 64
    teacher = _trained_float(bn)
    opt = torch.optim.SGD(qat.parameters(), lr=0.01, momentum=0.9)
    qat.train()
    for x in _batches(6, 3):  # a short distillation from the float net, as the qat stage does
        loss = nn.functional.mse_loss(qat(x), teacher(x).detach())
        opt.zero_grad()
        loss.backward()
        opt.step()
    qat.eval()
    val = torch.cat(_batches(8, 4))
    with torch.no_grad():
        simulated = qat(val).numpy()
        again = qat(val).numpy()
    assert np.array_equal(simulated, again)  # evaluating moves no range
    path = qat.export_onnx(torch.zeros(2, *SHAPE), tmp_path / "int8.onnx")
    in_file = onnx_predictor(path)(val.numpy())
    agreement = (simulated.argmax(1) == in_file.argmax(1)).mean()
    assert agreement >= 0.99, agreement
    # The file computes what the simulation computes, int32 biases included: logits match to float
    # rounding (0-0.4% of them differ by more, where a float sum lands on the other side of a
    # rounding step); without simulating the bias rounding, 14% do (and top-1 on deep nets ~1%).
    differ = np.abs(simulated - in_file) > 1e-5 * np.abs(simulated).max()
    assert differ.mean() < 0.02, differ.mean()
    graph = onnx.load(str(path)).graph
    ops = {n.op_type for n in graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    int8 = [i for i in graph.initializer if i.data_type == onnx.TensorProto.INT8]
    assert int8 and all(np.abs(onnx.numpy_helper.to_array(i)).max() <= 64 for i in int8)  # 7-bit weights
    with torch.no_grad():
        float_out = net(val).numpy()
    assert (float_out.argmax(1) == in_file.argmax(1)).mean() > 0.8  # still the net it was


def test_an_operator_int8_onnx_cannot_express_is_one_line(tmp_path):
    qat = prepare_qat(Net(op=lambda y: torch.cummax(y, 1)[0]).eval(), torch.zeros(2, *SHAPE), reduce_range=True)
    with pytest.raises(EffvisionError, match="aten.cummax") as err:
        qat.export_onnx(torch.zeros(2, *SHAPE), tmp_path / "int8.onnx")
    assert "\n" not in str(err.value) and not (tmp_path / "int8.onnx").exists()


def test_qat_with_no_training_sample_to_calibrate_is_one_line(tmp_path, capsys):
    data = tmp_path / "data"
    write_image_folder(data / "train", per_class=3, size=16)
    write_image_folder(data / "val", per_class=3, size=16)
    recipe = tmp_path / "qat.yaml"
    head = (
        f"name: qat-no-data\ndata: {{name: imagefolder, root: {data}, image_size: 16}}\n"
        "model: {name: cifar_resnet8, kwargs: {width: 0.25}}\nstages:\n  - {type: export}\n"
    )
    recipe.write_text(head)
    run = tmp_path / "run"
    assert main(["compress", str(recipe), "--run-dir", str(run)]) == 0
    exported = (run / "stages" / "1-export" / "model.onnx").read_bytes()
    for image in (data / "train").rglob("*.png"):  # now no training image can be read
        image.write_bytes(b"not a png")
    recipe.write_text(head + "  - {type: qat, epochs: 1, require_faster: false}\n")
    capsys.readouterr()
    code = main(["compress", str(recipe), "--run-dir", str(run)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "unreadable" in err and "train" in err, err
    assert (run / "stages" / "1-export" / "model.onnx").read_bytes() == exported  # nothing lost


@pytest.mark.slow
def test_qat_stage_trains_in_the_one_loop_and_records_parity(tmp_path):
    from conftest import tiny_recipe

    from effvision.pipeline import run_pipeline
    from effvision.stages import validate_recipe

    stages = [
        {"name": "baseline", "type": "train", "epochs": 2, "optimizer": "adamw", "lr": 3e-3},
        {"type": "export"},
        {"type": "qat", "epochs": 1, "calibration": {"n": 64}, "require_faster": False},
    ]
    report = run_pipeline(validate_recipe(tiny_recipe(stages=stages)), tmp_path)
    qat = report["stages"][-1]
    assert qat["type"] == "qat" and qat["shipped"] == "int8" and qat["evaluated_with"] == "onnxruntime"
    assert qat["teacher"] == "input" and qat["calibration"]["samples"] == 64
    metrics = json.loads((tmp_path / "stages" / "3-qat" / "metrics.json").read_text())
    assert len(metrics["history"]) == 1  # trained, one epoch, in the one loop
    assert qat["parity"]["met"] and qat["parity"]["onnx_accuracy"] == qat["accuracy"]
    assert qat["int8_onnx_bytes"] < 0.6 * qat["fp32_onnx_bytes"]
    assert "parity: the int8 file agrees" in (tmp_path / "report.md").read_text()
