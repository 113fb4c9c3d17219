"""Pareto study: a recipe whose prune stage aims at a latency target, run at several speed-ups,
against uniform-ratio pruning at the same measured latency. Top-1 of each shipped file (in its
runtime, the whole validation split) against its latency and size; every file of the study and
the uncompressed reference timed side by side, interleaved, in one process at the end.

The uniform runs are the same recipe with the aimed prune stage replaced by one uniform ratio
(chosen by measuring uniformly pruned copies until one runs as fast as the aimed model did), at
the channel multiple the aimed run measured, pruned in as many steps as the aimed run took and
trained for as many epochs: the step fine-tunes between steps, then one distillation of the
remaining epochs."""

from __future__ import annotations

import copy
from pathlib import Path

from ..errors import EffvisionError
from ..fileio import read_json, write_text
from ..progress import log
from ..recipe import Recipe, TargetConfig
from ..stages import load_recipe
from .common import Rows, markdown_table, plot_curves

AIMED, UNIFORM = "latency-aware", "uniform"
MATCH = 0.03  # a uniform ratio that measures this close to the aimed model's speed ends the search
# A comparison at matched latency needs the uniform model's speed-up this close to the aimed one's;
# where no ratio measures that close (speed is not monotone in the ratio on every CPU: rounding the
# channels to a multiple alone can be faster) the table says so.
MATCHED = 0.1
SEARCH_STEPS = 7  # bisection steps over the uniform ratio


def aimed_prune(recipe: Recipe) -> tuple[int, TargetConfig]:
    """The index of the prune stage that aims at a target, and its target."""
    for i, s in enumerate(recipe.stages):
        target = s.aimed_target(recipe) if s.type == "prune" else None
        if target is not None:
            return i, target
    raise EffvisionError(
        f"{recipe._source}: study pareto needs a prune stage that aims at a target (a recipe `target:` block, or "
        "the stage's own); this recipe has none"
    )


def check_targets(targets: list[float]) -> list[float]:
    if not targets or any(t <= 1 for t in targets):
        raise EffvisionError(
            f"--targets {','.join(f'{t:g}' for t in targets)}: give speed-ups over the reference, each > 1 "
            "(e.g. 1.5,2,3)"
        )
    return sorted(set(targets))


def at_speedup(recipe: Recipe, index: int, speedup: float) -> Recipe:
    """The recipe with its aimed prune stage's target at `speedup` (backend, batch, max_drop kept)."""
    out = recipe.model_copy(deep=True)
    out._source = recipe._source
    stage = out.stages[index]
    if isinstance(stage.target, TargetConfig):
        stage.target = stage.target.model_copy(update={"speedup": speedup, "latency_ms": None})
    else:
        out.target = out.target.model_copy(update={"speedup": speedup, "latency_ms": None})
    return out


def uniform_recipe(recipe: Recipe, index: int, ratio: float, multiple: int, steps: int) -> Recipe:
    """The recipe with its aimed prune stage replaced by a uniform ratio pruned in `steps` steps
    (as many as the aimed run took, extra steps included) at the same training."""
    from ..compression.stages import DistillConfig

    out = recipe.model_copy(deep=True)
    out._source = recipe._source
    aimed = out.stages[index]
    ft = aimed.finetune
    prune = aimed.model_copy(update={"target": False, "ratio": ratio, "round_to": multiple, "iterative_steps": steps})
    # the aimed stage trains step_epochs after each of its steps and `epochs` at the end; the uniform
    # stage trains between its steps, so the last step's epochs join the final distillation
    distill = DistillConfig(
        name=f"{aimed.name or 'prune'}-distill",
        teacher="auto",
        **ft.model_dump(exclude={"step_epochs", "epochs"}),
        epochs=ft.step_epochs + ft.epochs,
    )
    out.stages[index : index + 1] = [prune, distill]
    return out


