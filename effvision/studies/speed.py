"""Speed study: time to a target accuracy of a recipe against one of its presets (the plain
baseline), same net and data, run side by side in one process: for every seed the recipe first,
then the preset, stopped at `cap` times the recipe's time if it has not reached the target by then
(DAWNBench's figure of merit; a capped run is reported as "not reached")."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import EffvisionError
from ..fileio import write_text
from ..stages import load_recipe
from .common import Rows, markdown_table
from .time_to_accuracy import check_target, summarise, train_row, with_target


def speed_study(
    recipe_path: str, sets: list[str], preset: str, target: float, seeds: int, cap: float, out_dir: Path
) -> dict:
    check_target(target)
    if cap <= 1:
        raise EffvisionError(f"--cap {cap}: the baseline's time limit is a multiple (> 1) of the recipe's time")
    fast = load_recipe(recipe_path, sets)
    base = load_recipe(recipe_path, sets, preset)  # an unknown preset stops here, in one line
    rows = Rows(out_dir, {"recipe": fast._source, "sets": sets, "preset": preset, "target": target, "cap": cap})
    for k in range(seeds):
        seed = fast.seed + k
        mine = rows.measure(
            {"variant": "recipe", "seed": seed},
            lambda seed=seed: train_row(with_target(fast, seed, target), out_dir / f"recipe-seed-{seed}"),
        )
        limit = cap * (mine["time_to_accuracy_s"] or mine["train_s"])
        rows.measure(
            {"variant": preset, "seed": seed},
            lambda seed=seed, limit=limit: {
                **train_row(with_target(base, seed, target, time_limit=limit), out_dir / f"{preset}-seed-{seed}"),
                "time_limit_s": limit,
            },
        )
    summary = {
        "recipe": fast._source,
        "preset": preset,
        "target": target,
        "cap": cap,
        "recipe_summary": summarise([r for r in rows.rows if r["variant"] == "recipe"]),
        "preset_summary": summarise([r for r in rows.rows if r["variant"] == preset]),
        "rows": rows.rows,
    }
    # Added fields (older results files lack them): the ratio and the sentence speed.md prints.
    summary["speedup"], summary["speedup_text"] = speedup(summary)
    rows.save(summary={k: v for k, v in summary.items() if k != "rows"})
    write_text(out_dir / "speed.md", to_markdown(summary) + "\n")
    return summary


def speedup(summary: dict) -> tuple[Optional[float], str]:
    """Seconds to target of the preset over the recipe's. Preset seeds that were capped (not
    reached by `cap` times the recipe's time) are reported apart from those that reached it: the
    ratio is measured on the seeds that reached (paired by seed with the recipe's runs), and only
    when no preset seed reached is it the lower bound `cap` ("≥ cap x")."""
    a, b = summary["recipe_summary"], summary["preset_summary"]
    if not a["reached"]:
        return None, "the recipe did not reach the target"
    cap, missed = summary["cap"], b["seeds"] - b["reached"]
    not_reached = f"not reached by {cap:g}x the recipe's time"
    if b["reached"] == 0:
        return cap, f"≥ {cap:g}x ({missed} of {b['seeds']} {summary['preset']} runs {not_reached})"
    if missed == 0:
        ratio = b["mean_s"] / a["mean_s"]
        return ratio, f"{ratio:.2f}x"
    ratio = _reached_ratio(summary) or b["mean_s"] / a["mean_s"]
    seeds = "seed" if missed == 1 else "seeds"
    return ratio, f"{ratio:.2f}x on {b['reached']} of {b['seeds']} seeds; {missed} {seeds} {not_reached}"


def _reached_ratio(summary: dict) -> Optional[float]:
    """Mean preset seconds over mean recipe seconds on the seeds where both reached the target
    (None without per-seed rows or without such a seed)."""
    times: dict[str, dict[int, float]] = {"recipe": {}, summary["preset"]: {}}
    for r in summary.get("rows", []):
        if r["variant"] in times and r["time_to_accuracy_s"] is not None:
            times[r["variant"]][r["seed"]] = r["time_to_accuracy_s"]
    mine, theirs = times["recipe"], times[summary["preset"]]
    both = [s for s in theirs if s in mine]
    if not both:
        return None
    return sum(theirs[s] for s in both) / sum(mine[s] for s in both)


def to_markdown(summary: dict) -> str:
    def secs(r: dict) -> str:
        if r["time_to_accuracy_s"] is not None:
            return f"{r['time_to_accuracy_s']:.1f}"
        return (
            f"not reached by {r.get('time_limit_s', r['train_s']):.0f}"
            if r["stopped"] == "time limit"
            else "not reached"
        )

    head = [
        "variant",
        "seed",
        f"s to {summary['target']:g}",
        "epochs",
        "top-1 at stop",
        "top-1 mirror-avg",
        "train s",
        "eval s",
        "compile s",
    ]
    rows = [
        [
            r["variant"],
            str(r["seed"]),
            secs(r),
            "-" if r["epochs_to_accuracy"] is None else f"{r['epochs_to_accuracy']:g}",
            f"{r['accuracy']:.4f}",
            "-" if r.get("accuracy_tta") is None else f"{r['accuracy_tta']:.4f}",
            f"{r['train_s']:.1f}",
            f"{r['eval_s']:.1f}",
            f"{r['compile_s']:.1f}",
        ]
        for r in summary["rows"]
    ]
    lines = [markdown_table(head, rows), ""]
    for name, s in (("recipe", summary["recipe_summary"]), (summary["preset"], summary["preset_summary"])):
        if s["reached"]:
            lines.append(
                f"- {name}: reached {s['reached']}/{s['seeds']}, {s['mean_s']:.1f} ± {s['std_s']:.1f} s to "
                f"{summary['target']:g}"
            )
        else:
            lines.append(f"- {name}: reached 0/{s['seeds']}")
    lines.append(f"- speed-up of the recipe over {summary['preset']}: {speedup(summary)[1]}")
    return "\n".join(lines)
