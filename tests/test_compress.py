"""Quantization on a small trained model: every calibration method gives a faithful int8 QDQ file."""

import numpy as np
import onnx
import pytest
import torch

from effvision.data import load_dataset
from effvision.deploy import export_onnx
from effvision.errors import EffvisionError
from effvision.models import create_model
from effvision.recipe import DataConfig
from effvision.runtimes.onnx_files import onnx_predictor
from effvision.runtimes.onnx_int8 import cpu_has_vnni, quantize_onnx
from effvision.train import TrainSettings, fit


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    data = load_dataset(DataConfig(name="digits", max_train_samples=400, max_val_samples=120, batch_size=32))
    model = create_model("cifar_resnet8", width=0.5)
    fit(model, data, TrainSettings(epochs=4, optimizer="adamw", lr=3e-3), torch.device("cpu"))
    path = export_onnx(model, tmp_path_factory.mktemp("q") / "fp32.onnx")
    return data, path


def _predictions(path, loader):
    predict = onnx_predictor(path)
    return np.concatenate([predict(x).argmax(1) for x, _ in loader])


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_calibration_methods(trained, method, tmp_path):
    data, fp32 = trained
    out = quantize_onnx(fp32, tmp_path / "int8.onnx", data.train_eval_loader(range(64), batch_size=16), method=method)
    ops = {n.op_type for n in onnx.load(str(out)).graph.node}
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    agree = (_predictions(out, data.val_loader()) == _predictions(fp32, data.val_loader())).mean()
    assert agree >= 0.85, f"{method}: int8 agrees with fp32 on only {agree:.2f} of samples"


def _int8_weights(path) -> tuple[int, int]:
    """The smallest and largest value stored in the file's int8 initializers (its quantized weights)."""
    from onnx import numpy_helper

    model = onnx.load(str(path))
    values = [numpy_helper.to_array(t) for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert values, f"{path}: no int8 initializers"
    return min(int(v.min()) for v in values), max(int(v.max()) for v in values)


def test_reduce_range_stores_7_bit_weights_and_auto_follows_the_cpu(trained, tmp_path):
    from effvision.runtimes.onnx_int8 import resolve_reduce_range

    data, fp32 = trained
    assert isinstance(cpu_has_vnni(), bool) and resolve_reduce_range("auto") == (not cpu_has_vnni())
    calib = data.train_eval_loader(range(32))
    span = {
        rr: _int8_weights(quantize_onnx(fp32, tmp_path / f"q{rr}.onnx", calib, reduce_range=rr)) for rr in (True, False)
    }
    # reduce_range: 7-bit weights (ONNX Runtime's symmetric reduced range is [-64, 64]: two u8 x s8
    # products then sum within int16, 2 x 255 x 64 < 32767); without it the full int8 range, each
    # channel's largest weight at +-127
    assert -64 <= span[True][0] and span[True][1] <= 64, span
    assert span[False][0] <= -120 and span[False][1] >= 120, span
    # the default ("auto") stores what this CPU's choice says
    auto = _int8_weights(quantize_onnx(fp32, tmp_path / "auto.onnx", calib))
    assert auto == span[resolve_reduce_range("auto")], (auto, span)


def test_unknown_calibration_method(trained, tmp_path):
    data, fp32 = trained
    with pytest.raises(EffvisionError, match="unknown calibration method"):
        quantize_onnx(fp32, tmp_path / "x.onnx", data.train_eval_loader(range(8)), method="kl")
