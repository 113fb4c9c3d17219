"""Which nodes of an int8 file stay in float, for a runtime whose int8 tool can keep named nodes in
float (ONNX Runtime's QDQ files): two measured searches over one calibrated file's variants.

1. speed: groups of layers (the stem conv, depthwise convs, the classifier, element-wise and
   pooling nodes) stay float when the file is measured faster without them in int8;
2. accuracy (with a floor): nodes are ranked by how much of the int8 file's output error
   reverting each one alone removes, and reverted worst first until the top-1 drop, scored on the
   decision split, is within the floor.
Speed is never read from the CPU's flags: whether int8 pays depends on VNNI, the layer and the
batch, so every speed decision here is a measurement."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from ..progress import log, track
from .timing import Timing

MARGIN = 0.03  # a group stays float only when that is faster by more than the timing noise


def speed_groups(builder) -> list[tuple[str, list[str]]]:
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


def drop_slow_groups(builder, timing: Timing, work: Path, float_nodes: set[str]):
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
    from ..runtimes import open_file

    session = open_file(path)
    return np.concatenate([session.run(samples[i : i + 64]) for i in range(0, len(samples), 64)])


def _relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(((out - ref) ** 2).sum() / max(float((ref**2).sum()), 1e-12))


def rank_nodes(builder, fp32: Path, samples: np.ndarray, work: Path, float_nodes: set[str]) -> list[dict]:
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
    builder,
    ranked: list[dict],
    top1: Callable[[Path], float],
    fp32_accuracy: float,
    max_drop: float,
    work: Path,
    float_nodes: set[str],
) -> tuple[set[str], list[dict], Path, bool]:
    """Revert the most sensitive layers, doubling their number (1, 2, 4, ...) until the drop is
    at most max_drop (scored by `top1`, on the decision split), then bisect back to the fewest that meet it."""
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
