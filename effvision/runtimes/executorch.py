"""ExecuTorch `.pte` programs lowered to the XNNPACK backend (mobile and edge CPUs), fp32 or
int8 (PT2E with XNNPACK's symmetric per-channel quantizer), and a runner for them.

ExecuTorch is an optional extra (`pip install 'effvision[edge]'`); without it, or when its
build does not match the installed torch, the export says why instead of failing obscurely."""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path
from typing import Iterable

import numpy as np
import torch
from torch import nn

from ..errors import EffvisionError
from ..fileio import atomic_write
from ..registry import RUNTIMES
from .base import Runtime, Session, Target
from .onnx_files import describe_export_failure, refuse_unexportable


def executorch_missing() -> str | None:
    """Why ExecuTorch cannot be used here, or None when it can."""
    try:
        from executorch.exir import to_edge_transform_and_lower  # noqa: F401
        from executorch.runtime import Runtime  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (ImportError, or an ABI mismatch with this torch)
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return f"ExecuTorch is not usable with torch {torch.__version__}: {first} (pip install 'effvision[edge]')"
    return None


def _require() -> None:
    reason = executorch_missing()
    if reason:
        raise EffvisionError(reason)


def export_pte(
    model: nn.Module,
    path: str | Path,
    shape: list[int],
    precision: str = "fp32",
    calibration: Iterable[torch.Tensor] = (),
    batch: int = 1,
) -> Path:
    """Export, (quantize,) lower to XNNPACK and write one .pte for a fixed batch size (what an
    edge app runs; ExecuTorch's bounded dynamic batch did not hold beyond small sizes here)."""
    _require()
    refuse_unexportable(model, "ExecuTorch")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    model = model.eval().cpu()
    example = (torch.zeros(batch, *shape),)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad():
            warnings.simplefilter("ignore")
            if precision == "int8":
                model = _quantize_xnnpack(model, example, calibration)
            program = torch.export.export(model, example)
            buffer = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
    except EffvisionError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise EffvisionError(f"ExecuTorch export failed: {describe_export_failure(exc)}") from exc
    return atomic_write(path, lambda tmp: Path(tmp).write_bytes(buffer))


def _quantize_xnnpack(model: nn.Module, example: tuple, calibration: Iterable[torch.Tensor]) -> nn.Module:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
    prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
    batch, seen = len(example[0]), 0
    for x in calibration:
        for chunk in _chunks(x, batch):
            prepared(chunk)
            seen += len(chunk)
    if not seen:
        raise EffvisionError("int8 ExecuTorch export needs calibration samples")
    return convert_pt2e(prepared)


def _chunks(x: torch.Tensor, batch: int):
    """x cut into batches of exactly `batch` samples, the last one padded by repetition."""
    for i in range(0, len(x), batch):
        part = x[i : i + batch]
        if len(part) < batch:
            part = torch.cat([part, part[-1:].expand(batch - len(part), *part.shape[1:])])
        yield part


def _method(path: str | Path):
    _require()
    from executorch.runtime import Runtime

    if not Path(path).is_file():
        raise EffvisionError(f"ExecuTorch program not found: {path}")
    try:
        return Runtime.get().load_program(str(path)).load_method("forward")
    except Exception as exc:  # noqa: BLE001
        raise EffvisionError(f"cannot load {path} in ExecuTorch: {(str(exc).splitlines() or [''])[0]}") from None


def pte_input_shape(path: str | Path) -> list[int]:
    """The program's input shape, batch included (programs are exported for one batch size)."""
    return list(_method(path).metadata.input_tensor_meta(0).sizes())


def pte_predictor(path: str | Path, exact: bool = False):
    """A callable running the program's forward -> numpy logits. Any number of samples is run
    in the program's batch size (the last chunk padded) unless `exact` (benchmarks)."""
    method = _method(path)
    batch = method.metadata.input_tensor_meta(0).sizes()[0]

    def run(x) -> np.ndarray:
        t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x.contiguous()
        if exact or len(t) == batch:
            return method.execute([t])[0].numpy()
        outs = [method.execute([c])[0].numpy() for c in _chunks(t, batch)]
        return np.concatenate(outs)[: len(t)]

    return run


@RUNTIMES.register("executorch")
class Executorch(Runtime):
    kind, suffix, format, describes, label = "pte", ".pte", "executorch", "an ExecuTorch program", "ExecuTorch program"
    rank, batch_rule = 1, "fixed"
    targets = (Target("executorch", {"cpu": ("fp32", "int8")}),)  # lowered to XNNPACK
    precisions = ("fp32", "int8")
    packages = ("executorch",)
    int8_tool = "PT2E with XNNPACK's quantizer"

    def missing(self, purpose="run", device="cpu"):
        return executorch_missing()

    def export(self, model, path, shape, precision="fp32", calibration=(), batch=1):
        self.check_precision(precision)
        batches = (item[0] if isinstance(item, (tuple, list)) else item for item in calibration or ())
        return export_pte(model, path, shape, precision, batches, batch=batch)

    def quantize(self, src, dst, calibration, keep_float=(), **options):
        raise EffvisionError(
            f"an ExecuTorch program is made int8 from the model, at export ({self.int8_tool}), "
            f"not from {Path(src).name}: "
            "export with precision int8 instead of quantizing the .pte"
        )

    def open(self, path, device="cpu", threads=None, spinning=True):
        # any number of samples runs in the program's batch (the last chunk padded)
        return Session(pte_predictor(path), {"program_batch": pte_input_shape(path)[0]})

    def input_shape(self, path):
        return list(pte_input_shape(path))
