"""What a search study shows: its finished trials and their Pareto front as a table and a plot
(top-1 against measured latency, size as marker area), and recipes to run again: one per point of
the front (front/trial-N.yaml) and best.yaml, the point `--pick` chooses."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

from .. import yamlio
from ..errors import EffvisionError
from ..fileio import write_text
from ..recipe import with_value
from .common import markdown_table, save_png
from .search import SETTINGS_ATTR

PICKS = {
    "max_drop": "the fastest trial whose top-1 is at most this far below its reference's",
    "max_latency_ms": "the most accurate trial at most this slow",
}
DEFAULT_PICK = ("max_drop", 0.01)


def parse_pick(value: Optional[str]) -> tuple[str, float]:
    if not value:
        return DEFAULT_PICK
    key, eq, number = value.partition("=")
    if not eq or key.strip() not in PICKS:
        raise EffvisionError(f"--pick {value}: expected max_drop=D or max_latency_ms=L (e.g. max_drop=0.005)")
    try:
        limit = float(number)
    except ValueError:
        raise EffvisionError(f"--pick {value}: {number!r} is not a number") from None
    if not limit >= 0:
        raise EffvisionError(f"--pick {value}: the limit must be 0 or more")
    return key.strip(), limit


def finished(study) -> list[dict]:
    """Finished trials as rows: number, the searched values and what the trial measured."""
    from optuna.trial import TrialState

    settings = study.user_attrs.get(SETTINGS_ATTR, {})
    objectives = settings.get("objectives", [])
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    front = {t.number for t in study.best_trials} if done else set()
    return [
        {
            "number": t.number,
            "params": dict(t.params),
            **dict(zip(objectives, t.values, strict=True)),
            **{k: v for k, v in t.user_attrs.items() if k not in objectives},
            "front": t.number in front,
        }
        for t in done
    ]


def latency(row: dict) -> Optional[float]:
    """The trial's p50: timed side by side with every other trial (--retime) when it was, else as
    the trial measured it beside its reference."""
    return row.get("p50_side_by_side", row.get("latency_ms"))


def side_by_side_front(rows: list[dict], objectives: list[str]) -> set[int]:
    """The trials no other trial beats on every objective, with the latency and speed-up of the
    side-by-side timing in place of each trial's own."""
    from ..report_plots import undominated
    from .search_space import OBJECTIVES

    value = {
        "top1": lambda r: r["top1"],
        "latency_ms": latency,
        "speedup": lambda r: r.get("speedup_side_by_side", r.get("speedup")),
        "size": lambda r: r.get("size"),
    }
    sign = {o: 1 if OBJECTIVES[o][0] == "maximize" else -1 for o in objectives}
    front = undominated([tuple(sign[o] * value[o](r) for o in objectives) for r in rows])
    return {r["number"] for r, on in zip(rows, front, strict=True) if on}


def drop(row: dict) -> Optional[float]:
    if row.get("reference_top1") is None:
        return None
    return row["reference_top1"] - row["top1"]


def pick(rows: list[dict], rule: tuple[str, float]) -> tuple[Optional[dict], str]:
    """The trial a rule picks among the finished ones, and one line saying why."""
    key, limit = rule
    if key == "max_drop":
        ok = [r for r in rows if drop(r) is not None and drop(r) <= limit + 1e-12 and latency(r) is not None]
        if not ok:
            return None, f"no finished trial loses at most {limit:g} of top-1 against its reference"
        best = min(ok, key=latency)
        return best, f"the fastest trial within a drop of {limit:g} ({len(ok)} qualify)"
    ok = [r for r in rows if latency(r) is not None and latency(r) <= limit]
    if not ok:
        return None, f"no finished trial measured at most {limit:g} ms"
    best = max(ok, key=lambda r: r["top1"])
    return best, f"the most accurate trial at most {limit:g} ms ({len(ok)} qualify)"


def _fmt(v, spec: str = ".4f") -> str:
    return "–" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def _values(params: dict) -> str:
    return ", ".join(f"{k}={_fmt(v, '.4g')}" for k, v in params.items())