def shipped(run_dir: Path) -> dict:
    """The shipped file of a finished run (report.json's ONNX artifact): its path, accuracy and
    size, with the prune stage's input model and record (from its metrics.json)."""
    report = read_json(run_dir / "report.json")
    onnx = report.get("artifacts", {}).get("onnx")
    if onnx is None:
        raise EffvisionError(f"{run_dir}: the recipe shipped no ONNX file; add an export stage")
    stages = {s["stage_dir"]: s for s in report["stages"]}
    final = stages[Path(onnx).parent.name]
    prune_dir = next(d for d, s in stages.items() if s["type"] == "prune")  # its metrics.json has input_model
    prune = read_json(run_dir / "stages" / prune_dir / "metrics.json")
    return {
        "run_dir": str(run_dir),
        "onnx": str(run_dir / onnx),
        "stage": final["name"],
        "accuracy": final["accuracy"],
        "size_bytes": final["size_bytes"],
        "input_model": str(run_dir / prune["input_model"]),
        "pruned_model": str(run_dir / "stages" / prune_dir / "model.pt"),
        "prune": {k: prune.get(k) for k in ("aim", "params", "macs")},
    }


def matched_ratio(aim, model, aimed, importance: str, ignore: list[str], multiple: int) -> dict:
    """The uniform ratio whose pruned copy of `model` runs as fast as the `aimed` model (bisection on
    measurements; untrained copies run as fast as trained ones). Each try is timed interleaved with
    the aimed model and the reference, and matched on its speed relative to the aimed model: a
    figure the aimed run measured once is not a target (one measurement of a Lite0 pruned to 2.3x
    read 3.77x on a shared 2-core machine)."""
    from ..compression.prune import prune

    lo, hi, tried = 0.0, 0.95, []
    aimed = aim.prepared(aimed)  # exported once, timed beside every try
    for _ in range(SEARCH_STEPS):
        ratio = round((lo + hi) / 2, 4)
        candidate = prune(copy.deepcopy(model), ratio, importance, ignore=ignore, round_to=multiple)
        p50 = aim.timings({"aimed": aimed, "candidate": candidate})
        relative = p50["aimed"] / p50["candidate"]  # > 1: the uniform copy runs faster
        tried.append(
            {
                "ratio": ratio,
                "relative": round(relative, 3),
                "speedup": round(p50["reference"] / p50["candidate"], 3),
                "aimed_speedup": round(p50["reference"] / p50["aimed"], 3),
            }
        )
        if abs(relative - 1) <= MATCH:
            break
        lo, hi = (ratio, hi) if relative < 1 else (lo, ratio)
    best = min(tried, key=lambda t: abs(t["relative"] - 1))
    matched = abs(best["relative"] - 1) <= MATCHED
    log(
        f"  uniform ratio {best['ratio']:.3f} measures {best['speedup']:.2f}x (the aimed model "
        f"{best['aimed_speedup']:.2f}x in the same timing)"
        + ("" if matched else f": no ratio tried measured within {MATCHED:.0%}")
    )
    return {**best, "matched": matched, "tried": tried}


def pareto_study(recipe_path: str, sets: list[str], targets: list[float], out_dir: Path, uniform: bool = True) -> dict:
    from ..pipeline import run_pipeline

    targets = check_targets(targets)
    base = load_recipe(recipe_path, sets)
    index, target = aimed_prune(base)
    out_dir = Path(out_dir)
    rows = Rows(out_dir, {"recipe": base._source, "sets": sets, "targets": targets, "uniform": uniform})
    for t in targets:

        def aimed_row(t=t):
            run_dir = out_dir / f"{AIMED}-{t:g}x"
            run_pipeline(at_speedup(base, index, t), run_dir)
            got = shipped(run_dir)
            final = got["prune"]["aim"]["final"]
            return {**got, "met": got["prune"]["aim"]["met"], "stage_speedup": final["speedup"]}

        aimed = rows.measure({"method": AIMED, "target": t}, aimed_row)
        if uniform:
            rows.measure(
                {"method": UNIFORM, "target": t},
                lambda t=t, aimed=aimed: _uniform_row(base, index, target, t, aimed, out_dir),
            )
    timing = time_side_by_side(rows.rows, target, out_dir)
    summary = summarise(rows.rows, timing, target)
    for row, point in zip(rows.rows, summary["points"], strict=True):  # each row's side-by-side figures
        row.update(speedup=point["speedup"], latency_ms=point["latency_ms"])
    rows.save(summary=summary)
    write_text(out_dir / "pareto.md", to_markdown(summary) + "\n")
    plot(summary, out_dir)
    return summary


