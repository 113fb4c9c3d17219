"""Quantization-aware training with torchao's PT2E flow, for ONNX Runtime.

torchao's PT2E QAT is the maintained implementation whose converted model exports to a QDQ ONNX
file (`torch.onnx.export(..., dynamo=True)`) that ONNX Runtime runs as int8: the model is
captured with torch.export, a quantizer marks what is quantized (X86InductorQuantizer: uint8
affine activations, int8 symmetric per-channel weights, conv (+ activation) fused as ONNX
Runtime fuses them), and fake-quantize modules simulate exactly that while training.
NNCF's ONNX export of QAT models goes through its own wrapper modules and Neural Compressor's
PyTorch QAT exports through TorchScript; PT2E is the one path torch itself maintains.

Changes to the stock x86 recipe, each for parity between the simulation and the file:
- batch norm is folded into its conv (running statistics) before fake quantization, and the
  folded bias is rounded to int32 at scale input x weight, as ONNX Runtime's integer convolution
  rounds it. Stock QAT simulates batch norm beside the conv and never forms that bias; the
  rounding it then misses flips an output step now and then, and through 50 quantized layers
  the file and the simulation disagreed on 1.1-1.4% of images.
- weights are fake-quantized by a plain FakeQuantize over the current weights. The stock QAT
  weight fake-quantizer (the fused moving-average kernel) computes zero-points that the
  converted model does not use (non-zero for a channel whose weights are all negative), so the
  simulated and converted models disagree.
- weights use a symmetric range, [-127, 127]: with -128 allowed, the simulation and the
  converted model round differently. Without VNNI, ONNX Runtime's u8 x s8 kernels can saturate
  16-bit sums: weights then use 7 bits ([-64, 64]), as `quantize`'s reduce_range does.

A module called at several places (timm's shared `self.act`) gets one partition per call site;
stock x86 annotation rejects it ("Input partition has more than one output node")."""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from ..errors import EffvisionError
from ..runtimes.onnx_files import describe_export_failure, refuse_unexportable

WEIGHT_RANGE = (-127, 127)
WEIGHT_RANGE_REDUCED = (-64, 64)
_BIASED = (
    torch.ops.aten.conv1d.default,
    torch.ops.aten.conv2d.default,
    torch.ops.aten.linear.default,
)


def _bias_qparams(obs_or_fqs):
    """int32 bias step = input scale x weight scale (per output channel), zero-point 0."""
    act, weight = obs_or_fqs
    weight_scale = weight.calculate_qparams()[0]
    return (act.calculate_qparams()[0] * weight_scale).float(), torch.zeros_like(weight_scale, dtype=torch.int32)


def _round_bias_as_onnxruntime(node) -> None:
    """Annotate a quantized conv/linear's bias as int32 derived from its input and weight."""
    from torchao.quantization.pt2e.quantizer import DerivedQuantizationSpec

    annotation = node.meta.get("quantization_annotation")
    if node.op != "call_function" or node.target not in _BIASED or annotation is None:
        return
    x, w, bias = (list(node.args) + [None])[:3]
    qspecs = annotation.input_qspec_map
    if bias is None or bias.op != "get_attr" or x not in qspecs or w not in qspecs:
        return
    qspecs[bias] = DerivedQuantizationSpec(
        derived_from=[(x, node), (w, node)],
        derive_qparams_fn=_bias_qparams,
        dtype=torch.int32,
        quant_min=-(2**31),
        quant_max=2**31 - 1,
        qscheme=torch.per_channel_symmetric,
        ch_axis=0,
    )


