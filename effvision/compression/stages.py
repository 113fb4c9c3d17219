"""Compression stages: select, prune, distill, quantize (configs + handlers registered in STAGES)."""

from __future__ import annotations

import copy
import shutil
import time
from pathlib import Path
from typing import Any, ClassVar, Literal, Optional, Union

import numpy as np
from pydantic import Field, field_validator

from ..data.selectors import Budget, CalibrationConfig, SelectorName
from ..errors import EffvisionError
from ..progress import log
from ..recipe import StageConfig, Strict, TargetConfig
from ..stage import StageResult, register_stage
from ..train.config import DistillSettings, TrainSettings
from ..train.loop import fit
from .finetune import FinetuneSettings, finetune, recalibrate_batchnorm
from .prune import prune
from .quantize import Int8Builder
from .selection import ProxyConfig, choose, proxy_factory
from .sparsity import SparsitySettings, train_sparse
from .target_prune import TargetPruneSettings


class SelectConfig(StageConfig):
    type: Literal["select"] = "select"
    selector: SelectorName = Field(
        "random",
        description="a registered selector: random, class_balanced, herding, kcenter, el2n, grand, "
        "forgetting, entropy, margin, gradient_clusters",
    )
    budget: Budget = Field(0.5, description="a fraction in (0, 1] of the training split, or a count of samples")
    options: dict[str, Any] = Field(default_factory=dict, description="selector options, e.g. {keep: easy}")
    proxy: ProxyConfig = Field(
        default_factory=ProxyConfig, description="the model trained to score samples (scoring selectors only)"
    )

    @field_validator("budget")
    @classmethod
    def _positive(cls, v):
        if v <= 0:
            raise ValueError("the budget must be a fraction in (0, 1] or a count >= 1")
        return v


@register_stage("select", SelectConfig)
def run_select(ctx, cfg: SelectConfig) -> StageResult:
    """Keep a coreset of the training split; later stages train on it."""
    data = ctx.data
    start = time.perf_counter()
    sel, scored = choose(
        data,
        cfg.selector,
        cfg.budget,
        cfg.options,
        cfg.proxy,
        proxy_factory(ctx.model, cfg.proxy, data),
        ctx.device,
        ctx.seed,
    )
    select_s = time.perf_counter() - start - scored.proxy_train_s - scored.scoring_s
    path = ctx.select_train(sel.indices, sel.weights)
    counts = np.bincount(np.asarray(data.train.targets)[sel.indices], minlength=data.num_classes)
    return StageResult(
        {
            "selector": cfg.selector,
            "budget": cfg.budget,
            "selected": len(sel.indices),
            "of": len(data.train),
            "weighted": sel.weights is not None,
            "per_class": {"min": int(counts.min()), "max": int(counts.max())},
            "proxy_train_s": round(scored.proxy_train_s, 3),
            "scoring_s": round(scored.scoring_s, 3),
            "select_s": round(select_s, 3),
            "proxy_accuracy": scored.proxy_accuracy or None,
            "accuracy": None,
            "time_to_accuracy_s": None,
        },
        {"selection": path.name},
    )


