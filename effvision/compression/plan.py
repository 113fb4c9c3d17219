"""A target spent cheapest-accuracy first: before any stage trades accuracy, the plan stage
measures on the uncompressed model what each cheap lever gives here and what it costs (DESIGN,
"A target is a budget spent cheapest-accuracy first").

The levers: int8 (on ONNX Runtime the quantize stage's search: layer groups measured slower stay
float, the most sensitive nodes go back to float until the target's max_drop holds; on OpenVINO and
LiteRT the runtime's own tool, NNCF or the LiteRT tools, on the whole graph), and every lower input size
the target lists, each in fp32 and int8 (they do not multiply: on one AVX-512 EPYC int8 paid 2.0x
at 112 px and nothing at 80). Every file is one of the target backend's runtime (ONNX, IR or
.tflite), timed interleaved with the reference (the model's fp32 file of that runtime at its own
size) on the target's backend and batch, scored in that runtime on training images the
run holds out. The plan keeps the combination that meets the target (with the aim's margin) at the
least accuracy; else the fastest one within the floor, and pruning is left the remainder, timed in
the precision the plan ships. A lower input size is scored as a pruning candidate is: batch-norm
statistics recomputed at that size, before any training (the distillation that follows recovers
more)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import ClassVar, Literal

import torch
from pydantic import Field

from ..data.selectors import CalibrationConfig
from ..errors import EffvisionError
from ..progress import log
from ..recipe import StageConfig
from ..stage import StageResult, register_stage

# where the int8 search (layer groups, node reverts) decides; on OpenVINO and LiteRT their own tool does
INT8_BACKEND = "onnxruntime-cpu"


class PlanConfig(StageConfig):
    type: Literal["plan"] = "plan"
    reads_recipe_target: ClassVar[bool] = True  # the target is one of its inputs (the run's fingerprint)
    int8: bool = Field(
        True,
        description="measure int8 as a lever: the quantize stage's search on onnxruntime-cpu, the runtime's own "
        "tool on openvino-cpu (NNCF) and litert-cpu (the LiteRT tools)",
    )
    calibration: CalibrationConfig = Field(
        default_factory=lambda: CalibrationConfig(n=512), description="{selector, n}: the samples that calibrate int8"
    )
    method: Literal["minmax", "percentile", "entropy"] = Field(
        "percentile", description="how int8 activation ranges are calibrated (as the quantize stage)"
    )
    score_samples: int = Field(
        5000, ge=100, description="training images the run holds out, on which every lever's top-1 is scored"
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

    def recipe_problem(self, recipe) -> str | None:
        if recipe.target is None:
            return "a plan stage spends the recipe's target: add a target block (speedup or latency_ms, max_drop)"
        return None


def _resized(loader, size: int):
    """The loader's batches at `size` (bicubic, antialiased): what a lower input size sees."""
    for x, y in loader:
        if x.shape[-1] != size:
            x = torch.nn.functional.interpolate(x, size=(size, size), mode="bicubic", antialias=True)
        yield x, y


def _scorer(loader):
    """Top-1 of a file, run in its runtime, on the held-out images at the file's own input size."""
    from ..deploy import evaluate
    from ..deploy.runtimes import runtime_of_path

    def top1(path: Path) -> float:
        size = runtime_of_path(path).input_shape(path)[-1]
        return evaluate(path, _resized(loader, int(size)))

    return top1


def target_runtime(backend_name: str):
    """The runtime whose files a target's backend runs: the plan measures its levers as those
    files. A backend that runs torch models, or programs of one batch size, has none to plan with."""
    from ..deploy.backends import backend
    from ..deploy.runtimes import runtime_taking

    runtime = runtime_taking(backend(backend_name).takes)
    if runtime.suffix is None or runtime.fixed_batch:
        raise EffvisionError(
            f"plan: levers are measured as files of any batch size (ONNX, OpenVINO IR, LiteRT); target.backend "
            f"{backend_name} runs {runtime.describes}"
        )
    return runtime


def export_fp32(runtime, model, path: Path, shape: list[int]) -> Path:
    """The model as an fp32 file of the runtime."""
    from ..deploy.exporters import get_exporter

    return get_exporter(runtime.export_format, "fp32").export(model, path, shape, "fp32", ())


def quantize_own(runtime, fp32: Path, dst: Path, calib) -> Path:
    """An fp32 file of the runtime in int8 by the runtime's own tool (NNCF for OpenVINO, the LiteRT
    tools for LiteRT), calibrated on `calib`'s batches at the file's own input size."""
    from ..deploy.exporters import get_exporter

    size = runtime.input_shape(fp32)[-1]
    return get_exporter(runtime.export_format, "int8").quantize_file(fp32, dst, list(_resized(calib, int(size))))


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
    update_bn(_resized(ctx.data.train_eval_loader(picked, batch_size=128), size), model, ctx.device)
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


