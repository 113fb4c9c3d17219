"""The conformance run: one model through every stage the pipeline puts it through.

create -> forward (shape, finite) -> backward (every trainable parameter gets a gradient) ->
prune -> forward -> ONNX export -> ONNX Runtime parity -> int8 quantize -> int8 runs; then, given
other runtimes (OpenVINO, LiteRT, ExecuTorch), the pruned model as each one's fp32 file, judged the
same way (a runtime's failure is its own column, not the row's).
Parity is judged as the export stage judges it (deploy.verify.parity_failure): the largest
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
    each step starts (a supervisor that kills a stuck run reads it). `runtimes` (runtimes/
    objects) each get the pruned model as their fp32 file, judged the same way, once the pruned
    model runs; `on_row(result)` is called before the first and after each (a row so far)."""
    from ..deploy.verify import FP32_RELATIVE_TOLERANCE

    result = Conformance(name, list(input_size))
    start = time.perf_counter()
    torch.manual_seed(0)
    x = torch.randn(2, *input_size)
    tolerance = relative_tolerance or FP32_RELATIVE_TOLERANCE
    inputs = real_images(input_size, 6)
    batch = torch.cat([x, x, x]) if inputs is None else inputs  # a batch size other than the export's
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        row = _Row(result, x, batch, num_classes, prune_ratio, tolerance, calibration_samples, Path(tmp))
        row.name, row.model_kwargs = name, model_kwargs
        step = STEPS[0]
        try:
            for step in STEPS:
                _announce(on_step, step)
                getattr(row, step.replace(" ", "_"))()
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
                result.runtimes[runtime.name] = runtime_parity(
                    row.model, runtime, input_size, batch, Path(tmp), tolerance
                )
                result.seconds = round(time.perf_counter() - start, 2)
                if on_row is not None:
                    on_row(result)
    return result


class _Row:
    """The steps of one model's row, in STEPS order, each a method of the step's name; a failing
    step raises (StepFailed with its reason, or whatever broke)."""

    def __init__(self, result, x, batch, num_classes, prune_ratio, tolerance, calibration_samples, tmp: Path):
        self.result, self.x, self.batch, self.num_classes = result, x, batch, num_classes
        self.prune_ratio, self.tolerance, self.calibration_samples, self.tmp = (
            prune_ratio,
            tolerance,
            calibration_samples,
            tmp,
        )
        self.input_size = list(result.input_size)

    def create(self) -> None:
        from ..models.builder import create_model
        from ..models.profile import count_macs, count_params

        kw = self.model_kwargs
        self.model = create_model(self.name, num_classes=self.num_classes, input_size=self.input_size, **kw)
        self.result.params, self.result.macs = count_params(self.model), count_macs(self.model, self.input_size)

    def forward(self) -> None:
        model, x = self.model, self.x
        model.train()
        self.out = model(x)
        _check_output(self.out, 2, self.num_classes, "forward")
        if hasattr(model, "forward_features") and hasattr(model, "forward_head"):  # the model contract's two halves
            _check_output(model.forward_head(model.forward_features(x)), 2, self.num_classes, "forward")

    def backward(self) -> None:
        self.out.float().pow(2).mean().backward()
        missing = [n for n, p in self.model.named_parameters() if p.requires_grad and p.grad is None]
        if missing:
            raise StepFailed("backward", f"{len(missing)} parameters get no gradient (e.g. {missing[0]})")
        self.model.zero_grad(set_to_none=True)

    def prune(self) -> None:
        from ..compression import prune
        from ..models.profile import count_macs, count_params

        r = self.result
        prune(self.model, self.prune_ratio)
        r.pruned_params, r.pruned_macs = count_params(self.model), count_macs(self.model, self.input_size)
        if r.pruned_params >= r.params:
            raise StepFailed("prune", "no channel was removed")

    def pruned_forward(self) -> None:
        model = self.model
        model.eval()
        with torch.inference_mode():
            ref = model(self.x)
        _check_output(ref, 2, self.num_classes, "pruned forward")
        if hasattr(model, "reset_classifier"):  # the model contract holds on the pruned model
            clone = copy.deepcopy(model)
            clone.reset_classifier(3)
            with torch.inference_mode():
                _check_output(clone(self.x), 2, 3, "pruned forward")

    def export(self) -> None:
        from ..runtimes.onnx_files import export_onnx

        self.onnx_path = export_onnx(self.model, self.tmp / "model.onnx", shape=self.input_size)

    def parity(self) -> None:
        from ..deploy.verify import parity, parity_failure
        from ..runtimes import open_file

        # parity checks the output's shape too: a batch size other than the export's
        check = parity(self.model, open_file(self.onnx_path), [(self.batch, None)])
        r = self.result
        r.parity_error, r.parity_relative = check["max_abs_diff"], check["relative_diff"]
        r.parity_agreement = check["top1_agreement"]
        failure = parity_failure(check, "fp32", self.tolerance, min_agreement=1.0)
        if failure:
            raise StepFailed("parity", failure)

    def int8(self) -> None:
        from ..runtimes import open_file, runtime_named

        calib = [(torch.randn(self.calibration_samples, *self.input_size),)]
        int8 = runtime_named("onnxruntime").quantize(
            self.onnx_path, self.tmp / "model.int8.onnx", calib, method="minmax"
        )
        got = open_file(int8)(self.x)
        if got.shape != (2, self.num_classes) or not np.isfinite(got).all():
            raise StepFailed("int8", f"int8 model gave shape {got.shape}, finite={bool(np.isfinite(got).all())}")


def runtime_parity(
    model: torch.nn.Module, runtime, input_size: list[int], batch: torch.Tensor, folder: Path, tolerance: float
) -> dict:
    """The model as `runtime`'s fp32 file, run on `batch` in that runtime and judged as the ONNX
    file is: {"ok", "reason", "relative", "agreement", "seconds"}."""
    from ..deploy.verify import export_verified, parity_failure

    start = time.perf_counter()
    path = folder / runtime.name / f"model{runtime.suffix}"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        _, check = export_verified(
            model, runtime.format, "fp32", path, list(input_size), None, [(batch, None)], batch=len(batch)
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
