"""Coreset selection study: accuracy against budget for several selectors, over seeds.

Per seed the study trains the recipe's model on the whole training split (the reference and the
cost that scoring overhead is a fraction of), trains one proxy that scores every sample for all
selectors at once, then trains the model afresh on each selector's subset at each budget with the
recipe's train stage. Random selection is always included. Training time excludes evaluation.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import numpy as np
import torch

from .. import yamlio
from ..compression.selection import ProxyConfig, score
from ..data.selectors import Signals, resolve_budget, select
from ..errors import EffvisionError
from ..fileio import atomic_write
from ..progress import log
from ..recipe import Recipe
from ..run_data import recipe_data
from ..train.loop import fit
from .common import Rows, markdown_table, mean_std, plot_curves


def _stage(recipe: Recipe, kind: str):
    return next((s for s in recipe.stages if s.type == kind), None)


def selection_study(
    recipe: Recipe, methods: list[str], budgets: list, seeds: int, out_dir: Path, device: torch.device
) -> dict:
    from ..models import create_model

    train_cfg = _stage(recipe, "train")
    if train_cfg is None:
        raise EffvisionError(
            f"{recipe._source}: a selection study trains with the recipe's train stage; the recipe has none"
        )
    methods = _checked(methods)
    select_cfg = _stage(recipe, "select")
    proxy = select_cfg.proxy if select_cfg else ProxyConfig()
    data = recipe_data(recipe)
    for b in budgets:
        resolve_budget(b, len(data.train))  # a bad budget stops here, before any training

    def fresh_model(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        m = recipe.model
        return create_model(
            m.name, num_classes=data.num_classes, pretrained=m.pretrained, input_size=data.input_size, **m.kwargs
        )

    def train_on(bundle, seed: int) -> dict:
        res = fit(fresh_model(seed), bundle, train_cfg, device, seed=seed, label=f"train {len(bundle.train)}")
        return {"n": len(bundle.train), "accuracy": res.accuracy, "train_s": round(res.train_s, 3)}

    settings = {
        "recipe": recipe.model_dump(mode="json", exclude={"stages"}),
        "train": train_cfg.model_dump(mode="json"),
        "proxy": proxy.model_dump(mode="json"),
        "train_size": len(data.train),
    }
    rows = Rows(out_dir, settings)
    for seed in range(recipe.seed, recipe.seed + seeds):
        log(f"[bold]seed {seed}[/]: full training split ({len(data.train)} samples)")
        rows.measure({"kind": "full", "seed": seed}, lambda seed=seed: train_on(data, seed))
        signals = _signals(rows, Path(out_dir), data, methods, budgets, proxy, fresh_model, device, seed)
        for method in methods:
            for budget in budgets:

                def run(method=method, budget=budget, seed=seed, signals=signals):
                    start = time.perf_counter()
                    name, options = parse_method(method)
                    sel = select(name, signals, budget, seed=seed, **options)
                    select_s = time.perf_counter() - start
                    log(f"seed {seed}: {method} at budget {budget}: {len(sel.indices)} samples")
                    return {
                        **train_on(data.with_train_subset(sel.indices, sel.weights), seed),
                        "select_s": round(select_s, 3),
                    }

                rows.measure({"kind": "subset", "method": method, "budget": budget, "seed": seed}, run)
    return _summarized(rows, recipe, methods, budgets, seeds, Path(out_dir))


def _checked(methods: list[str]) -> list[str]:
    """The methods, random first; unknown selectors and options stop here, before any training."""
    from ..registry import SELECTORS

    for m in methods:
        name, options = parse_method(m)
        unknown = set(options) - set(SELECTORS.get(name).options())
        if unknown:
            raise EffvisionError(
                f"method '{m}': selector '{name}' has no option {', '.join(sorted(unknown))} "
                f"(options: {', '.join(SELECTORS.get(name).options()) or 'none'})"
            )
    return methods if "random" in methods else ["random", *methods]


def _signals(rows, out_dir: Path, data, methods, budgets, proxy, fresh_model, device, seed: int):
    """The proxy's per-sample signals for one seed: an earlier (or stopped) run's where kept, else
    scored now and saved; None when every subset of the seed is measured already."""
    cached = out_dir / f"signals-seed{seed}.npz"
    needs_scoring = any(
        rows.get(kind="subset", method=m, budget=b, seed=seed) is None for m in methods for b in budgets
    )
    if needs_scoring and rows.get(kind="scoring", seed=seed) and cached.is_file():
        return load_signals(cached)
    if not (needs_scoring or rows.get(kind="scoring", seed=seed) is None):
        return None
    start = time.perf_counter()
    names = [parse_method(m)[0] for m in methods]
    scored = score(data, names, proxy, lambda: fresh_model(seed + 10_000), device, seed, label=f"proxy (seed {seed})")
    save_signals(cached, scored.signals)
    rows.rows = [r for r in rows.rows if not (r["kind"] == "scoring" and r["seed"] == seed)]
    rows.measure(
        {"kind": "scoring", "seed": seed},
        lambda: {
            "proxy_train_s": round(scored.proxy_train_s, 3),
            "scoring_s": round(scored.scoring_s, 3),
            "wall_s": round(time.perf_counter() - start, 3),
            "proxy_accuracy": scored.proxy_accuracy,
        },
    )
    return scored.signals


def _summarized(rows, recipe: Recipe, methods, budgets, seeds: int, out_dir: Path) -> dict:
    """The summary, saved with the rows, its plot and its markdown table."""
    summary = summarize(rows.rows, methods, budgets)
    rows.save(summary=summary)
    curves = {m: [(float(b), *summary["accuracy"][m][str(b)]) for b in budgets] for m in methods}
    full = summary["full"]
    plot_curves(
        out_dir / "selection.png",
        curves,
        "budget (fraction of the training split)",
        "top-1 accuracy",
        f"{recipe.data.name}: coreset selection, mean ± std over {seeds} seeds",
        reference=(f"all data ({full[0]:.3f})", full[0]),
    )
    (out_dir / "selection.md").write_text(to_markdown(summary, methods, budgets, seeds) + "\n")
    return summary


def parse_method(spec: str) -> tuple[str, dict]:
    """'el2n' or 'el2n:keep=easy' (options joined by ':') -> selector name and options."""
    name, *opts = spec.split(":")
    options = {}
    for opt in opts:
        key, eq, value = opt.partition("=")
        if not eq or not key:
            raise EffvisionError(f"method '{spec}': options are key=value after the selector, e.g. el2n:keep=easy")
        try:
            options[key] = yamlio.load(value)
        except yamlio.YAMLError:
            raise EffvisionError(f"method '{spec}': the value of {key} is not valid YAML (quote it)") from None
    return name, options


_SIGNAL_FIELDS = ("embeddings", "probs", "el2n", "forgetting")


def save_signals(path: Path, signals: Signals) -> None:
    arrays = {k: getattr(signals, k) for k in _SIGNAL_FIELDS if getattr(signals, k) is not None}
    atomic_write(
        path, lambda p: np.savez(open(p, "wb"), targets=signals.targets, num_classes=signals.num_classes, **arrays)
    )


def load_signals(path: Path) -> Signals:
    with np.load(path) as z:
        return Signals(z["targets"], int(z["num_classes"]), **{k: z[k] for k in _SIGNAL_FIELDS if k in z})


def summarize(rows: list[dict], methods: list[str], budgets: list) -> dict:
    full = [r for r in rows if r["kind"] == "full"]
    scoring = [r for r in rows if r["kind"] == "scoring"]

    def per_subset(key: str) -> dict:
        """mean ± std of a row field over seeds, per selector and budget."""
        return {
            m: {
                str(b): mean_std(
                    r[key] for r in rows if r["kind"] == "subset" and r["method"] == m and r["budget"] == b
                )
                for b in budgets
            }
            for m in methods
        }

    acc, train_s = per_subset("accuracy"), per_subset("train_s")
    full_s = mean_std(r["train_s"] for r in full)
    overhead = [
        (s["proxy_train_s"] + s["scoring_s"]) / next(f["train_s"] for f in full if f["seed"] == s["seed"])
        for s in scoring
    ]
    verdicts = {}
    for m in methods:
        if m == "random":
            continue
        for b in budgets:
            (mu, sd), (rmu, rsd) = acc[m][str(b)], acc["random"][str(b)]
            diff = mu - rmu
            verdicts[f"{m}@{b}"] = (
                "beats random"
                if diff > max(sd, rsd)
                else "worse than random"
                if -diff > max(sd, rsd)
                else "within noise of random"
            ) + f" ({diff:+.4f})"
    scoring_s = (
        statistics.mean(s["proxy_train_s"] + s["scoring_s"] for s in scoring) if scoring else 0.0
    )  # one proxy scores for every selector
    end_to_end = {  # seconds from nothing to a trained model, and its accuracy
        f"{m}@{b}": {
            "seconds": round((0.0 if m == "random" else scoring_s) + train_s[m][str(b)][0], 3),
            "accuracy": acc[m][str(b)][0],
        }
        for m in methods
        for b in budgets
    }
    wall = [s["wall_s"] / next(f["train_s"] for f in full if f["seed"] == s["seed"]) for s in scoring if "wall_s" in s]
    return {
        "full": mean_std(r["accuracy"] for r in full),
        "full_train_s": full_s,
        "end_to_end": end_to_end,
        "scoring_wall_overhead": mean_std(wall) if wall else None,
        "accuracy": acc,
        "train_s": train_s,
        "scoring_overhead": mean_std(overhead) if overhead else None,
        "proxy_train_s": mean_std(s["proxy_train_s"] for s in scoring) if scoring else None,
        "scoring_s": mean_std(s["scoring_s"] for s in scoring) if scoring else None,
        "verdicts": verdicts,
    }


def to_markdown(summary: dict, methods: list[str], budgets: list, seeds: int) -> str:
    head = ["selector", *[f"budget {b}" for b in budgets]]
    rows = [
        [m, *[f"{summary['accuracy'][m][str(b)][0]:.4f} ± {summary['accuracy'][m][str(b)][1]:.4f}" for b in budgets]]
        for m in methods
    ]
    full, fs = summary["full"], summary["full_train_s"]
    lines = [
        markdown_table(head, rows),
        "",
        f"All data: {full[0]:.4f} ± {full[1]:.4f} ({fs[0]:.0f} s of training). Mean ± std over {seeds} seeds.",
    ]
    if summary["scoring_overhead"]:
        o, p, s = summary["scoring_overhead"], summary["proxy_train_s"], summary["scoring_s"]
        w = summary.get("scoring_wall_overhead")
        lines.append(
            f"Scoring overhead (proxy training {p[0]:.0f} s + scoring {s[0]:.0f} s): {o[0]:.2f} ± {o[1]:.2f} of "
            "full-data training time"
            + (
                f"; {w[0]:.2f} ± {w[1]:.2f} counting all of its wall time (building the proxy, evaluation)."
                if w
                else "."
            )
        )
    e2e = summary.get("end_to_end") or {}
    for b in budgets if e2e else ():

        def run(m: str, b=b) -> str:
            return f"{m} {e2e[f'{m}@{b}']['seconds']:.0f} s → {e2e[f'{m}@{b}']['accuracy']:.4f}"

        best = max((m for m in methods if m != "random"), key=lambda m: e2e[f"{m}@{b}"]["accuracy"], default=None)
        shown = ([f"best selector {run(best)}"] if best else []) + [run("random")]
        lines.append(
            f"End to end at budget {b} (scoring included): {', '.join(shown)}; all data {fs[0]:.0f} s → {full[0]:.4f}."
        )
    lines.append(
        "Against random (difference of means; 'beats' only when larger than either std): "
        + "; ".join(f"{k}: {v}" for k, v in summary["verdicts"].items())
        + "."
    )
    return "\n".join(lines)