@register_stage("plan", PlanConfig)
def run_plan(ctx, cfg: PlanConfig) -> StageResult:
    """Measure the cheap levers on the model entering the stage and keep those a target needs."""
    from ..deploy.bench import compare
    from .int8_search import search_int8
    from .quantize import Int8Builder
    from .stages import _samples, speed_timing

    target = ctx.recipe.target
    runtime = target_runtime(target.backend)
    shape = list(ctx.input_shape)
    full = shape[-1]
    _check_sizes(target.resolutions, full, ctx.data.modality)
    held_out, where = ctx.data.held_out_loader(cfg.score_samples, ctx.seed)
    top1 = _scorer(held_out)
    work = ctx.stage_dir / "levers"
    work.mkdir(exist_ok=True)
    sizes = [full] + [r for r in target.resolutions if r < full]
    at = {r: [*shape[:-2], r, r] for r in sizes}  # the input shape at each size
    fp32 = {r: export_fp32(runtime, _at_size(ctx, r, full), work / f"fp32-{r}{runtime.suffix}", at[r]) for r in sizes}
    files = {f"fp32@{r}": (fp32[r], "fp32", at[r]) for r in sizes}
    int8_record = None
    if cfg.int8 and target.backend == INT8_BACKEND:
        calib = ctx.calibration_loader(cfg.calibration)
        builder = Int8Builder(fp32[full], calib, work / "int8-work", cfg.method)
        timing = speed_timing(ctx, _Timed(cfg))
        result = search_int8(
            builder,
            fp32[full],
            work / f"int8-{full}.onnx",
            timing,
            True,
            True,
            target.max_drop,
            top1,
            _samples(calib, 256) if target.max_drop is not None else None,
        )
        int8_record = {
            "shipped": result.shipped,
            "decision": result.decision,
            "float_nodes": sorted(result.float_nodes),
            "speed_groups": result.speed_groups,
            "accuracy_search": _without_ranking(result.accuracy_search),
        }
        if result.shipped == "int8":
            floats = set(result.float_nodes)
            files[f"int8@{full}"] = (work / f"int8-{full}.onnx", "int8", at[full])
            for r in sizes[1:]:
                # the same model at another size: its nodes have the same names, and the same ones stay float
                small = Int8Builder(fp32[r], list(_resized(calib, r)), work / f"int8-work-{r}", cfg.method)
                floats_here = floats & {n.name for n in small.nodes}
                files[f"int8@{r}"] = (small.write(work / f"int8-{r}.onnx", floats_here), "int8", at[r])
    elif cfg.int8 and runtime.kind != "onnx":  # the runtime's own int8 tool, the whole graph
        calib = list(ctx.calibration_loader(cfg.calibration))
        for r in sizes:
            files[f"int8@{r}"] = (
                quantize_own(runtime, fp32[r], work / f"int8-{r}{runtime.suffix}", calib),
                "int8",
                at[r],
            )
        int8_record = {"shipped": "int8", "tool": runtime.int8_tool, "decision": f"int8 by {runtime.int8_tool}"}
        log(f"  plan: int8 levers by {runtime.int8_tool}, timed on {target.backend}")
    elif cfg.int8:
        log(f"  plan: int8 is measured on {INT8_BACKEND}; the target runs on {target.backend}: fp32 levers only")
    rows = compare(
        {"reference": (fp32[full], "fp32", at[full]), **{k: v for k, v in files.items() if k != f"fp32@{full}"}},
        shape,
        target.backend,
        [target.batch],
        torch.device("cpu"),
        cfg.warmup,
        cfg.repeats,
        rounds=min(8, cfg.repeats),
    )
    p50 = {r["target"]: r["p50"] for r in rows}
    p50[f"fp32@{full}"] = p50.pop("reference")
    base = top1(fp32[full])
    levers = []
    for name, (path, precision, (*_, size)) in files.items():
        acc = base if name == f"fp32@{full}" else top1(path)
        levers.append(
            {
                "lever": name,
                "precision": precision,
                "size": size,
                "p50_ms": p50[name],
                "speedup": round(p50[f"fp32@{full}"] / p50[name], 3),
                "top1": acc,
                "cost": round(base - acc, 6),
                "file": ctx.rel(path),
            }
        )
    goal = None if target.floor_only else target.speedup or p50[f"fp32@{full}"] / target.latency_ms
    kept, meets, why = choose(levers, goal, target.max_drop, cfg.margin)
    kept["kept"] = True
    remainder = 1.0 if meets else None if goal is None else goal / kept["speedup"]
    for lv in levers:
        log(
            f"  plan: {lv['lever']:>9} {lv['p50_ms']:.3f} ms, {lv['speedup']:.2f}x, top-1 {lv['top1']:.4f} "
            f"({-100 * lv['cost']:+.2f} points){'  <- kept' if lv.get('kept') else ''}"
        )
    log(f"  plan keeps {kept['lever']}: {why}")
    shutil.rmtree(work / "int8-work", ignore_errors=True)
    for r in sizes[1:]:
        shutil.rmtree(work / f"int8-work-{r}", ignore_errors=True)
    plan = {
        "goal_speedup": None if goal is None else round(goal, 4),
        "max_drop": target.max_drop,
        "backend": target.backend,
        "batch": target.batch,
        "scored_on": where,
        "reference": {"size": full, "p50_ms": p50[f"fp32@{full}"], "top1": base},
        "levers": levers,
        "kept": {k: kept[k] for k in ("lever", "precision", "size", "speedup", "cost")},
        "why": why,
        "remainder": None if remainder is None else round(remainder, 4),
        "prune": remainder is None or remainder > 1.0,
        "int8": int8_record,
        "method": cfg.method,
        "calibration": cfg.calibration.n,
        "score_samples": cfg.score_samples,
        "timed": f"interleaved, {cfg.repeats} calls per file in {min(8, cfg.repeats)} rounds",
    }
    return StageResult({"accuracy": None, "time_to_accuracy_s": None, "plan": plan}, {})


