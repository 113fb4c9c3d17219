"""A target spent cheapest-accuracy first: before any stage trades accuracy, the plan stage
measures on the uncompressed model what each cheap lever gives here and what it costs (DESIGN,
"A target is a budget spent cheapest-accuracy first").

The levers: int8 (made by the one int8 maker, as the quantize stage makes it: on ONNX Runtime layer
groups measured slower stay float and the most sensitive nodes go back to float until the target's
max_drop holds; on OpenVINO and LiteRT the runtime's own tool, NNCF or the LiteRT tools, on the
whole graph, with NNCF's accuracy control where it misses the floor), and every lower input size
the target lists, each in fp32 and int8 (they do not multiply: on one AVX-512 EPYC int8 paid 2.0x
at 112 px and nothing at 80). Every file is one of the target backend's runtime (ONNX, IR or
.tflite), timed interleaved with the reference (the model's fp32 file of that runtime at its own
size) on the target's backend and batch, scored in that runtime on the decision split (training
images held out at load time; compression/decisions.py). The plan keeps the combination that meets
the target (with the aim's margin) at the least accuracy; else the fastest one within the floor,
and pruning is left the remainder, timed in the precision the plan ships. A lower input size is
scored as a pruning candidate is: batch-norm statistics recomputed at that size, before any
training (the distillation that follows recovers more)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import torch
from pydantic import Field

from ..data.selectors import CalibrationConfig
from ..errors import EffvisionError
from ..int8 import Floor, Int8Settings, make_int8
from ..progress import log
from ..recipe import StageConfig
from ..stage import StageResult, register_stage
from .decisions import resized
from .speed_check import speed_timing


class PlanConfig(StageConfig):
    type: Literal["plan"] = "plan"
    reads_recipe_target: ClassVar[bool] = True  # the target is one of its inputs (the run's fingerprint)
    int8: bool = Field(
        True,
        description="measure int8 as a lever, made as the quantize stage makes it: ONNX Runtime's node search, "
        "NNCF on openvino-cpu, the LiteRT tools on litert-cpu",
    )
    calibration: CalibrationConfig = Field(
        default_factory=lambda: CalibrationConfig(n=512), description="{selector, n}: the samples that calibrate int8"
    )
    method: Literal["minmax", "percentile", "entropy"] = Field(
        "percentile", description="how int8 activation ranges are calibrated (as the quantize stage)"
    )
    score_samples: int = Field(
        5000, ge=100, description="images of the decision split (data.holdout) every lever's top-1 is scored on"
    )
    margin: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="levers meet the target only this much faster than asked (the bench's own timing "
        "is another sample of a noisy clock)",
    )
    warmup: int = Field(5, ge=0, description="untimed calls per file before timing")
    repeats: int = Field(80, ge=8, description="timed calls per file, interleaved in 8 rounds")

    def decides(self, recipe) -> bool:
        return True

    def recipe_problem(self, recipe) -> str | None:
        if recipe.target is None:
            return "a plan stage spends the recipe's target: add a target block (speedup or latency_ms, max_drop)"
        return None


def target_runtime(backend_name: str):
    """The runtime whose files a target's backend runs: the plan measures its levers as those
    files. A backend that runs torch models, or programs of one batch size, has none to plan with."""
    from ..runtimes import runtime_of_backend

    runtime = runtime_of_backend(backend_name)
    if runtime.suffix is None or runtime.batch_rule == "fixed":
        raise EffvisionError(
            f"plan: levers are measured as files of any batch size (ONNX, OpenVINO IR, LiteRT); target.backend "
            f"{backend_name} runs {runtime.describes}"
        )
    return runtime


def _at_size(ctx, size: int, full: int):
    """The model as a lower input size would start from it: a copy with its batch-norm statistics
    recomputed on training images at that size (no training; how pruning candidates are scored
    too). The model itself keeps its own: it is the teacher of what follows."""
    import copy

    from torch.optim.swa_utils import update_bn

    from .finetune import training_order

    if size == full:
        return ctx.model
    model = copy.deepcopy(ctx.model)
    picked = sorted(training_order(len(ctx.data.train))[:1024].tolist())
    update_bn(resized(ctx.data.train_eval_loader(picked, batch_size=128), size), model, ctx.device)
    return model.eval()


def _check_sizes(sizes: list[int], full: int, modality: str) -> None:
    if sizes and modality != "image":
        raise EffvisionError(f"plan: target.resolutions applies to images, not {modality}; earlier stages are kept")
    larger = [r for r in sizes if r > full]
    if larger:
        raise EffvisionError(
            f"plan: target.resolutions lists {larger[0]} px, larger than the model's input size {full} px (a lower "
            "size is a lever; a larger one costs speed); earlier stages are kept"
        )


def choose(levers: list[dict], goal: float | None, max_drop: float | None, margin: float) -> tuple[dict, bool, str]:
    """The lever (a row of `levers`, the reference among them) the plan keeps, whether it meets
    the goal, and why: the least accuracy lost among those that meet goal x (1 + margin) within the
    floor, else the fastest within the floor (pruning then aims at the rest). No goal: the fastest
    within the floor, and pruning goes on while the floor holds."""
    floor = float("inf") if max_drop is None else max_drop + 1e-9
    within = [lv for lv in levers if lv["cost"] <= floor]
    if goal is None:
        best = max(within, key=lambda lv: (lv["speedup"], -lv["cost"]))
        return best, False, "the fastest within the floor; pruning goes on while the floor holds"
    meeting = [lv for lv in within if lv["speedup"] >= goal * (1 + margin)]
    if meeting:
        best = min(meeting, key=lambda lv: (lv["cost"], -lv["speedup"]))
        return best, True, f"meets {goal:.2f}x with the {margin:.0%} margin at the least accuracy within the floor"
    best = max(within, key=lambda lv: (lv["speedup"], -lv["cost"]))
    return best, False, f"the fastest within the floor; pruning aims at the remaining {goal / best['speedup']:.2f}x"


@dataclass
class Levers:
    """The lever files the plan measures: name -> (file, precision, input shape), and how int8 was made."""

    files: dict[str, tuple[Path, str, list[int]]]
    full: int
    int8: dict | None = None

    @property
    def reference(self) -> str:
        return f"fp32@{self.full}"


@register_stage("plan", PlanConfig)
def run_plan(ctx, cfg: PlanConfig) -> StageResult:
    """Measure the cheap levers on the model entering the stage and keep those a target needs."""
    target = ctx.recipe.target
    runtime = target_runtime(target.backend)
    work = ctx.stage_dir / "levers"
    work.mkdir(exist_ok=True)
    levers = make_levers(ctx, cfg, runtime, work)
    measured = measure_levers(ctx, cfg, levers)
    ref = measured[levers.reference]
    goal = target.goal.speedup(ref["p50_ms"])
    kept, meets, why = choose(list(measured.values()), goal, target.max_drop, cfg.margin)
    kept["kept"] = True
    for lv in measured.values():
        log(
            f"  plan: {lv['lever']:>9} {lv['p50_ms']:.3f} ms, {lv['speedup']:.2f}x, top-1 {lv['top1']:.4f} "
            f"({-100 * lv['cost']:+.2f} points){'  <- kept' if lv.get('kept') else ''}"
        )
    log(f"  plan keeps {kept['lever']}: {why}")
    plan = plan_record(ctx, cfg, levers, list(measured.values()), kept, meets, why, goal)
    return StageResult({"accuracy": None, "time_to_accuracy_s": None, "plan": plan}, {})


def make_levers(ctx, cfg: PlanConfig, runtime, work: Path) -> Levers:
    """The lever files: fp32 at every size, and int8 at every size where the int8 maker ships int8
    at the model's own size (the same nodes float at the others)."""
    target = ctx.recipe.target
    shape = list(ctx.input_shape)
    full = shape[-1]
    _check_sizes(target.resolutions, full, ctx.data.modality)
    sizes = [full] + [r for r in target.resolutions if r < full]
    at = {r: [*shape[:-2], r, r] for r in sizes}  # the input shape at each size
    fp32 = {r: runtime.export(_at_size(ctx, r, full), work / f"fp32-{r}{runtime.suffix}", at[r]) for r in sizes}
    levers = Levers({f"fp32@{r}": (fp32[r], "fp32", at[r]) for r in sizes}, full)
    if not cfg.int8:
        return levers
    calib = list(ctx.calibration_loader(cfg.calibration))
    made = make_int8(
        runtime,
        fp32[full],
        work / f"int8-{full}{runtime.suffix}",
        calib,
        Int8Settings(method=cfg.method),
        ctx.decisions.scorer(cfg.score_samples),
        None if target.max_drop is None else Floor(target.max_drop),
        speed_timing(ctx, None, cfg.warmup, max(40, cfg.repeats // 2), target.backend),
        ctx.decisions.loader(cfg.score_samples),
    )
    levers.int8 = {
        "shipped": made.shipped,
        "tool": made.tool,
        "decision": made.decision,
        "float_nodes": sorted(made.float_nodes),
        "speed_groups": made.speed_groups,
        "accuracy_search": _without_ranking(made.accuracy_search),
    }
    if made.shipped == "int8":
        levers.files[f"int8@{full}"] = (made.path, "int8", at[full])
        like = int8_like(runtime, calib, cfg.method, made.float_nodes)
        for r in sizes[1:]:
            levers.files[f"int8@{r}"] = (like(fp32[r]), "int8", at[r])
    return levers


def measure_levers(ctx, cfg: PlanConfig, levers: Levers) -> dict[str, dict]:
    """Every lever file timed interleaved with the reference on the target's backend and batch,
    and scored on the decision split; by lever name."""
    from ..deploy.bench import compare

    target = ctx.recipe.target
    ref = levers.reference
    named = {("reference" if k == ref else k): v for k, v in levers.files.items()}
    rows = compare(
        named,
        list(ctx.input_shape),
        target.backend,
        [target.batch],
        torch.device("cpu"),
        cfg.warmup,
        cfg.repeats,
        rounds=min(8, cfg.repeats),
    )
    p50 = {(ref if r["target"] == "reference" else r["target"]): r["p50"] for r in rows}
    score = ctx.decisions.scorer(cfg.score_samples)
    base = score(levers.files[ref][0])
    measured = {}
    for name, (path, precision, (*_, size)) in levers.files.items():
        acc = base if name == ref else score(path)
        measured[name] = {
            "lever": name,
            "precision": precision,
            "size": size,
            "p50_ms": p50[name],
            "speedup": round(p50[ref] / p50[name], 3),
            "top1": acc,
            "cost": round(base - acc, 6),
            "file": ctx.rel(path),
        }
    return measured


def plan_record(ctx, cfg: PlanConfig, levers: Levers, rows: list[dict], kept: dict, meets: bool, why: str, goal):
    """The plan as report.json keeps it (DESIGN, "plan")."""
    target = ctx.recipe.target
    reference = next(r for r in rows if r["lever"] == levers.reference)
    remainder = 1.0 if meets else None if goal is None else goal / kept["speedup"]
    return {
        "goal_speedup": None if goal is None else round(goal, 4),
        "goal": target.goal.describe(),
        "max_drop": target.max_drop,
        "backend": target.backend,
        "batch": target.batch,
        "scored_on": ctx.decisions.where(cfg.score_samples),
        "reference": {"size": levers.full, "p50_ms": reference["p50_ms"], "top1": reference["top1"]},
        "levers": rows,
        "kept": {k: kept[k] for k in ("lever", "precision", "size", "speedup", "cost")},
        "why": why,
        "remainder": None if remainder is None else round(remainder, 4),
        "prune": remainder is None or remainder > 1.0,
        "int8": levers.int8,
        "method": cfg.method,
        "calibration": cfg.calibration.n,
        "score_samples": cfg.score_samples,
        "timed": f"interleaved, {cfg.repeats} calls per file in {min(8, cfg.repeats)} rounds",
    }


def _without_ranking(search: dict | None) -> dict | None:
    """An int8 accuracy search's record without the per-node ranking (kept in the quantize stage)."""
    return None if search is None else {k: v for k, v in search.items() if k != "ranking"}


def plan_of(ctx) -> dict | None:
    """The plan the run's last plan stage made, if any."""
    return next((r["plan"] for r in reversed(ctx.records) if r["type"] == "plan"), None)


def int8_like(runtime, calib, method: str, float_nodes):
    """fp32 file -> the int8 file the plan's int8 lever was made as, beside it (the same nodes float,
    where the runtime keeps nodes float), calibrated at the file's own input size: how a lower
    size's lever and a pruned candidate are timed and scored in the precision that ships."""
    floats = set(float_nodes or ())

    def ship(fp32: Path) -> Path:
        size = int(runtime.input_shape(fp32)[-1])
        dst = fp32.with_name(fp32.stem + ".int8" + fp32.suffix)
        return runtime.quantize(fp32, dst, list(resized(calib, size)), keep_float=floats, method=method)

    return ship


def shipping(ctx, plan: dict | None):
    """What a stage aiming after the plan needs: the fp32 -> shipped-file function (None when fp32
    ships) and the decision-split scorer of a torch model in that precision (None without a plan)."""
    import tempfile

    if plan is None:
        return None, None
    runtime = target_runtime(plan["backend"])
    ship = None
    if plan["kept"]["precision"] == "int8":
        calib = list(ctx.calibration_loader(CalibrationConfig(n=plan["calibration"])))
        ship = int8_like(runtime, calib, plan["method"], (plan["int8"] or {}).get("float_nodes"))

    def score(model) -> dict:
        """The model's top-1 on the plan's decision images, in the precision that ships, and its
        drop from the uncompressed model's there."""
        with tempfile.TemporaryDirectory() as tmp:
            path = runtime.export(model, Path(tmp) / f"model{runtime.suffix}", list(ctx.input_shape))
            acc = ctx.decisions.score_file(ship(path) if ship else path, plan["score_samples"])
        drop = round(plan["reference"]["top1"] - acc, 6)
        held = plan["max_drop"] is None or drop <= plan["max_drop"] + 1e-9
        return {"top1": acc, "drop": drop, "held": held}

    return ship, score