def _uniform_row(base: Recipe, index: int, target: TargetConfig, t: float, aimed: dict, out_dir: Path) -> dict:
    from ..compression.aim import Aim
    from ..device import resolve_device
    from ..models import load_checkpoint
    from ..models.profile import input_shape
    from ..pipeline import run_pipeline

    stage = base.stages[index]
    multiple = aimed["prune"]["aim"].get("channel_multiple", {}).get("multiple") or stage.round_to or 1
    model = load_checkpoint(aimed["input_model"])
    pruned = load_checkpoint(shipped(Path(aimed["run_dir"]))["pruned_model"])  # (rows saved before it was recorded)
    aim = Aim(target, model, input_shape(model), resolve_device(base.device), stage.aim.warmup, stage.aim.repeats)
    try:
        match = matched_ratio(aim, model, pruned, stage.importance, stage.ignore, multiple)
    finally:
        aim.close()
    run_dir = out_dir / f"{UNIFORM}-{t:g}x"
    steps = len(aimed["prune"]["aim"].get("steps", [])) or stage.aim.steps
    run_pipeline(uniform_recipe(base, index, match["ratio"], multiple, steps), run_dir)
    return {**shipped(run_dir), "ratio": match["ratio"], "channel_multiple": multiple, "ratio_search": match}


def time_side_by_side(rows: list[dict], target: TargetConfig, out_dir: Path) -> dict:
    """Median latency of the reference (the model entering the prune stage, exported to fp32 ONNX)
    and of every shipped file, timed interleaved in one run on the target's backend and batch."""
    import torch

    from ..compression.aim import target_device
    from ..deploy.bench import compare
    from ..models import load_checkpoint
    from ..models.profile import input_shape
    from ..runtimes.onnx_files import export_onnx, onnx_precision

    model = load_checkpoint(rows[0]["input_model"])
    shape = input_shape(model)
    ref = export_onnx(model, out_dir / "reference.onnx", shape)
    files = {"reference": (ref, "fp32")}
    files.update({f"{r['method']} {r['target']:g}x": (r["onnx"], onnx_precision(r["onnx"])) for r in rows})
    device = target_device(target.backend, torch.device("cpu"))
    log(f"timing {len(files)} files side by side on {target.backend} at batch {target.batch}")
    measured = compare(files, shape, target.backend, [target.batch], device, warmup=10, repeats=60, rounds=10)
    return {
        "backend": target.backend,
        "batch": target.batch,
        "p50_ms": {m["target"]: m["p50"] for m in measured},
        "reference_bytes": ref.stat().st_size,
        "rounds": 10,
    }