class _Timed:
    """The plan's timing settings as the quantize stage's speed check reads them."""

    def __init__(self, cfg: PlanConfig):
        self.batches, self.warmup, self.repeats = None, cfg.warmup, max(40, cfg.repeats // 2)


def _without_ranking(search: dict | None) -> dict | None:
    """An int8 accuracy search's record without the per-node ranking (kept in the quantize stage)."""
    return None if search is None else {k: v for k, v in search.items() if k != "ranking"}


def plan_of(ctx) -> dict | None:
    """The plan the run's last plan stage made, if any."""
    return next((r["plan"] for r in reversed(ctx.records) if r["type"] == "plan"), None)


def int8_like(plan: dict, calib, method: str):
    """fp32 file -> the int8 file the plan's int8 lever was made as, beside it."""
    runtime = target_runtime(plan["backend"])
    if runtime.kind == "onnx":
        return _onnx_int8_like(plan, calib, method)
    return lambda fp32: quantize_own(runtime, fp32, fp32.with_name(fp32.stem + ".int8" + fp32.suffix), calib)


def _onnx_int8_like(plan: dict, calib, method: str):
    """fp32 ONNX file -> an int8 file made as the plan's (the same nodes float: layer groups it
    measured slower, nodes its accuracy search reverted), beside it: how a pruned candidate is
    timed and scored in the precision that ships."""
    from .quantize import Int8Builder

    floats = set(plan["int8"]["float_nodes"])

    def ship(fp32: Path) -> Path:
        builder = Int8Builder(fp32, calib, fp32.parent / "int8-work", method)
        path = builder.write(fp32.with_name(fp32.stem + ".int8.onnx"), floats & {n.name for n in builder.nodes})
        shutil.rmtree(fp32.parent / "int8-work", ignore_errors=True)
        return path

    return ship


def shipping(ctx, plan: dict | None):
    """What a stage aiming after the plan needs: the fp32 -> shipped-file function (None when fp32
    ships) and the held-out scorer of a torch model in that precision (None without a plan)."""
    import tempfile

    if plan is None:
        return None, None
    runtime = target_runtime(plan["backend"])
    ship = None
    if plan["kept"]["precision"] == "int8":
        calib = list(ctx.calibration_loader(CalibrationConfig(n=plan["calibration"])))
        ship = int8_like(plan, calib, plan["method"])
    held_out, _ = ctx.data.held_out_loader(plan["score_samples"], ctx.seed)
    top1 = _scorer(held_out)

    def score(model) -> dict:
        """The model's top-1 on the plan's held-out images, in the precision that ships, and its
        drop from the uncompressed model's there."""
        with tempfile.TemporaryDirectory() as tmp:
            path = export_fp32(runtime, model, Path(tmp) / f"model{runtime.suffix}", list(ctx.input_shape))
            acc = top1(ship(path) if ship else path)
        drop = round(plan["reference"]["top1"] - acc, 6)
        held = plan["max_drop"] is None or drop <= plan["max_drop"] + 1e-9
        return {"top1": acc, "drop": drop, "held": held}

    return ship, score
