"""Put a torch model into a benchmark precision on a device.

fp32 / tf32 (CUDA matmul and cuDNN TF32 switches) / bf16 / fp16 (weights and inputs cast);
int8: on the CPU the PT2E flow with torchao's X86InductorQuantizer (static, per-channel, fast
only once compiled by inductor), on a GPU torchao's int8 dynamic quantization; float8: torchao's
float8 dynamic quantization (Hopper/Ada). torchao's GPU configs replace nn.Linear weights; the
result says how many layers were quantized so a mostly-convolutional model is not mistaken for
an int8 one."""

from __future__ import annotations

import contextlib
import copy
from typing import Iterable

import torch
from torch import nn

from ..errors import EffvisionError

HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


def input_dtype(precision: str, device: torch.device) -> torch.dtype:
    """Inputs are cast like the weights for bf16/fp16; quantized GPU models take bf16."""
    if precision in HALF:
        return HALF[precision]
    if device.type == "cuda" and precision in ("int8", "float8"):
        return torch.bfloat16
    return torch.float32


@contextlib.contextmanager
def math_mode(precision: str):
    """TF32 on for `tf32`, off otherwise (so `fp32` means true fp32 on Ampere and later)."""
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _count_quantized(model: nn.Module) -> int:
    """Layers whose weight torchao swapped for a quantized tensor subclass."""
    return sum(
        1
        for m in model.modules()
        if isinstance(getattr(m, "weight", None), torch.Tensor) and type(m.weight) not in (torch.Tensor, nn.Parameter)
    )


def pt2e_int8_cpu(model: nn.Module, example: torch.Tensor, calibration: Iterable[torch.Tensor]) -> nn.Module:
    """Static int8 for inductor on x86: export, insert observers, calibrate, convert."""
    try:
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    except ImportError as exc:
        raise EffvisionError(f"int8 for torch on the CPU needs torchao (pip install torchao): {exc}") from None
    quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
    example = torch.zeros(2, *example.shape[1:])  # batch 2: a batch of 1 would be specialised
    batch = ({0: torch.export.Dim("batch", min=1, max=4096)},)
    with torch.no_grad():
        try:
            prepared = prepare_pt2e(torch.export.export(model, (example,), dynamic_shapes=batch).module(), quantizer)
        except Exception as exc:  # noqa: BLE001  (the quantizer rejects some graph patterns)
            first = (str(exc).splitlines() or [type(exc).__name__])[0]
            raise EffvisionError(
                f"pt2e int8 (X86InductorQuantizer) cannot quantize this model: {type(exc).__name__}: {first}"
            ) from exc
        seen = 0
        for x in calibration:
            prepared(x)
            seen += len(x)
        if not seen:
            prepared(torch.randn_like(example))  # speed-only runs: ranges from random inputs
        return convert_pt2e(prepared)


def torchao_gpu(model: nn.Module, precision: str) -> tuple[nn.Module, int]:
    try:
        import torchao.quantization as tq
        from torchao.quantization import quantize_
    except ImportError as exc:
        raise EffvisionError(f"{precision} on a GPU needs torchao: {exc}") from None
    # set_inductor_config=False: torchao would otherwise change inductor's global settings (coordinate
    # descent tuning and more) for every later torch.compile in the process, default rows included
    config = (
        tq.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
        if precision == "int8"
        else tq.Float8DynamicActivationFloat8WeightConfig(set_inductor_config=False)
    )
    with _inductor_settings_kept():
        quantize_(model, config)
    return model, _count_quantized(model)


@contextlib.contextmanager
def _inductor_settings_kept():
    """Undo what a call changed in inductor's global settings: besides the settings torchao's configs
    opt out of, a module it imports on first use can set one as it loads (x86_inductor_quantizer sets
    pre_grad_custom_pass), which depends on what the process imported earlier and on the CPU."""
    import torch._inductor.config as inductor_config

    before = inductor_config.get_config_copy()
    try:
        yield
    finally:
        after = inductor_config.get_config_copy()
        for key in [k for k, v in after.items() if k in before and before[k] != v]:
            setattr(inductor_config, key, before[key])


def prepare_model(
    model: nn.Module,
    precision: str,
    device: torch.device,
    example: torch.Tensor,
    calibration: Iterable[torch.Tensor] = (),
    channels_last: bool = False,
) -> tuple[nn.Module, dict]:
    """A copy of `model` ready to run in `precision` on `device`, and notes for the result."""
    model = copy.deepcopy(model).eval().to(device)
    notes: dict = {}
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    if precision in HALF:
        model = model.to(HALF[precision])
    elif precision == "int8" and device.type == "cpu":
        model = pt2e_int8_cpu(model, example, calibration)
        notes["quantization"] = "pt2e X86InductorQuantizer static int8"
    elif precision in ("int8", "float8"):
        model, n = torchao_gpu(model.to(torch.bfloat16), precision)
        notes.update(quantization=f"torchao {precision} dynamic", quantized_layers=n)
    return model, notes