class PruneConfig(StageConfig):
    type: Literal["prune"] = "prune"
    ratio: float = Field(0.5, gt=0, lt=1, description="fraction of channels removed per prunable layer")
    importance: Literal["l1", "l2", "bn_scale", "taylor"] = Field(
        "l2", description="how channels are ranked: weight norms, batch-norm scales or first-order Taylor"
    )
    global_pruning: bool = Field(False, description="rank channels across layers rather than within each")
    layer_ratios: dict[str, float] = Field(
        default_factory=dict, description="per-layer ratio by module name or re:regex"
    )
    ignore: list[str] = Field(default_factory=list, description="module names or re:regex kept intact")
    round_to: Optional[int] = Field(
        None, gt=0, description="keep channel counts multiples of this (aiming at a target: unset measures it)"
    )
    iterative_steps: int = Field(
        1, ge=1, description="prune in this many steps, each followed (but the last) by finetune.step_epochs"
    )
    finetune: FinetuneSettings = Field(
        default_factory=FinetuneSettings,
        description="distillation from the model entering the stage: between iterative steps, and aiming at a "
        "target after each step and at the end (epochs)",
    )
    target: Union[TargetConfig, bool, None] = Field(
        None,
        description="aim at a latency target with per-layer widths: this block, or the recipe's (null or true); "
        "false: the uniform ratio even when the recipe has a target",
    )
    aim: TargetPruneSettings = Field(
        default_factory=TargetPruneSettings, description="aiming at a target: how widths are searched and timed"
    )
    sparsity: SparsitySettings = Field(
        default_factory=SparsitySettings,
        description="group-norm-regularised distillation before pruning (either mode)",
    )

    def recipe_problem(self, recipe) -> Optional[str]:
        if self.target is True and recipe.target is None:
            return "target: true, but the recipe has no target block"
        aimed = self.aimed_target(recipe)
        if aimed is not None and aimed.floor_only:
            types = [s.get("type") if isinstance(s, dict) else s.type for s in recipe.stages]
            if "plan" not in types:
                return "target: max_drop alone (the fastest file within it) needs a plan stage before prune"
            if self.finetune.step_epochs < 1 or self.aim.steps < 2:
                return (
                    "target: max_drop alone prunes step by step while the floor holds: give aim.steps >= 2 and "
                    "finetune.step_epochs >= 1 (each step's recovered accuracy is held against the floor)"
                )
        return None

    def aimed_target(self, recipe) -> Optional[TargetConfig]:
        """The target this stage aims at in `recipe`: its own block, else the recipe's (unless
        `target: false`); None: the uniform ratio."""
        if isinstance(self.target, TargetConfig):
            return self.target
        return recipe.target if self.target in (None, True) else None


@register_stage("prune", PruneConfig)
def run_prune(ctx, cfg: PruneConfig) -> StageResult:
    """Structured channel pruning (torch-pruning dependency graph): a uniform ratio, or per-layer
    widths chosen for a latency target measured on its backend."""
    model = ctx.model
    target = cfg.aimed_target(ctx.recipe)
    gradual = cfg.iterative_steps > 1 and cfg.finetune.step_epochs > 0  # prune, train, prune, ...
    teacher = None  # the model entering the stage, for the trainings below
    if gradual or cfg.sparsity.epochs or target is not None:
        teacher = copy.deepcopy(model).to(ctx.device).eval()
    extra = {}
    if cfg.sparsity.epochs:
        extra["sparsity"] = train_sparse(ctx, model, teacher, cfg)
    if target is not None:
        from ..deploy.reference import reference_model
        from .plan import plan_of, shipping
        from .target_prune import floor_and_target, prune_to_target

        plan = plan_of(ctx)
        if plan is not None and not plan["prune"]:
            log(
                f"  the plan's levers meet the target ({plan['kept']['lever']}, {plan['kept']['speedup']}x): "
                "nothing pruned"
            )
            aim = {"met_by_plan": plan["kept"], "met": True}
            if ctx.student_size is not None:  # a lower input size recovers by distillation from the full-size model
                label = f"{cfg.name} recovery at {ctx.student_size} px"
                extra["finetune_features"] = finetune(ctx, model, teacher, cfg.finetune, cfg.finetune.epochs, label)
            return ctx.torch_result(model, extra={**extra, "target": target.model_dump(), "aim": aim})
        ship, score = shipping(ctx, plan)
        aimed, model = prune_to_target(ctx, target, cfg, teacher, reference_model(ctx) or teacher, ship, score)
        extra["finetune_features"] = aimed.pop("finetune_features", None)
        if plan is not None:
            aimed["precision"] = plan["kept"]["precision"]
            aimed["remainder"] = plan["remainder"]
        result = ctx.torch_result(model, extra={**extra, "target": target.model_dump(), "aim": aimed})
        floor_and_target(ctx, plan, aimed)  # one line, the stage kept, where they cannot both be met
        return result
    between = None
    if gradual:

        def between(k: int) -> None:
            label = f"{cfg.name} step {k}"
            extra["finetune_features"] = finetune(ctx, model, teacher, cfg.finetune, cfg.finetune.step_epochs, label)

    prune(
        model,
        cfg.ratio,
        cfg.importance,
        cfg.global_pruning,
        cfg.layer_ratios,
        cfg.ignore,
        cfg.round_to,
        cfg.iterative_steps,
        calib_loader=ctx.data.train_loader(seed=ctx.seed) if cfg.importance == "taylor" else None,
        between_steps=between,
    )
    if between is not None or cfg.sparsity.epochs:  # trained here: the pruned widths get their statistics too
        recalibrate_batchnorm(model, ctx.data)
    trained = cfg.finetune.step_epochs * (cfg.iterative_steps - 1) if between else 0
    return ctx.torch_result(model, extra={**extra, "epochs_between_steps": trained})


