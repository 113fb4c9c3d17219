"""The quantize stage: the file entering it (the latest export, in any runtime) made int8 by the one
int8 maker (int8/maker.py), holding the floor on the decision split and shipped only when it pays."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal, Optional, Union

from pydantic import Field

from ..data.selectors import CalibrationConfig
from ..int8 import Int8Settings, make_int8
from ..progress import log
from ..recipe import StageConfig
from ..stage import StageResult, register_stage
from .decisions import floor_of
from .speed_check import SpeedCheckSettings, decision_batches, speed_timing, timing_backend


class QuantizeConfig(SpeedCheckSettings, StageConfig):
    type: Literal["quantize"] = "quantize"
    reads_recipe_target: ClassVar[bool] = True  # its floor: the target's max_drop, without one of its own
    calibration: CalibrationConfig = Field(
        default_factory=CalibrationConfig, description="{selector, n}: the samples that calibrate activations"
    )
    method: Literal["minmax", "percentile", "entropy"] = Field(
        "percentile", description="how activation ranges are calibrated"
    )
    per_channel: bool = Field(True, description="one weight scale per output channel (else per tensor)")
    exclude: list[str] = Field(default_factory=list, description="ONNX node names left in float")
    reduce_range: Union[bool, Literal["auto"]] = Field(
        "auto", description="7-bit weights; auto: when the CPU lacks VNNI"
    )
    max_drop: Optional[float] = Field(
        None,
        ge=0,
        lt=1,
        description="largest accepted top-1 loss against the fp32 file (absolute, e.g. 0.005); the most "
        "sensitive nodes (layers, activations, element-wise ops) go back to float until it holds",
    )
    speed_aware: bool = Field(
        True, description="keep in float the layer groups (stem, depthwise, classifier, element-wise) measured slower"
    )
    rank_samples: int = Field(256, ge=8, description="calibration samples the layer sensitivity is measured on")
    accuracy_control: bool = Field(
        True,
        description="an OpenVINO IR whose int8 misses max_drop: NNCF's accuracy control puts the ops that cost the "
        "most back in float (ONNX files: the node reverts above)",
    )

    def decides(self, recipe) -> bool:
        """Under a floor (its own max_drop, or the target's), int8's accuracy is a choice."""
        target = recipe.target
        return self.max_drop is not None or (target is not None and target.max_drop is not None)


@register_stage("quantize", QuantizeConfig)
def run_quantize(ctx, cfg: QuantizeConfig) -> StageResult:
    """int8 of the file entering the stage by its runtime's tool that keeps its accuracy (max_drop,
    on the decision split) and ships only when it pays (require_faster), both measured here."""
    from ..runtimes import runtime_of_path

    src = ctx.exported or ctx.onnx
    if src is None:  # no export stage before: the current model as ONNX first
        src = runtime_of_path("model.onnx").export(ctx.model, ctx.stage_dir / "fp32.onnx", ctx.input_shape)
    runtime = runtime_of_path(src)
    settings = Int8Settings(
        cfg.method,
        cfg.per_channel,
        cfg.reduce_range,
        cfg.speed_aware,
        cfg.require_faster,
        cfg.accuracy_control,
        cfg.rank_samples,
        frozenset(cfg.exclude),
    )
    if cfg.exclude and not runtime.keeps_float:
        from ..errors import EffvisionError

        raise EffvisionError(
            f"quantize: exclude names ONNX nodes, and {Path(src).name} is {runtime.describes}: {runtime.int8_tool} "
            "quantizes it whole; earlier stages are kept"
        )
    timing = None
    if cfg.require_faster or cfg.speed_aware:
        timing = speed_timing(ctx, cfg, backend=timing_backend(ctx, runtime))
    floor = floor_of(ctx, cfg.max_drop, runtime)
    made = make_int8(
        runtime,
        Path(src),
        ctx.stage_dir / f"model{runtime.suffix}",
        list(ctx.calibration_loader(cfg.calibration)),
        settings,
        ctx.decisions.scorer(),
        floor,
        timing,
        ctx.decisions.loader() if floor is not None else None,  # (only a floor's choices read the split)
    )
    decided_at = None
    if timing is not None:
        decided_at = {"batches": timing.batches, "why": decision_batches(ctx, cfg)[1]}
        log(f"  quantize decided at {decided_at['why']}")
    layers = set(made.layers)
    return ctx.artifact_result(
        made.path,
        extra={
            "precision": made.shipped,
            "tool": made.tool,
            "calibration": cfg.calibration.model_dump(),
            "method": cfg.method,
            "reduce_range": made.reduce_range,
            "fp32_bytes": runtime.file_bytes(src),
            **({"fp32_onnx_bytes": runtime.file_bytes(src)} if runtime.kind == "onnx" else {}),
            "shipped": made.shipped,
            "decision": made.decision,
            "decided_at": decided_at,
            "decided_on": ctx.decisions.where() if floor is not None else None,
            "float_layers": sorted(made.float_nodes & layers),
            "int8_layers": len(layers) - len(made.float_nodes & layers),
            "float_nodes": sorted(made.float_nodes - layers),
            "speed_groups": made.speed_groups,
            "speed_check": made.speed_check,
            "accuracy_search": made.accuracy_search,
        },
    )