def summarise(rows: list[dict], timing: dict, target: TargetConfig) -> dict:
    """Per row: the side-by-side latency and speed-up; per target, latency-aware against uniform."""
    p50 = timing["p50_ms"]
    ref_ms = p50["reference"]
    points = []
    for r in rows:
        ms = p50[f"{r['method']} {r['target']:g}x"]
        points.append(
            {
                "method": r["method"],
                "target": r["target"],
                "speedup": round(ref_ms / ms, 3),
                "latency_ms": ms,
                "accuracy": r["accuracy"],
                "size_bytes": r["size_bytes"],
                **({"met": r["met"]} if "met" in r else {"ratio": r["ratio"], "matched": _matched(r)}),
                "run_dir": r["run_dir"],
            }
        )
    comparisons = []
    for t in sorted({p["target"] for p in points}):
        pair = {p["method"]: p for p in points if p["target"] == t}
        if {AIMED, UNIFORM} <= set(pair):
            a, u = pair[AIMED], pair[UNIFORM]
            comparisons.append(
                {
                    "target": t,
                    "accuracy_gain": round(a["accuracy"] - u["accuracy"], 6),
                    "latency_ratio": round(u["latency_ms"] / a["latency_ms"], 3),  # > 1: latency-aware faster
                    "matched": u["matched"],
                }
            )
    return {
        "backend": timing["backend"],
        "batch": timing["batch"],
        "max_drop": target.max_drop,
        "reference": {
            "latency_ms": ref_ms,
            "accuracy": reference_accuracy(rows),
            "size_bytes": timing["reference_bytes"],
        },
        "points": points,
        "comparisons": comparisons,
    }


def _matched(row: dict) -> bool:
    return row.get("ratio_search", {}).get("matched", True)  # (rows of earlier runs: matched by the old rule)


def reference_accuracy(rows: list[dict]) -> float | None:
    """The reference's top-1 as a run measured it (its bench stage's reference), if any did."""
    for r in rows:
        ref = read_json(Path(r["run_dir"]) / "report.json").get("reference")
        if ref and ref.get("accuracy") is not None:
            return ref["accuracy"]
    return None


def to_markdown(s: dict) -> str:
    ref = s["reference"]
    head = ["method", "target", "measured speed-up", "p50 ms", "top-1", "size KB", "met / ratio"]
    body = [
        [
            "reference",
            "-",
            "1.00x",
            f"{ref['latency_ms']:.3f}",
            _acc(ref["accuracy"]),
            f"{ref['size_bytes'] / 1e3:.0f}",
            "-",
        ]
    ]
    for p in sorted(s["points"], key=lambda p: (p["target"], p["method"])):
        note = ("met" if p["met"] else "not met") if "met" in p else f"ratio {p['ratio']:.3f}"
        body.append(
            [
                p["method"],
                f"{p['target']:g}x",
                f"{p['speedup']:.2f}x",
                f"{p['latency_ms']:.3f}",
                _acc(p["accuracy"]),
                f"{p['size_bytes'] / 1e3:.0f}",
                note,
            ]
        )
    lines = [markdown_table(head, body), "", f"Timed side by side on {s['backend']} at batch {s['batch']}."]
    for c in s["comparisons"]:
        lines.append(
            f"- {c['target']:g}x: latency-aware {c['accuracy_gain'] * 100:+.2f} points against uniform, "
            f"uniform {c['latency_ratio']:.2f}x its latency"
            + ("" if c.get("matched", True) else f" (no uniform ratio measured within {MATCHED:.0%} of its speed-up)")
        )
    return "\n".join(lines)


def _acc(a: float | None) -> str:
    return "-" if a is None else f"{a:.4f}"


def plot(s: dict, out_dir: Path) -> None:
    ref = s["reference"]
    reference = ("reference", ref["accuracy"]) if ref["accuracy"] is not None else None
    for key, label, name in (
        ("latency_ms", f"p50 ms ({s['backend']}, batch {s['batch']})", "pareto.png"),
        ("size_bytes", "file size (bytes)", "pareto-size.png"),
    ):
        curves = {
            m: [(p[key], p["accuracy"], 0.0) for p in s["points"] if p["method"] == m]
            for m in (AIMED, UNIFORM)
            if any(p["method"] == m for p in s["points"])
        }
        plot_curves(
            out_dir / name,
            curves,
            label,
            "top-1 of the shipped file",
            "top-1 against " + label.split(" (")[0],
            reference,
        )
