"""The `qat` stage: quantization-aware fine-tuning in the one training loop, shipped as a QDQ
ONNX file that ONNX Runtime runs in int8; the simulated model and the file are checked to agree."""

from __future__ import annotations

import copy
import shutil
from typing import Literal, Optional, Union

from pydantic import Field

from ..data.selectors import CalibrationConfig
from ..errors import EffvisionError
from ..int8 import ship_or_fp32
from ..progress import log
from ..recipe import StageConfig
from ..runtimes.onnx_int8 import resolve_reduce_range
from ..stage import StageResult, register_stage
from ..train.config import LogitDistillSettings, TrainSettings
from ..train.loop import fit
from .speed_check import SpeedCheckSettings, speed_timing

UNSUPPORTED = ("compile", "channels_last", "ema", "whiten", "progressive_sizes")


class QatConfig(SpeedCheckSettings, TrainSettings, LogitDistillSettings, StageConfig):
    type: Literal["qat"] = "qat"
    calibration: CalibrationConfig = Field(
        default_factory=CalibrationConfig, description="{selector, n}: the samples that initialise every range"
    )
    teacher: Optional[str] = Field(
        "input",
        description="input (the float model entering this stage), auto, a stage name, a checkpoint, or null",
    )
    epochs: int = Field(3, ge=0, description="epochs of training with simulated int8")
    lr: float = Field(0.005, gt=0, description="peak learning rate")
    schedule: Literal["onecycle", "cosine", "constant", "step"] = Field("cosine", description="learning-rate schedule")
    warmup_epochs: float = Field(0.0, ge=0, description="epochs of linear learning-rate warm-up")
    reduce_range: Union[bool, Literal["auto"]] = Field(
        "auto", description="7-bit weights; auto: when the CPU lacks VNNI (16-bit sums would saturate)"
    )
    min_agreement: float = Field(
        0.99, ge=0, le=1, description="top-1 agreement on validation data between the simulated model and the file"
    )


@register_stage("qat", QatConfig)
def run_qat(ctx, cfg: QatConfig) -> StageResult:
    """Fine-tune with simulated int8 (torchao PT2E: ranges from calibration, distillation from the
    float model), export the int8 QDQ ONNX file, and check it against the simulation."""
    from ..runtimes.onnx_files import export_onnx
    from .qat import prepare_qat

    used = [k for k in UNSUPPORTED if getattr(cfg, k)]
    if used:  # checked here, not in the schema: every field stays valid on its own in a recipe
        raise EffvisionError(f"qat does not support {', '.join(used)} (the model trains as a captured graph)")
    data = ctx.data
    if len(data.train) == 0:
        raise EffvisionError("qat: the data has no training samples to calibrate and fine-tune on")
    float_model = ctx.model.eval()
    teacher, teacher_from = ctx.resolve_teacher(cfg.teacher)
    calib = ctx.calibration_loader(cfg.calibration)
    first = next(iter(calib), None)
    if first is None:
        raise EffvisionError("qat: no calibration samples were selected")
    example = first[0][:2] if len(first[0]) > 1 else first[0].repeat(2, *[1] * (first[0].dim() - 1))
    reduce_range = resolve_reduce_range(cfg.reduce_range)
    fp32 = export_onnx(float_model, ctx.stage_dir / "fp32.onnx", ctx.input_shape)
    qat = prepare_qat(copy.deepcopy(float_model).cpu(), example, reduce_range).to(ctx.device)
    calibrated = qat.calibrate(calib, ctx.device)
    val = data.val_loader()
    try:
        res = fit(
            qat,
            data,
            cfg,
            ctx.device,
            seed=ctx.seed,
            teacher=teacher,
            distill=cfg,
            label=cfg.name,
            checkpoint=ctx.epoch_checkpoint(cfg.name, cfg.checkpoint_every),
        )
    except AssertionError as err:  # an observer fed NaN: the fine-tuning diverged
        if "nan" not in str(err):
            raise
        raise EffvisionError(f"qat: training diverged (NaN activations) at lr {cfg.lr}; try a lower lr") from None
    qat.cpu()
    int8, parity = _exported_and_checked(qat, example, ctx.stage_dir / "int8.onnx", val, cfg.min_agreement)
    timing = speed_timing(ctx, cfg) if cfg.require_faster else None
    made = f"int8 (QAT, {'7' if reduce_range else '8'}-bit weights)"
    shipped, why, speed_check = ship_or_fp32(fp32, int8, made, True, cfg.require_faster, timing)
    decision = f"ships {why}"
    log(f"  qat {decision}")
    path = ctx.stage_dir / "model.onnx"
    shutil.copyfile(shipped, path)
    return ctx.artifact_result(
        path,
        extra={
            "teacher": teacher_from,
            "calibration": {**cfg.calibration.model_dump(), "samples": calibrated},
            "reduce_range": reduce_range,
            "backend": timing.backend if timing else "onnxruntime-cpu",
            "fp32_onnx_bytes": fp32.stat().st_size,
            "int8_onnx_bytes": int8.stat().st_size,
            "shipped": "int8" if shipped == int8 else "fp32",
            "decision": decision,
            "speed_check": speed_check,
            "parity": parity,
            **res.metrics(cfg),
        },
    )


def _exported_and_checked(qat, example, path, val, min_agreement: float):
    """The QDQ ONNX file of the trained simulation and how far the two agree on the validation
    split (a check of the export, reported: nothing is chosen on it)."""
    from ..runtimes import open_file
    from ..scoring import outputs, torch_predictor

    simulated, labels = outputs(torch_predictor(qat), val)  # before export: converting changes qat
    int8 = qat.export_onnx(example, path)
    in_file, _ = outputs(open_file(int8), val)
    agreement = float((simulated.argmax(1) == in_file.argmax(1)).mean())
    parity = {
        "agreement": agreement,
        "samples": len(labels),
        "min_agreement": min_agreement,
        "met": agreement >= min_agreement,
        "simulated_accuracy": float((simulated.argmax(1) == labels).mean()),
        "onnx_accuracy": float((in_file.argmax(1) == labels).mean()),
    }
    log(
        f"  qat parity: the int8 file agrees with the simulated model on {agreement:.2%} of "
        f"{len(labels)} validation samples{'' if parity['met'] else f' (below {min_agreement:.0%})'}"
    )
    return int8, parity