def to_markdown(study, rows: list[dict], chosen: Optional[dict], why: str, retimed: Optional[dict] = None) -> str:
    settings = study.user_attrs.get(SETTINGS_ATTR, {})
    head = ["trial", "front", "values", "top-1", "drop", "p50 ms", "speed-up", "size MB", "CPU"]
    both = bool(retimed) and any("front_in_trial" in r for r in rows)
    if retimed:
        head[7:7] = ["p50 ms side by side", "speed-up side by side"]
    if both:
        head[1:2] = ["front (side by side)", "front (in trial)"]

    def times(r, p50: str, speedup: str) -> list[str]:
        return [_fmt(r.get(p50)), _fmt(r.get(speedup), ".2f") + ("x" if r.get(speedup) is not None else "")]

    def line(r):
        return [
            str(r["number"]) + (" (picked)" if chosen is r else ""),
            "yes" if r["front"] else "",
            *(["yes" if r["front_in_trial"] else ""] if both else []),
            _values(r["params"]),
            _fmt(r.get("top1")),
            _fmt(drop(r), "+.4f"),
            *times(r, "latency_ms", "speedup"),
            *(times(r, "p50_side_by_side", "speedup_side_by_side") if retimed else []),
            _fmt(r.get("size"), ".3f"),
            r.get("cpu", "?"),
        ]

    front = sorted((r for r in rows if r["front"]), key=lambda r: (latency(r) or 0, -r["top1"]))
    rest = sorted((r for r in rows if not r["front"]), key=lambda r: r["number"])
    cpus = sorted({r.get("cpu", "?") for r in rows})
    text = [
        f"# Search {study.study_name}: {len(rows)} finished trials, {len(front)} on the Pareto front",
        "",
        f"Recipe {settings.get('recipe')}; objectives {', '.join(settings.get('objectives', []))}; space "
        + "; ".join(f"`{k}={v}`" for k, v in settings.get("space", {}).items())
        + ". Top-1 and drop on the decision split (training images every trial holds out, never trained on: what "
        "the front and the pick are chosen by; each trial's report gives its top-1 on the validation split). Drop: "
        "the trial's reference top-1 (the uncompressed model's file, same runtime) minus its own; "
        "p50 and speed-up on the bench backend at the target batch, timed beside the reference.",
        "",
    ]
    if len(cpus) > 1:
        text += [f"Latencies come from {len(cpus)} CPUs ({'; '.join(cpus)}): compare them only within one CPU.", ""]
    if retimed:
        text += [
            f"Side by side: {retimed['trials']} trials' files and their reference timed interleaved in one process "
            f"({retimed['rounds']} rounds, {retimed['repeats']} calls each) on {retimed['cpu']}"
            + (f"; {retimed['untimed']} trials ran elsewhere and are not re-timed" if retimed["untimed"] else "")
            + (
                ". The front, the plot and best.yaml use these timings; `front (in trial)` is Optuna's, on the "
                "values each trial measured while it ran."
                if both
                else ". The front is Optuna's, on the values each trial measured; best.yaml uses the side-by-side p50."
            ),
            "",
        ]
    text += [markdown_table(head, [line(r) for r in front + rest]), ""]
    text += [f"best.yaml: trial {chosen['number']}, {why}." if chosen else f"best.yaml: none ({why}).", ""]
    return "\n".join(text)


