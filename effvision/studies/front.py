"""Accuracy floors as the front: a recipe with a plan stage, run once per floor as a target with
max_drop alone (the fastest file within it), every shipped file and the uncompressed reference
then timed side by side, interleaved, in one process. What a user picks from: the fastest file
that loses at most 0.5, 1 or 2 points."""

from __future__ import annotations

from pathlib import Path

from ..errors import EffvisionError
from ..fileio import write_text
from ..recipe import Recipe
from ..stages import load_recipe
from .common import Rows, markdown_table
from .pareto import reference_accuracy, shipped, time_side_by_side

METHOD = "within floor"


def check_floors(floors: list[float]) -> list[float]:
    if not floors or any(not 0 <= f < 1 for f in floors):
        raise EffvisionError(
            f"--floors {','.join(f'{f:g}' for f in floors)}: give top-1 losses in [0, 1), e.g. 0.005,0.01,0.02"
        )
    return sorted(set(floors))


def at_floor(recipe_path: str, sets: list[str], floor: float) -> Recipe:
    """The recipe whose target asks for the fastest file losing at most `floor` (validated as a
    recipe: a floor alone needs a plan stage and step-wise pruning)."""
    recipe = load_recipe(
        recipe_path, [*sets, "target.speedup=null", "target.latency_ms=null", f"target.max_drop={floor}"]
    )
    if not any(s.type == "plan" for s in recipe.stages):
        raise EffvisionError(f"{recipe._source}: study front needs a recipe with a plan stage (and a prune stage)")
    return recipe


def front_study(recipe_path: str, sets: list[str], floors: list[float], out_dir: Path) -> dict:
    from ..pipeline import run_pipeline

    floors = check_floors(floors)
    recipes = {f: at_floor(recipe_path, sets, f) for f in floors}  # every floor checked before any run
    base = recipes[floors[0]]
    out_dir = Path(out_dir)
    rows = Rows(out_dir, {"recipe": base._source, "sets": sets, "floors": floors})
    for f in floors:

        def row(f=f):
            run_dir = out_dir / f"floor-{f:g}"
            run_pipeline(recipes[f], run_dir)
            return shipped(run_dir)

        rows.measure({"method": METHOD, "target": f}, row)
    timing = time_side_by_side(rows.rows, base.target, out_dir)
    p50 = timing["p50_ms"]
    ref_accuracy = reference_accuracy(rows.rows)
    points = [
        {
            "floor": r["target"],
            "speedup": round(p50["reference"] / p50[f"{METHOD} {r['target']:g}x"], 3),
            "latency_ms": p50[f"{METHOD} {r['target']:g}x"],
            "accuracy": r["accuracy"],
            "drop": None if ref_accuracy is None else round(ref_accuracy - r["accuracy"], 6),
            "size_bytes": r["size_bytes"],
            "run_dir": r["run_dir"],
        }
        for r in rows.rows
    ]
    summary = {
        "backend": timing["backend"],
        "batch": timing["batch"],
        "reference": {"latency_ms": p50["reference"], "accuracy": ref_accuracy},
        "points": points,
    }
    rows.save(summary=summary)
    write_text(out_dir / "front.md", to_markdown(summary) + "\n")
    return summary


def to_markdown(s: dict) -> str:
    ref = s["reference"]
    acc = "-" if ref["accuracy"] is None else f"{ref['accuracy']:.4f}"
    body = [["reference", "1.00x", f"{ref['latency_ms']:.3f}", acc, "-", "-"]]
    for p in sorted(s["points"], key=lambda p: p["floor"]):
        drop = "-" if p["drop"] is None else f"{100 * p['drop']:.2f}"
        held = "-" if p["drop"] is None else "yes" if p["drop"] <= p["floor"] + 1e-9 else "NO"
        body.append(
            [
                f"floor {100 * p['floor']:g} points",
                f"{p['speedup']:.2f}x",
                f"{p['latency_ms']:.3f}",
                f"{p['accuracy']:.4f}",
                drop,
                held,
            ]
        )
    head = ["file", "speed-up", "p50 ms", "top-1", "points lost", "within the floor"]
    note = f"Timed side by side on {s['backend']} at batch {s['batch']}; top-1 on the whole validation split."
    return "\n".join([markdown_table(head, body), "", note])