class DistillConfig(TrainSettings, DistillSettings, StageConfig):
    type: Literal["distill"] = "distill"
    teacher: Optional[str] = Field(
        "auto", description="auto (the model before the last prune), a stage name, a checkpoint, or null"
    )
    epochs: int = Field(8, ge=0, description="epochs of distillation")
    lr: float = Field(0.02, gt=0, description="peak learning rate")


@register_stage("distill", DistillConfig)
def run_distill(ctx, cfg: DistillConfig) -> StageResult:
    """Fine-tune with distillation from a teacher (logits, and with `features` intermediate
    features too); plain fine-tuning without one."""
    teacher, teacher_from = ctx.resolve_teacher(cfg.teacher)
    model = ctx.model
    res = fit(
        model,
        ctx.full_data,  # the teacher sees the data's own size; the model, the size a plan kept
        cfg,
        ctx.device,
        seed=ctx.seed,
        teacher=teacher,
        distill=cfg,
        label=cfg.name,
        checkpoint=ctx.epoch_checkpoint(cfg.name, cfg.checkpoint_every),
        student_size=ctx.student_size,
    )
    return ctx.torch_result(
        model,
        accuracy=res.accuracy,
        time_to_accuracy_s=res.time_to_accuracy_s,
        extra={"teacher": teacher_from, **res.metrics(cfg)},
    )


class SpeedCheckSettings(Strict):
    """How an int8 stage (quantize, qat) times int8 against fp32 before it ships."""

    require_faster: bool = Field(
        True, description="ship int8 only when it is measured faster than the fp32 file at the decision's batches"
    )
    batches: Optional[list[int]] = Field(
        None,
        description="batches the speed decisions are measured at (default: the one the model ships at, the "
        "recipe's target.batch, else 1)",
    )
    warmup: int = Field(5, ge=0, description="untimed calls per file and batch before timing")
    repeats: int = Field(40, ge=4, description="timed calls per file and batch, interleaved in 8 rounds")

    @field_validator("batches")
    @classmethod
    def _positive_batches(cls, v):
        if v is not None and (not v or min(v) < 1):
            raise ValueError("batches must be a non-empty list of positive sizes")
        return v


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


def decision_batches(ctx, cfg: SpeedCheckSettings) -> tuple[list[int], str]:
    """The batches int8 must pay at, and why those: the stage's own `batches`, else the one the
    model ships at (the recipe's target.batch, else 1: a file runs one input at a time unless
    the recipe says otherwise)."""
    if cfg.batches:
        return sorted(set(cfg.batches)), "the stage's batches"
    target = getattr(ctx.recipe, "target", None)
    if target is not None:
        return [target.batch], f"batch {target.batch}, where the model ships (the recipe's target.batch)"
    return [1], "batch 1, where the model ships (the recipe sets no target.batch)"


def speed_timing(ctx, cfg: SpeedCheckSettings):
    """Timing at the decision's batches (decision_batches), interleaved."""
    from .int8_search import Timing

    batches, _ = decision_batches(ctx, cfg)
    return Timing(ctx.input_shape, batches, cfg.warmup, cfg.repeats, rounds=min(8, cfg.repeats))


def _samples(loader, n: int) -> np.ndarray:
    xs, count = [], 0
    for x, *_ in loader:
        xs.append(x.numpy())
        count += len(x)
        if count >= n:
            break
    return np.concatenate(xs)[:n]