def plot(path: Path, study, rows: list[dict]) -> Optional[Path]:
    """Top-1 against p50 latency, marker area by file size, the front joined; one marker shape
    per CPU where trials ran on several (their latencies do not compare)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    timed = [r for r in rows if latency(r) is not None]
    side = any("p50_side_by_side" in r for r in timed)
    if not timed:
        return None
    cpus = sorted({r.get("cpu", "?") for r in timed})
    markers = "osD^v<>p*h"
    biggest = max((r.get("size") or 0) for r in timed) or 1
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, cpu in enumerate(cpus):
        mine = [r for r in timed if r.get("cpu", "?") == cpu]
        for on_front in (False, True):
            pts = [r for r in mine if r["front"] == on_front]
            if not pts:
                continue
            ax.scatter(
                [latency(r) for r in pts],
                [r["top1"] for r in pts],
                s=[30 + 400 * (r.get("size") or 0) / biggest for r in pts],
                marker=markers[i % len(markers)],
                color="#d62728" if on_front else "#9e9e9e",
                alpha=0.8,
                edgecolors="black",
                linewidths=0.5,
                label=("Pareto front" if on_front else "other trials") + (f" ({cpu})" if len(cpus) > 1 else ""),
            )
        ref_key = "reference_p50_side_by_side" if side else "reference_p50_ms"
        refs = [r for r in mine if r.get(ref_key) is not None]
        if refs:
            ax.scatter(
                [statistics.median(r[ref_key] for r in refs)],
                [refs[0]["reference_top1"]],
                marker="*",
                s=160,
                color="black",
                label="reference (median of its timings)" if len(cpus) == 1 else f"reference ({cpu})",
            )
    front = sorted((r for r in timed if r["front"]), key=latency)
    if len(front) > 1 and len(cpus) == 1:
        ax.plot([latency(r) for r in front], [r["top1"] for r in front], color="#d62728", linewidth=1)
    for r in front:
        ax.annotate(str(r["number"]), (latency(r), r["top1"]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    title = f"search {study.study_name}: top-1 against measured p50 (area: file size)"
    if len(cpus) > 1:
        title += f"\nlatencies from {len(cpus)} CPUs: compare within one marker shape only"
    xlabel = "p50 latency, ms (bench backend, target batch" + (", all timed side by side)" if side else ")")
    ax.set(xlabel=xlabel, ylabel="top-1 of the shipped file", title=title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return save_png(fig, path)


def trial_recipe(study, row: dict, name: str) -> str:
    """The study's recipe with a trial's values, as YAML to run again."""
    settings = study.user_attrs.get(SETTINGS_ATTR, {})
    raw = settings.get("raw_recipe") or {}
    for key, value in row["params"].items():
        raw = with_value(raw, key, value, f"trial {row['number']}")
    raw = {**raw, "name": name}
    what = ", ".join(
        f"{k} {_fmt(row.get(k))}" for k in ("top1", "latency_ms", "speedup", "size") if row.get(k) is not None
    )
    head = (
        f"# study {study.study_name}, trial {row['number']}: {_values(row['params'])}\n"
        f"# measured: {what} (CPU: {row.get('cpu', '?')})\n"
        f"# from {settings.get('recipe_file')}\n"
    )
    return head + yamlio.dump(raw, sort_keys=False)


def write_results(study, out_dir: Path, rule: tuple[str, float], retime: bool = False) -> dict:
    """search.md, pareto.png, front/trial-N.yaml and best.yaml in the study folder; with retime,
    every trial's file of this machine timed again side by side (search_retime.py)."""
    rows = finished(study)
    retimed = None
    if retime:
        from .search_retime import retime as time_side_by_side

        retimed = time_side_by_side(rows)
        objectives = study.user_attrs.get(SETTINGS_ATTR, {}).get("objectives", [])
        if retimed["trials"] == len(rows) and rows:
            # every trial was re-timed: the front (plot, front/*.yaml) is the side-by-side one
            front = side_by_side_front(rows, objectives)
            for r in rows:
                r["front_in_trial"], r["front"] = r["front"], r["number"] in front
    chosen, why = pick(rows, rule)
    out_dir.mkdir(parents=True, exist_ok=True)
    text = to_markdown(study, rows, chosen, why, retimed)
    written = [write_text(out_dir / "search.md", text)]
    png = plot(out_dir / "pareto.png", study, rows)
    if png:
        written.append(png)
    name = (study.user_attrs.get(SETTINGS_ATTR, {}).get("recipe") or "search").replace("/", "-")
    front = {f"trial-{r['number']}.yaml": r for r in rows if r["front"]}
    for old in (out_dir / "front").glob("trial-*.yaml"):
        if old.name not in front:  # a point the front no longer holds
            old.unlink()
    for file, r in front.items():
        written.append(write_text(out_dir / "front" / file, trial_recipe(study, r, f"{name}-t{r['number']}")))
    if chosen:
        written.append(write_text(out_dir / "best.yaml", trial_recipe(study, chosen, f"{name}-best")))
    else:
        (out_dir / "best.yaml").unlink(missing_ok=True)
    return {"rows": rows, "chosen": chosen, "why": why, "markdown": text, "written": written}
