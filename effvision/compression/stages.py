"""Compression stages: select, prune, distill (configs + handlers registered in STAGES); quantize and
qat have modules of their own."""

from __future__ import annotations

import copy
import time
from typing import Any, Literal, Optional, Union

import numpy as np
from pydantic import Field, field_validator

from ..data.selectors import Budget, SelectorName
from ..progress import log
from ..recipe import StageConfig, TargetConfig
from ..stage import StageResult, register_stage
from ..train.config import DistillSettings, TrainSettings
from ..train.loop import fit
from .finetune import FinetuneSettings, finetune, recalibrate_batchnorm
from .prune import prune
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
        if aimed is None:
            return None
        types = [s.get("type") if isinstance(s, dict) else s.type for s in recipe.stages]
        return aimed.goal.prune_problem("plan" in types, self.finetune.step_epochs, self.aim.steps)

    def decides(self, recipe) -> bool:
        """Aiming at a target (candidates, steps, the floor), or fine-tuning (batch-norm statistics kept or not)."""
        trains = self.finetune.step_epochs > 0 and self.iterative_steps > 1
        return self.aimed_target(recipe) is not None or trains or self.sparsity.epochs > 0

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
