"""Int8 that keeps its accuracy and pays on the machine at hand. Starting from the whole graph in
int8, three measured decisions, each recorded:

1. speed: groups of layers (the stem conv, depthwise convs, the classifier, element-wise and
   pooling nodes) stay float when the file is measured faster without them in int8;
2. accuracy (with `max_drop`): layers are ranked by how much of the int8 file's output error
   reverting each one alone removes, and reverted worst first until the top-1 drop against the
   fp32 file, run in ONNX Runtime on the whole validation split, is at most `max_drop`;
3. the whole file: with `require_faster`, int8 ships only when it is faster than the fp32 file it
   came from at every decision batch, timed interleaved on one backend; otherwise the fp32 file
   ships and the stage says so.
Speed is never read from the CPU's flags: whether int8 pays depends on VNNI, the layer and the
batch, so every speed decision here is a measurement."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..progress import log, track
from .quantize import Int8Builder

BACKEND = "onnxruntime-cpu"  # the runtime the quantize stage's file is made for
MARGIN = 0.03  # a group stays float only when that is faster by more than the timing noise


@dataclass
class Timing:
    """How files are timed against each other: interleaved (bench.compare) at `batches`."""

    shape: list[int]
    batches: list[int]
    warmup: int = 5
    repeats: int = 40
    rounds: int = 8
    backend: str = BACKEND  # where the files are timed (a backend that runs their runtime's files)

    def p50s(self, files: dict[str, Path]) -> dict[str, dict[int, float]]:
        """Median milliseconds by name and batch, all files timed side by side in one process."""
        from ..deploy.bench import compare
        from ..deploy.runtimes import runtime_of_path

        targets = {name: (path, runtime_of_path(path).precision(path)) for name, path in files.items()}
        rows = compare(targets, self.shape, self.backend, self.batches, "cpu", self.warmup, self.repeats, self.rounds)
        out: dict[str, dict[int, float]] = {name: {} for name in files}
        for r in rows:
            out[r["target"]][r["batch"]] = r["p50"]
        return out


def speed_groups(builder: Int8Builder) -> list[tuple[str, list[str]]]:
    """Candidate groups of nodes that may cost more in int8 than they save: a conv on the raw
    input (few channels), depthwise convs (little arithmetic per byte), the classifier (often
    tiny), and the element-wise and pooling nodes (quantize/dequantize around cheap work)."""
    graph_inputs = {builder.input_name}
    weighted = {"Conv", "ConvTranspose", "Gemm", "MatMul"}
    groups = {
        "stem conv": [n.name for n in builder.nodes if n.op_type == "Conv" and graph_inputs & set(n.input)],
        "depthwise convs": [
            n.name
            for n in builder.nodes
            if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)
        ],
        "classifier": [n.name for n in builder.nodes if n.op_type in ("Gemm", "MatMul")][-1:],
        "element-wise and pooling": [n.name for n in builder.nodes if n.op_type not in weighted],
    }
    return [(name, [n for n in nodes if n]) for name, nodes in groups.items() if any(nodes)]


def drop_slow_groups(builder: Int8Builder, timing: Timing, work: Path, float_nodes: set[str]):
    """Greedy, one group at a time against the best file so far: a group stays float when the
    file is faster without it in int8 at every batch (by more than MARGIN)."""
    decisions = []
    best = builder.write(work / "speed-0.onnx", float_nodes)
    for k, (name, nodes) in enumerate(speed_groups(builder), 1):
        trial_nodes = float_nodes | set(nodes)
        if trial_nodes == float_nodes:
            continue
        trial = builder.write(work / f"speed-{k}.onnx", trial_nodes)
        p50 = timing.p50s({"int8": best, "float": trial})
        faster = all(p50["float"][b] < (1 - MARGIN) * p50["int8"][b] for b in timing.batches)
        decisions.append(
            {
                "group": name,
                "layers": len(nodes),
                "p50_ms_int8": p50["int8"],
                "p50_ms_float": p50["float"],
                "decision": "float" if faster else "int8",
            }
        )
        if faster:
            float_nodes, best = trial_nodes, trial
    return float_nodes, decisions


def _outputs(path: Path, samples: np.ndarray) -> np.ndarray:
    from ..deploy.runtime import ort_session, run_session

    session = ort_session(path)
    return np.concatenate([run_session(session, samples[i : i + 64]) for i in range(0, len(samples), 64)])


def _relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(((out - ref) ** 2).sum() / max(float((ref**2).sum()), 1e-12))


def rank_nodes(builder: Int8Builder, fp32: Path, samples: np.ndarray, work: Path, float_nodes: set[str]) -> list[dict]:
    """Per-node sensitivity: how much of the int8 file's output error (squared logit error
    relative to the fp32 file's logits, on `samples`) goes away when that node alone computes in
    float. Every quantized node is ranked, not only layers with weights: in a net like RepViT the
    loss sits in quantized activations (GELU, sigmoid gates, residual adds). Most sensitive first."""
    ref = _outputs(fp32, samples)
    base = _relative_error(_outputs(builder.write(work / "rank-all.onnx", float_nodes), samples), ref)
    ranked = []
    op = {n.name: n.op_type for n in builder.nodes}
    candidates = [name for name in builder.quantized_nodes if name not in float_nodes]
    for name in track(candidates, "int8 sensitivity"):
        path = builder.write(work / "rank-one.onnx", float_nodes | {name})
        error = _relative_error(_outputs(path, samples), ref)
        ranked.append({"layer": name, "op": op.get(name), "sensitivity": round(base - error, 8)})
    return sorted(ranked, key=lambda r: -r["sensitivity"])


def revert_until(
    builder: Int8Builder,
    ranked: list[dict],
    top1: Callable[[Path], float],
    fp32_accuracy: float,
    max_drop: float,
    work: Path,
    float_nodes: set[str],
) -> tuple[set[str], list[dict], Path, bool]:
    """Revert the most sensitive layers, doubling their number (1, 2, 4, ...) until the drop is
    at most max_drop on the validation split, then bisect back to the fewest that meet it."""
    steps: dict[int, dict] = {}

    def attempt(k: int) -> bool:
        nodes = float_nodes | {r["layer"] for r in ranked[:k]}
        path = builder.write(work / f"revert-{k}.onnx", nodes)
        acc = top1(path)
        steps[k] = {"reverted": k, "accuracy": acc, "drop": round(fp32_accuracy - acc, 6), "path": path, "nodes": nodes}
        log(f"  int8 with {k} node(s) in float: top-1 {acc:.4f} (drop {fp32_accuracy - acc:+.4f})")
        return fp32_accuracy - acc <= max_drop

    low, k = 0, 1  # low: the largest count known to fail
    while k < len(ranked) and not attempt(k):
        low, k = k, 2 * k
    k = min(k, len(ranked))
    met = attempt(k) if k not in steps else steps[k]["drop"] <= max_drop
    high = k
    while met and high - low > 1:
        mid = (low + high) // 2
        if attempt(mid):
            high = mid
        else:
            low = mid
    best = steps[high]
    for r in ranked:
        r["decision"] = "reverted" if r["layer"] in best["nodes"] else "kept"
    public = [{k: v for k, v in s.items() if k not in ("path", "nodes")} for _, s in sorted(steps.items())]
    return best["nodes"], public, best["path"], met


@dataclass
class SpeedCheck:
    """int8 against the fp32 file it replaces, timed side by side at every decision batch."""

    faster: bool
    why: str
    record: dict


def faster_than_fp32(fp32: Path, int8: Path, timing: Timing) -> SpeedCheck:
    """require_faster: int8 ships only when it is faster than fp32 at every batch."""
    p50 = timing.p50s({"fp32": fp32, "int8": int8})
    slower = [b for b in timing.batches if p50["int8"][b] >= p50["fp32"][b]]
    record = {"backend": timing.backend, "batches": timing.batches, "p50_ms": p50, "int8_slower_at": slower}
    if slower:
        b = slower[0]
        why = (
            f"fp32: int8 is not faster than fp32 at batch {b} ({p50['int8'][b]:.3f} vs {p50['fp32'][b]:.3f} ms "
            f"p50, {timing.backend}, interleaved)"
        )
        return SpeedCheck(False, why, record)
    ratios = ", ".join(f"{p50['fp32'][b] / p50['int8'][b]:.2f}x at b={b}" for b in timing.batches)
    return SpeedCheck(True, f"faster than fp32: {ratios}", record)


@dataclass
class Int8Result:
    """What the search decided and the file to ship."""

    path: Path
    float_nodes: set[str]
    layers: int
    speed_groups: list[dict] = field(default_factory=list)
    accuracy_search: dict | None = None
    speed_check: dict | None = None
    shipped: str = "int8"
    decision: str = ""


def search_int8(
    builder: Int8Builder,
    fp32: Path,
    dst: Path,
    timing: Timing | None,
    speed_aware: bool,
    require_faster: bool,
    max_drop: float | None,
    top1: Callable[[Path], float],
    rank_samples: np.ndarray,
    float_nodes: set[str] = frozenset(),
    reference_accuracy: float | None = None,
) -> Int8Result:
    """The int8 file to ship at dst (or the fp32 file, when int8 does not pay), with every decision.
    max_drop is measured from `reference_accuracy` (the uncompressed model's, when a target's floor
    is held across stages), else from the fp32 file's."""
    work = dst.parent / "int8-search"
    work.mkdir(exist_ok=True)
    float_nodes = set(float_nodes)
    result = Int8Result(dst, float_nodes, len(builder.layers))
    if speed_aware and timing is not None:
        float_nodes, result.speed_groups = drop_slow_groups(builder, timing, work, float_nodes)
        for d in result.speed_groups:
            log(f"  int8 speed: {d['group']} ({d['layers']} nodes) stays {d['decision']}")
    candidate = builder.write(work / "int8.onnx", float_nodes)
    if max_drop is not None:
        fp32_acc, int8_acc = top1(fp32), top1(candidate)
        if reference_accuracy is not None:
            fp32_acc = reference_accuracy  # the floor's: what the uncompressed model scored
        search = {
            "max_drop": max_drop,
            "measured_from": "the uncompressed model" if reference_accuracy is not None else "the fp32 file",
            "fp32_accuracy": fp32_acc,
            "int8_accuracy": int8_acc,
            "ranking": [],
            "steps": [],
        }
        met = fp32_acc - int8_acc <= max_drop
        if not met:
            ranked = rank_nodes(builder, fp32, rank_samples, work, float_nodes)
            float_nodes, search["steps"], candidate, met = revert_until(
                builder, ranked, top1, fp32_acc, max_drop, work, float_nodes
            )
            search["ranking"] = ranked
        search["met"] = met
        result.accuracy_search = search
    result.float_nodes = float_nodes
    shipped, why = (
        candidate,
        (
            f"int8 ({len(float_nodes & set(builder.layers))} of {result.layers} layers and "
            f"{len(float_nodes - set(builder.layers))} other nodes float)"
        ),
    )
    if result.accuracy_search and not result.accuracy_search["met"]:
        shipped, result.shipped = fp32, "fp32"
        why = f"fp32: no int8 file lost at most max_drop {max_drop}, even with every quantized node in float"
    elif require_faster and timing is not None:
        check = faster_than_fp32(fp32, candidate, timing)
        result.speed_check = check.record
        if not check.faster:
            shipped, result.shipped, why = fp32, "fp32", check.why
        else:
            why += f", {check.why}"
    shutil.copyfile(shipped, dst)
    result.decision = f"ships {why}"
    log(f"  quantize {result.decision}")
    return result
