"""int8 in a runtime with its own quantizer (OpenVINO: NNCF; LiteRT: the LiteRT tools), the
quantize stage's path when the file entering it is that runtime's (a target on openvino-cpu or
litert-cpu exports there). The whole graph goes int8 by the runtime's tool; it ships when it holds
the floor (top-1 on the whole validation split, run in that runtime) and is measured faster than
the fp32 file it came from, interleaved on the target's backend at the decision's batches;
otherwise the fp32 file ships and the stage says why. (Layer groups and node reverts are ONNX
Runtime's search: these tools quantize a graph as a whole.)"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from ..errors import EffvisionError
from ..progress import log
from ..stage import StageResult


def timing_backend(ctx, runtime) -> str:
    """The target's backend where it runs this runtime's files, else the runtime's own."""
    target = getattr(ctx.recipe, "target", None)
    if target is not None and target.backend in runtime.backends():
        return target.backend
    return runtime.default_backend


def quantize_in_runtime(ctx, cfg, src: Path) -> StageResult:
    """The quantize stage on a file of a runtime with its own int8 tool (cfg: its QuantizeConfig)."""
    from ..deploy import evaluate
    from ..deploy.exporters import get_exporter
    from ..deploy.runtimes import runtime_of_path
    from .int8_search import faster_than_fp32
    from .stages import decision_batches, floor_of, speed_timing

    runtime = runtime_of_path(src)
    if cfg.exclude:
        raise EffvisionError(
            f"quantize: exclude names ONNX nodes, and {src.name} is {runtime.describes}: {runtime.int8_tool} "
            "quantizes it whole; earlier stages are kept"
        )
    work = ctx.stage_dir / "int8-work"
    work.mkdir(exist_ok=True)
    calib = list(ctx.calibration_loader(cfg.calibration))
    exporter = get_exporter(runtime.export_format, "int8")
    int8 = exporter.quantize_file(src, work / f"int8{runtime.suffix}", calib)
    shipped, decision = int8, f"int8 by {runtime.int8_tool}"
    max_drop, from_accuracy = floor_of(ctx, cfg.max_drop, runtime)
    accuracy = None
    if max_drop is not None:
        fp32_acc = from_accuracy if from_accuracy is not None else evaluate(src, ctx.data.val_loader())
        int8_acc = evaluate(int8, ctx.data.val_loader())
        met = fp32_acc - int8_acc <= max_drop + 1e-9
        accuracy = {
            "max_drop": max_drop,
            "measured_from": "the uncompressed model" if from_accuracy is not None else "the fp32 file",
            "fp32_accuracy": fp32_acc,
            "int8_accuracy": int8_acc,
            "met": met,
        }
        log(f"  int8 top-1 {int8_acc:.4f} against {fp32_acc:.4f} (floor {max_drop})")
        if not met and cfg.accuracy_control and exporter.accuracy_control:
            src_acc = fp32_acc if from_accuracy is None else evaluate(src, ctx.data.val_loader())
            control = _controlled(ctx, exporter, src, src_acc, work, calib, fp32_acc, max_drop)
            made = control.pop("path", None)
            if made is not None:
                int8, int8_acc, met = made, control["int8_accuracy"], control["met"]
            accuracy.update(int8_accuracy=int8_acc, met=met, accuracy_control=control)
        if not met:
            lost = 100 * (fp32_acc - int8_acc)
            shipped, decision = (
                src,
                f"fp32: int8 by {runtime.int8_tool} lost {lost:.2f} points, past max_drop {max_drop}",
            )
    speed, decided_at = None, None
    if cfg.require_faster and shipped == int8:
        timing = dataclasses.replace(speed_timing(ctx, cfg), backend=timing_backend(ctx, runtime))
        check = faster_than_fp32(src, int8, timing)
        speed, decided_at = check.record, {"batches": timing.batches, "why": decision_batches(ctx, cfg)[1]}
        shipped, decision = (int8, f"{decision}, {check.why}") if check.faster else (src, check.why)
    dst = runtime.copy(shipped, ctx.stage_dir / f"model{runtime.suffix}")
    shutil.rmtree(work, ignore_errors=True)
    precision = "int8" if shipped == int8 else "fp32"
    log(f"  quantize ships {decision}")
    return ctx.artifact_result(
        dst,
        extra={
            "precision": precision,
            "tool": runtime.int8_tool,
            "calibration": cfg.calibration.model_dump(),
            "shipped": precision,
            "decision": f"ships {decision}",
            "decided_at": decided_at,
            "speed_check": speed,
            "accuracy_search": accuracy,
        },
    )


def _controlled(
    ctx, exporter, src: Path, src_acc: float, work: Path, calib, floor_from: float, max_drop: float
) -> dict:
    """int8 by the tool's accuracy control (NNCF's): ops back in float until the file loses at most
    what the floor leaves it against `src` (max_drop less what earlier stages lost). The record, with
    the file (`path`) and its top-1 on the validation split (scored here, in the runtime) when made."""
    from ..deploy import evaluate

    val = ctx.data.val_loader
    budget = round(max_drop - (floor_from - src_acc), 6)
    record = {"max_drop_against_input": budget, "input_accuracy": src_acc}
    if budget <= 0:
        log(f"  no int8 accuracy control: the stages before it left no room under the floor ({budget:+.4f})")
        return {**record, "met": False}
    log(f"  int8 by the tool's accuracy control: at most {budget} below {src.name}'s {src_acc:.4f}")
    path = exporter.quantize_within(src, work / f"int8-controlled{src.suffix}", calib, val(), budget)
    acc = evaluate(path, val())
    met = floor_from - acc <= max_drop + 1e-9
    log(f"  accuracy-controlled int8 top-1 {acc:.4f} ({'within' if met else 'past'} the floor)")
    return {**record, "path": path, "int8_accuracy": acc, "met": met}
