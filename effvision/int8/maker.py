"""The one int8 maker and the one ship-or-fp32 decision, for any runtime (called by the plan, the
quantize stage and QAT).

make_int8 asks the file's runtime (runtimes/) for its int8: where the runtime's tool can keep
named nodes in float (ONNX Runtime), layer groups measured slower stay float and, under a floor,
the most sensitive nodes go back to float until it holds (node_search.py); elsewhere the tool
quantizes the whole graph and, under a floor it misses, its accuracy control (NNCF's) puts ops back
in float where the tool has one. ship_or_fp32 then ships int8 only when it holds the floor and,
with require_faster, is measured faster than the fp32 file at every decision batch. Every top-1
here is the caller's `score` (the decision split: never the split the report prints)."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..progress import log
from .node_search import drop_slow_groups, rank_nodes, revert_until
from .timing import Timing, faster_than_fp32


@dataclass
class Floor:
    """The largest top-1 loss int8 may take, and the accuracy it is measured from (None: the fp32
    file's own, scored when needed; else the uncompressed model's, where a target's floor is held
    across stages)."""

    max_drop: float
    reference_accuracy: float | None = None

    @property
    def measured_from(self) -> str:
        return "the fp32 file" if self.reference_accuracy is None else "the uncompressed model"


@dataclass
class Int8Settings:
    """How int8 is made and when it ships (the quantize stage's keys, the plan's and QAT's)."""

    method: str = "percentile"  # activation ranges: minmax, percentile, entropy (ONNX Runtime's calibrators)
    per_channel: bool = True
    reduce_range: bool | str = "auto"  # 7-bit weights; auto: when the CPU lacks VNNI
    speed_aware: bool = True  # layer groups measured slower stay float (runtimes that keep nodes float)
    require_faster: bool = True  # ship int8 only when measured faster than fp32
    accuracy_control: bool = True  # the runtime tool's own accuracy control, where int8 misses the floor
    rank_samples: int = 256
    exclude: frozenset[str] = frozenset()  # node names kept in float from the start


@dataclass
class Int8Result:
    """What was decided and the file that ships (dst: the int8 file, or a copy of the fp32 one)."""

    path: Path
    shipped: str = "int8"
    decision: str = ""
    tool: str = ""
    float_nodes: set[str] = field(default_factory=set)
    layers: list[str] = field(default_factory=list)  # the layers with weights (runtimes that keep nodes float)
    reduce_range: bool | None = None
    speed_groups: list[dict] = field(default_factory=list)
    accuracy_search: dict | None = None
    speed_check: dict | None = None
    int8_path: Path | None = None  # the int8 candidate, in `work`, whatever shipped


def make_int8(
    runtime,
    fp32: Path,
    dst: Path,
    calibration: list,
    settings: Int8Settings,
    score: Callable[[Path], float],
    floor: Floor | None = None,
    timing: Timing | None = None,
    validation=None,
) -> Int8Result:
    """The file to ship at dst: int8 by the runtime's tool when it holds `floor` (scored by `score`)
    and pays (timing), else the fp32 file; `validation` ((x, y) batches of the decision split) is
    what an accuracy control ranks ops on. A runtime with no int8 tool for a file says so in one line."""
    work = Path(tempfile.mkdtemp(prefix="int8-", dir=dst.parent))
    try:
        if runtime.keeps_float:
            result = _searched(runtime, fp32, work, calibration, settings, score, floor, timing)
        else:
            result = _whole_graph(runtime, fp32, work, calibration, settings, score, floor, validation)
        shipped, why, result.speed_check = ship_or_fp32(
            fp32, result.int8_path, result.decision, _held(result), settings.require_faster, timing
        )
        result.shipped = "int8" if shipped == result.int8_path else "fp32"
        runtime.copy(shipped, dst)
        result.path, result.int8_path, result.decision = dst, None, f"ships {why}"
        log(f"  int8 {result.decision}")
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ship_or_fp32(
    fp32: Path, int8: Path, made: str, held: bool | str, require_faster: bool, timing: Timing | None
) -> tuple[Path, str, dict | None]:
    """(the file that ships, why, the speed check's record): int8 when it holds the floor (`held`:
    True, or why not) and, with require_faster, is faster than fp32 at every decision batch."""
    if held is not True:
        return fp32, f"fp32: {held}", None
    if not require_faster or timing is None:
        return int8, made, None
    check = faster_than_fp32(fp32, int8, timing)
    return (int8, f"{made}, {check.why}", check.record) if check.faster else (fp32, check.why, check.record)


def _held(result: Int8Result) -> bool | str:
    search = result.accuracy_search
    if search is None or search["met"]:
        return True
    if search.get("steps"):
        return f"no int8 file lost at most max_drop {search['max_drop']}, even with every quantized node in float"
    lost = 100 * (search["fp32_accuracy"] - search["int8_accuracy"])
    return f"int8 by {result.tool} loses {lost:.2f} points, past max_drop {search['max_drop']}"


def _accuracy_record(floor: Floor, fp32_accuracy: float, int8_accuracy: float) -> dict:
    return {
        "max_drop": floor.max_drop,
        "measured_from": floor.measured_from,
        "fp32_accuracy": fp32_accuracy,
        "int8_accuracy": int8_accuracy,
        "met": fp32_accuracy - int8_accuracy <= floor.max_drop + 1e-9,
    }


def _searched(runtime, fp32, work, calibration, settings, score, floor, timing) -> Int8Result:
    """Node search: layer groups measured slower stay float; under a floor, the most sensitive nodes
    go back to float until it holds."""
    options = dict(method=settings.method, per_channel=settings.per_channel, reduce_range=settings.reduce_range)
    variants = runtime.int8_variants(fp32, calibration, work / "variants", **options)
    unknown = sorted(set(settings.exclude) - {n.name for n in variants.nodes})
    if unknown:
        from ..errors import EffvisionError

        raise EffvisionError(f"quantize: exclude names nodes not in {fp32}: {', '.join(unknown[:5])}")
    result = Int8Result(fp32, tool=runtime.int8_tool, layers=variants.layers, reduce_range=variants.reduce_range)
    float_nodes = set(settings.exclude)
    if settings.speed_aware and timing is not None:
        float_nodes, result.speed_groups = drop_slow_groups(variants, timing, work, float_nodes)
        for d in result.speed_groups:
            log(f"  int8 speed: {d['group']} ({d['layers']} nodes) stays {d['decision']}")
    candidate = variants.write(work / "int8.onnx", float_nodes)
    if floor is not None:
        fp32_acc = score(fp32) if floor.reference_accuracy is None else floor.reference_accuracy
        search = {**_accuracy_record(floor, fp32_acc, score(candidate)), "ranking": [], "steps": []}
        if not search["met"]:
            samples = _samples(calibration, settings.rank_samples)
            ranked = rank_nodes(variants, fp32, samples, work, float_nodes)
            float_nodes, search["steps"], candidate, search["met"] = revert_until(
                variants, ranked, score, fp32_acc, floor.max_drop, work, float_nodes
            )
            search["ranking"] = ranked
        result.accuracy_search = search
    result.float_nodes, result.int8_path = float_nodes, candidate
    layers = set(variants.layers)
    result.decision = (
        f"int8 ({len(float_nodes & layers)} of {len(layers)} layers and {len(float_nodes - layers)} other nodes float)"
    )
    return result


def _whole_graph(runtime, fp32, work, calibration, settings, score, floor, validation) -> Int8Result:
    """The runtime's tool on the whole graph; under a floor it misses, its accuracy control."""
    candidate = runtime.quantize(fp32, work / f"int8{runtime.suffix}", calibration)
    result = Int8Result(fp32, tool=runtime.int8_tool, int8_path=candidate, decision=f"int8 by {runtime.int8_tool}")
    if floor is None:
        return result
    fp32_acc = score(fp32) if floor.reference_accuracy is None else floor.reference_accuracy
    search = _accuracy_record(floor, fp32_acc, score(candidate))
    log(f"  int8 top-1 {search['int8_accuracy']:.4f} against {fp32_acc:.4f} (floor {floor.max_drop})")
    if not search["met"] and settings.accuracy_control and runtime.accuracy_control and validation is not None:
        control = _controlled(runtime, fp32, work, calibration, validation, score, floor, fp32_acc)
        made = control.pop("path", None)
        if made is not None:
            result.int8_path = made
            search.update(int8_accuracy=control["int8_accuracy"], met=control["met"])
            result.decision = f"int8 by {runtime.int8_tool}'s accuracy control"
        search["accuracy_control"] = control
    result.accuracy_search = search
    return result


def _controlled(runtime, fp32, work, calibration, validation, score, floor: Floor, floor_from: float) -> dict:
    """int8 by the tool's accuracy control: ops back in float until the file loses at most what the
    floor leaves it against the fp32 file (max_drop less what earlier stages lost). The record, with
    the file (`path`) and its top-1 (by `score`) when made."""
    src_acc = score(fp32) if floor.reference_accuracy is not None else floor_from
    budget = round(floor.max_drop - (floor_from - src_acc), 6)
    record = {"max_drop_against_input": budget, "input_accuracy": src_acc}
    if budget <= 0:
        log(f"  no int8 accuracy control: the stages before it left no room under the floor ({budget:+.4f})")
        return {**record, "met": False}
    log(f"  int8 by the tool's accuracy control: at most {budget} below {fp32.name}'s {src_acc:.4f}")
    path = runtime.quantize_within(fp32, work / f"int8-controlled{runtime.suffix}", calibration, validation, budget)
    acc = score(path)
    met = floor_from - acc <= floor.max_drop + 1e-9
    log(f"  accuracy-controlled int8 top-1 {acc:.4f} ({'within' if met else 'past'} the floor)")
    return {**record, "path": path, "int8_accuracy": acc, "met": met}


def _samples(loader, n: int) -> np.ndarray:
    """The first n inputs of (x, y) batches, as one array (what node sensitivity is measured on)."""
    xs, count = [], 0
    for x, *_ in loader:
        xs.append(x.numpy() if hasattr(x, "numpy") else np.asarray(x))
        count += len(x)
        if count >= n:
            break
    return np.concatenate(xs)[:n]
