"""The conformance run: one model through every stage the pipeline puts it through.

create -> forward (shape, finite) -> backward (every trainable parameter gets a gradient) ->
prune -> forward -> ONNX export -> ONNX Runtime parity -> int8 quantize -> int8 runs; then, given
other runtimes (OpenVINO, LiteRT, ExecuTorch), the pruned model as each one's fp32 file, judged the
same way (a runtime's failure is its own column, not the row's).
Parity is judged as the export stage judges it (deploy.exporters.parity_failure): the largest
difference relative to the logits' scale, and top-1 agreement, on real photographs where the
model takes images (scikit-learn ships two), random inputs elsewhere.
The zoo's test suite and `effvision zoo compat` (docs/compat.md) both run it, so a table row and a
test result mean the same thing.
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import one_line

STEPS = ("create", "forward", "backward", "prune", "pruned forward", "export", "parity", "int8")


class StepFailed(Exception):
    def __init__(self, step: str, reason: str):
        super().__init__(f"{step}: {reason}")
        self.step, self.reason = step, reason


@dataclass
class Conformance:
    name: str
    input_size: list[int]
    passed: list[str] = field(default_factory=list)
    failed_step: str | None = None
    reason: str | None = None
    params: int | None = None
    macs: int | None = None
    pruned_params: int | None = None
    pruned_macs: int | None = None
    parity_error: float | None = None  # max |onnx - torch| on the logits
    parity_relative: float | None = None  # the same over the largest |logit|
    parity_agreement: float | None = None  # top-1 agreement of the ONNX file with PyTorch
    seconds: float = 0.0
    cause: str | None = None  # for a failure: whose it is (upstream or effvision), when known
    runtimes: dict = field(default_factory=dict)  # runtime name -> its fp32 file's parity, or why it has none

    @property
    def ok(self) -> bool:
        return self.failed_step is None

    def as_dict(self) -> dict:
        return {**self.__dict__, "ok": self.ok}


def _announce(on_step, step: str) -> None:
    if on_step is not None:
        on_step(step)


def _check_output(out, batch: int, num_classes: int, step: str) -> None:
    if not isinstance(out, torch.Tensor):
        raise StepFailed(step, f"returned {type(out).__name__}, not a tensor of logits")
    if tuple(out.shape) != (batch, num_classes):
        raise StepFailed(step, f"output shape {tuple(out.shape)}, expected {(batch, num_classes)}")
    if not torch.isfinite(out).all():
        raise StepFailed(step, "output has NaN or Inf")


def real_images(input_size: list[int], n: int) -> torch.Tensor | None:
    """n real photographs as a model of `input_size` (3, H, W) takes them: square crops of the two
    that scikit-learn ships, resized, normalised with ImageNet's mean and std; None for other inputs."""
    if len(input_size) != 3 or input_size[0] != 3:
        return None
    from sklearn.datasets import load_sample_images

    photos = [torch.from_numpy(np.array(p)).permute(2, 0, 1).float() / 255 for p in load_sample_images().images]
    crops = []
    for i in range(n):  # squares at the left, centre and right of each photograph, in turn
        photo = photos[i % len(photos)]
        h, w = photo.shape[1:]
        side, where = min(h, w), (i // len(photos)) % 3
        top, left = (h - side) * where // 2, (w - side) * where // 2
        crops.append(photo[:, top : top + side, left : left + side])
    size = list(input_size[1:])
    batch = torch.stack([torch.nn.functional.interpolate(c[None], size=size, mode="bilinear")[0] for c in crops])
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    return (batch - mean[:, None, None]) / std[:, None, None]


def run_conformance(
    name: str,
    input_size: list[int],
    num_classes: int = 10,
    prune_ratio: float = 0.3,
    relative_tolerance: float | None = None,
    calibration_samples: int = 8,
    workdir: str | Path | None = None,
    on_step=None,
    runtimes=(),
    on_row=None,
    **model_kwargs,
) -> Conformance:
    """Run every step; stop at the first failure and record which step failed and why (one line).
    Parity: max |onnx - torch| <= relative_tolerance * max |torch| on the pruned model's logits
    (default the export stage's), and the same top-1 on every input. `on_step(name)` is called as
    each step starts (a supervisor that kills a stuck run reads it). `runtimes` (deploy.runtimes
    objects) each get the pruned model as their fp32 file, judged the same way, once the pruned
    model runs; `on_row(result)` is called before the first and after each (a row so far)."""
    from ..compression import prune
    from ..compression.quantize import quantize_onnx
    from ..deploy import export_onnx
    from ..deploy.exporters import FP32_RELATIVE_TOLERANCE, parity, parity_failure
    from ..deploy.runtime import ort_session, run_session
    from ..models.builder import create_model
    from ..models.profile import count_macs, count_params

    result = Conformance(name, list(input_size))
    start = time.perf_counter()
    torch.manual_seed(0)
    x = torch.randn(2, *input_size)
    tolerance = relative_tolerance or FP32_RELATIVE_TOLERANCE
    inputs = real_images(input_size, 6)
    batch = torch.cat([x, x, x]) if inputs is None else inputs  # a batch size other than the export's
    step = "create"
    _announce(on_step, step)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        try:
            model = create_model(name, num_classes=num_classes, input_size=list(input_size), **model_kwargs)
            result.params, result.macs = count_params(model), count_macs(model, list(input_size))
            result.passed.append(step)

            step = "forward"
            _announce(on_step, step)
            model.train()
            out = model(x)
            _check_output(out, 2, num_classes, step)
            if hasattr(model, "forward_features") and hasattr(model, "forward_head"):  # the model contract's two halves
                _check_output(model.forward_head(model.forward_features(x)), 2, num_classes, step)
            result.passed.append(step)

            step = "backward"
            _announce(on_step, step)
            out.float().pow(2).mean().backward()
            missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
            if missing:
                raise StepFailed(step, f"{len(missing)} parameters get no gradient (e.g. {missing[0]})")
            model.zero_grad(set_to_none=True)
            result.passed.append(step)

            step = "prune"
            _announce(on_step, step)
            prune(model, prune_ratio)
            result.pruned_params, result.pruned_macs = count_params(model), count_macs(model, list(input_size))
            if result.pruned_params >= result.params:
                raise StepFailed(step, "no channel was removed")
            result.passed.append(step)

            step = "pruned forward"
            _announce(on_step, step)
            model.eval()
            with torch.inference_mode():
                ref = model(x)
            _check_output(ref, 2, num_classes, step)
            if hasattr(model, "reset_classifier"):  # the model contract holds on the pruned model
                clone = copy.deepcopy(model)
                clone.reset_classifier(3)
                with torch.inference_mode():
                    _check_output(clone(x), 2, 3, step)
            result.passed.append(step)

            step = "export"
            _announce(on_step, step)
            onnx_path = export_onnx(model, Path(tmp) / "model.onnx", shape=list(input_size))
            result.passed.append(step)

            step = "parity"
            _announce(on_step, step)
            session = ort_session(onnx_path)
            # parity checks the output's shape too: a batch size other than the export's
            check = parity(model, lambda a: run_session(session, a), [(batch, None)])
            result.parity_error, result.parity_relative = check["max_abs_diff"], check["relative_diff"]
            result.parity_agreement = check["top1_agreement"]
            failure = parity_failure(check, "fp32", tolerance, min_agreement=1.0)
            if failure:
                raise StepFailed(step, failure)
            result.passed.append(step)

            step = "int8"
            _announce(on_step, step)
            calib = [(torch.randn(calibration_samples, *input_size),)]
            int8_path = quantize_onnx(onnx_path, Path(tmp) / "model.int8.onnx", calib, method="minmax")
            got = run_session(ort_session(int8_path), x)
            if got.shape != (2, num_classes) or not np.isfinite(got).all():
                raise StepFailed(step, f"int8 model gave shape {got.shape}, finite={bool(np.isfinite(got).all())}")
            result.passed.append(step)
        except StepFailed as exc:
            result.failed_step, result.reason = exc.step, exc.reason
        except Exception as exc:  # noqa: BLE001  (any failure is a row in the table, with its reason)
            result.failed_step, result.reason = step, one_line(exc, 240)
        result.seconds = round(time.perf_counter() - start, 2)
        if "pruned forward" in result.passed and runtimes:  # a pruned model to hand to the other runtimes
            if on_row is not None:
                on_row(result)
            for runtime in runtimes:
                _announce(on_step, f"runtime {runtime.name}")
                result.runtimes[runtime.name] = runtime_parity(model, runtime, input_size, batch, Path(tmp), tolerance)
                result.seconds = round(time.perf_counter() - start, 2)
                if on_row is not None:
                    on_row(result)
    return result


def runtime_parity(
    model: torch.nn.Module, runtime, input_size: list[int], batch: torch.Tensor, folder: Path, tolerance: float
) -> dict:
    """The model as `runtime`'s fp32 file, run on `batch` in that runtime and judged as the ONNX
    file is: {"ok", "reason", "relative", "agreement", "seconds"}."""
    from ..deploy.exporters import export_verified, parity_failure
    from ..registry import EXPORTERS

    start = time.perf_counter()
    path = folder / runtime.name / f"model{EXPORTERS.get(runtime.export_format).suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _, check = export_verified(
            model, runtime.export_format, "fp32", path, list(input_size), None, [(batch, None)], batch=len(batch)
        )
    except Exception as exc:  # noqa: BLE001  (the runtime's refusal is its cell in the table)
        return {"ok": False, "reason": one_line(exc, 240), "seconds": round(time.perf_counter() - start, 1)}
    failure = parity_failure(check, "fp32", tolerance, min_agreement=1.0)
    return {
        "ok": failure is None,
        "reason": failure,
        "relative": check["relative_diff"],
        "agreement": check["top1_agreement"],
        "seconds": round(time.perf_counter() - start, 1),
    }