def floor_of(ctx, own: float | None, runtime=None) -> tuple[float | None, float | None]:
    """The largest top-1 loss an int8 step may take, and the accuracy it is measured from: the
    stage's own max_drop against the file it quantizes; else the recipe target's floor against the
    uncompressed model (scored here, as an fp32 file of `runtime`, ONNX by default, on the
    validation split), so that pruning's loss and int8's together hold it."""
    import tempfile

    from ..deploy import evaluate
    from ..deploy.reference import reference_model
    from ..deploy.runtimes import runtime_named
    from .plan import export_fp32

    target = ctx.recipe.target
    if own is not None or target is None or target.max_drop is None:
        return own, None
    reference = reference_model(ctx)
    if reference is None:  # nothing compressed before: the file quantized is the uncompressed model
        return target.max_drop, None
    runtime = runtime or runtime_named("onnxruntime")
    with tempfile.TemporaryDirectory() as tmp:
        path = export_fp32(runtime, reference, Path(tmp) / f"reference{runtime.suffix}", list(ctx.full_input_shape))
        accuracy = evaluate(path, ctx.full_data.val_loader())
    log(f"  int8 holds the target's floor: at most {target.max_drop} below the uncompressed model's {accuracy:.4f}")
    return target.max_drop, accuracy


@register_stage("quantize", QuantizeConfig)
def run_quantize(ctx, cfg: QuantizeConfig) -> StageResult:
    """Static int8 (ONNX Runtime QDQ, U8S8, per-channel) that keeps its accuracy (max_drop) and
    ships only when it pays (require_faster), both measured here."""
    import tempfile

    from ..deploy import evaluate
    from ..deploy.runtimes import runtime_of_path
    from .int8_search import search_int8
    from .runtime_int8 import quantize_in_runtime

    if ctx.exported is not None and runtime_of_path(ctx.exported).kind not in ("onnx", "pte"):
        return quantize_in_runtime(ctx, cfg, ctx.exported)  # an IR or a .tflite: that runtime's own tool
    src = ctx.onnx
    if src is None:  # no export stage before: export the current model first
        from ..deploy.onnx_export import export_onnx

        src = export_onnx(ctx.model, ctx.stage_dir / "fp32.onnx")
    calib = ctx.calibration_loader(cfg.calibration)
    timing = speed_timing(ctx, cfg) if cfg.require_faster or cfg.speed_aware else None
    max_drop, from_accuracy = floor_of(ctx, cfg.max_drop)
    with tempfile.TemporaryDirectory() as tmp:
        builder = Int8Builder(src, calib, tmp, cfg.method, cfg.per_channel, cfg.reduce_range)
        unknown = sorted(set(cfg.exclude) - {n.name for n in builder.nodes})
        if unknown:
            raise EffvisionError(f"quantize: exclude names nodes not in {src}: {', '.join(unknown[:5])}")
        result = search_int8(
            builder,
            Path(src),
            ctx.stage_dir / "model.onnx",
            timing,
            cfg.speed_aware,
            cfg.require_faster,
            max_drop,
            lambda path: evaluate(path, ctx.data.val_loader()),
            _samples(calib, cfg.rank_samples) if max_drop is not None else None,
            set(cfg.exclude),
            from_accuracy,
        )
    shutil.rmtree(ctx.stage_dir / "int8-search", ignore_errors=True)
    decided_at = None
    if timing is not None:
        decided_at = {"batches": timing.batches, "why": decision_batches(ctx, cfg)[1]}
        log(f"  quantize decided at {decided_at['why']}")
    return ctx.artifact_result(
        result.path,
        extra={
            "calibration": cfg.calibration.model_dump(),
            "method": cfg.method,
            "reduce_range": builder.reduce_range,
            "fp32_onnx_bytes": Path(src).stat().st_size,
            "shipped": result.shipped,
            "decision": result.decision,
            "decided_at": decided_at,
            "float_layers": sorted(result.float_nodes & set(builder.layers)),
            "int8_layers": result.layers - len(result.float_nodes & set(builder.layers)),
            "float_nodes": sorted(result.float_nodes - set(builder.layers)),
            "speed_groups": result.speed_groups,
            "speed_check": result.speed_check,
            "accuracy_search": result.accuracy_search,
        },
    )