def _quantizer(reduce_range: bool):
    from torchao.quantization.pt2e.fake_quantize import FakeQuantize
    from torchao.quantization.pt2e.observer import MovingAveragePerChannelMinMaxObserver
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_, _fuse_linear_bn_

    class X86ForOnnxRuntime(X86InductorQuantizer):
        def transform_for_annotation(self, model):
            # torch.export names the k-th call of a module "<name>@k" in the stack's key only;
            # moving the suffix into the module path makes each call a partition of its own.
            for node in model.graph.nodes:
                stack = node.meta.get("nn_module_stack")
                if node.op == "call_function" and stack:
                    key, (path, cls) = list(stack.items())[-1]
                    call = re.search(r"@(\d+)$", key)
                    if call:
                        stack[key] = (f"{path}@{call.group(1)}", cls)
            _fuse_conv_bn_(model)  # running statistics, as the file has them
            _fuse_linear_bn_(model)
            return super().transform_for_annotation(model)

        def annotate(self, model):
            model = super().annotate(model)
            for node in model.graph.nodes:
                _round_bias_as_onnxruntime(node)
            return model

    config = get_default_x86_inductor_quantization_config(is_qat=True)
    weight_fq = FakeQuantize.with_args(
        observer=MovingAveragePerChannelMinMaxObserver, averaging_constant=1.0, eps=2**-12
    )  # averaging 1: the range of the weights as they are now
    low, high = WEIGHT_RANGE_REDUCED if reduce_range else WEIGHT_RANGE
    weight = dataclasses.replace(config.weight, observer_or_fake_quant_ctr=weight_fq, quant_min=low, quant_max=high)
    return X86ForOnnxRuntime().set_global(dataclasses.replace(config, weight=weight))


class QatModel(nn.Module):
    """A model prepared for QAT. train() and eval() do what they do on the float model (batch
    norm, dropout); observers update ranges only while training, so evaluating on validation
    data never moves a range."""

    def __init__(self, prepared: torch.fx.GraphModule):
        super().__init__()
        self.prepared = prepared

    def forward(self, x):
        return self.prepared(x)

    def train(self, mode: bool = True):
        from torchao.quantization.pt2e import (
            disable_observer,
            enable_observer,
            move_exported_model_to_eval,
            move_exported_model_to_train,
        )

        self.training = mode
        (move_exported_model_to_train if mode else move_exported_model_to_eval)(self.prepared)
        self.prepared.apply(enable_observer if mode else disable_observer)
        return self

    @torch.no_grad()
    def calibrate(self, loader, device) -> int:
        """Initialise every range from calibration samples (eval mode: batch norm untouched)."""
        from torchao.quantization.pt2e import enable_observer

        self.train(False)
        self.prepared.apply(enable_observer)
        seen = 0
        with warnings.catch_warnings():
            # On the first batch a bias's step is read before its weight's observer has run.
            warnings.filterwarnings("ignore", message="must run observer")
            for x, *_ in loader:
                self.prepared(x.to(device))
                seen += len(x)
        self.train(False)
        if not seen:
            raise EffvisionError("qat: no calibration samples (the training split is empty)")
        return seen

    def export_onnx(self, example: torch.Tensor, path: Path) -> Path:
        """Convert to the reference int8 model (quantize and dequantize nodes) and write it with the
        project's ONNX export (QDQ, dynamic batch). Converting changes this model in place: call
        it last."""
        from torchao.quantization.pt2e import allow_exported_model_train_eval
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

        from ..runtimes.onnx_files import export_onnx

        self.train(False)
        converted = convert_pt2e(self.prepared)
        allow_exported_model_train_eval(converted)  # export_onnx calls eval()
        return export_onnx(converted, path, list(example.shape[1:]))


def _round_biases(prepared: torch.fx.GraphModule) -> None:
    """torchao's derived (bias) observer passes the bias through unchanged; ours rounds it, with
    a straight-through gradient, so training and evaluation see the bias the file holds."""
    from torchao.quantization.pt2e import DerivedObserverOrFakeQuantize

    class RoundedBias(DerivedObserverOrFakeQuantize):
        def forward(self, bias):
            step = self.calculate_qparams()[0].to(bias.dtype)
            return bias + (torch.round(bias / step) * step - bias).detach()

    for module in prepared.modules():
        if type(module) is DerivedObserverOrFakeQuantize:
            module.__class__ = RoundedBias


def prepare_qat(model: nn.Module, example: torch.Tensor, reduce_range: bool) -> QatModel:
    """Capture the float model (dynamic batch) and insert fake quantization."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    refuse_unexportable(model, "int8 ONNX")
    model = model.train()  # captured in train mode: dropout, and a batch norm no conv absorbs, train
    try:
        captured = torch.export.export(
            model, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},), strict=False
        ).module()
    except Exception as err:
        raise EffvisionError(f"qat: torch.export cannot capture the model: {describe_export_failure(err)}") from None
    finally:
        model.eval()
    try:
        prepared = prepare_qat_pt2e(captured, _quantizer(reduce_range))
    except Exception as err:
        raise EffvisionError(f"qat: the model cannot be prepared for int8: {describe_export_failure(err)}") from None
    _round_biases(prepared)
    return QatModel(prepared).train(False)
