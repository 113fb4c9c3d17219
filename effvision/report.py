"""report.json / report.md / report.html of a run folder, built from the stages' metrics.json."""

from __future__ import annotations

from pathlib import Path

from .errors import EffvisionError
from .fileio import read_json, write_json, write_text
from .goals import goal_of
from .report_plots import to_html
from .report_text import to_markdown

# Per-stage details kept in metrics.json but too bulky (or internal) for the report.
_INTERNAL = {"history", "measurements", "fingerprint", "input_model", "artifacts", "index"}
_TOP_LEVEL = ("reference", "headline")  # a bench stage's, lifted to the report's top level


def _stage_dirs(run_dir: Path) -> list[Path]:
    dirs = [
        d
        for d in (run_dir / "stages").glob("*")
        if d.is_dir() and (d / "metrics.json").is_file() and not d.name.startswith("0-")
    ]
    return sorted(dirs, key=lambda d: int(d.name.split("-", 1)[0]))


def _pick(measurements: list[dict], stage: str, batch: int) -> dict | None:
    return next((m for m in measurements if m["stage"] == stage and m["batch"] == batch), None)


def build_report(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    if not (run_dir / "env.json").is_file():
        raise EffvisionError(
            f"{run_dir} is not a run folder (no env.json); run `effvision compress RECIPE --run-dir {run_dir}` first"
        )
    dirs = _stage_dirs(run_dir)
    records = [read_json(d / "metrics.json") for d in dirs]
    env = read_json(run_dir / "env.json")
    benches = [r for r in records if r["type"] == "bench"]
    measurements = [m for r in benches for m in r.get("measurements", [])]
    lat_batch = min((m["batch"] for m in measurements), default=1)
    tp_batch = max((m["batch"] for m in measurements), default=1)
    stages, artifacts = [], {}
    for d, r in zip(dirs, records, strict=True):
        row = {k: v for k, v in r.items() if k not in _INTERNAL}
        row["stage_dir"] = d.name
        row.setdefault("time_to_accuracy_s", None)
        subject = r.get("artifact_of", r["name"])
        lat, tp = _pick(measurements, subject, lat_batch), _pick(measurements, subject, tp_batch)
        row["latency_ms"] = (
            {"backend": lat["backend"], "batch": lat["batch"], "p50": lat["p50"], "p90": lat["p90"], "p99": lat["p99"]}
            if lat
            else None
        )
        row["throughput"] = (
            {"backend": tp["backend"], "batch": tp["batch"], "samples_per_s": tp["samples_per_s"]} if tp else None
        )
        if r["type"] == "bench":
            row["all_measurements"] = r.get("measurements", [])
            for key in _TOP_LEVEL:
                row.pop(key, None)
        stages.append(row)
        for kind, path in r.get("artifacts", {}).items():
            artifacts["checkpoint" if kind == "model" else kind] = path
    dataset = read_json(run_dir / "dataset.json") if (run_dir / "dataset.json").is_file() else None
    if dataset:
        dataset = {k: v for k, v in dataset.items() if k != "bad_files"}
    last_bench = benches[-1] if benches else {}
    target = target_summary(_recipe_target(run_dir, records), last_bench.get("headline"), records)
    return {
        "recipe": env.get("recipe"),
        "run_dir": str(run_dir),
        "dataset": dataset,
        "stages": stages,
        "artifacts": artifacts,
        **{key: last_bench.get(key) for key in _TOP_LEVEL},
        "plan": next((r["plan"] for r in reversed(records) if r["type"] == "plan"), None),
        "target": target,
        # the shipped file on the decision split: what a search chooses by (the figures are the val split's)
        "decision": read_json(run_dir / "decision.json") if (run_dir / "decision.json").is_file() else None,
        "env": {
            k: env.get(k)
            for k in (
                "torch",
                "torchvision",
                "timm",
                "onnx",
                "onnxruntime",
                "torch_pruning",
                "python",
                "cpu",
                "cpu_count",
                "gpu",
                "git_sha",
            )
        },
    }


def _recipe_target(run_dir: Path, records: list[dict]) -> dict | None:
    """The target the run aimed at: the recipe's block, else the last aiming stage's own."""
    from . import yamlio

    recipe = run_dir / "recipe.yaml"
    found = (yamlio.load(recipe.read_text()) or {}).get("target") if recipe.is_file() else None
    aimed = [r["target"] for r in records if isinstance(r.get("target"), dict)]
    return found or (aimed[-1] if aimed else None)


def target_summary(target: dict | None, headline: dict | None, records: list[dict]) -> dict | None:
    """Whether the target was met, by how much and at what accuracy: from the headline (the
    shipped artifact against the reference, measured by the bench stage) when it was measured on
    the target's backend and batch, else from the aiming stage's own last measurement."""
    if not target:
        return None
    batch, backend = target.get("batch", 1), target.get("backend", "onnxruntime-cpu")
    out = {k: target.get(k) for k in ("backend", "batch", "speedup", "latency_ms", "max_drop")}
    speedups = {int(b): v for b, v in (headline or {}).get("speedups", {}).items()}
    if headline and headline.get("backend") == backend and batch in speedups:
        latency = {int(b): v for b, v in headline["final_p50_ms"].items()}[batch]
        measured = {"speedup": speedups[batch], "ms": latency, "accuracy_delta": headline.get("accuracy_delta")}
        out["measured_by"] = "bench stage: the shipped artifact against the reference, interleaved"
    else:
        aim = next((r["aim"] for r in reversed(records) if isinstance(r.get("aim"), dict)), None)
        if aim is None or "final" not in aim:
            return {**out, "met": None, "measured_by": "nothing measured on the target's backend and batch"}
        measured = {"speedup": aim["final"]["speedup"], "ms": aim["final"]["ms"], "accuracy_delta": None}
        out["measured_by"] = f"the aiming stage's torch model exported for {backend} (no bench row there)"
    fast = goal_of(target).met(measured["ms"], measured["speedup"])
    drop, delta = target.get("max_drop"), measured["accuracy_delta"]
    accurate = True if drop is None else None if delta is None else -delta <= drop + 1e-9
    out.update(
        measured_speedup=measured["speedup"],
        measured_ms=measured["ms"],
        accuracy_delta=delta,
        met=None if accurate is None else bool(fast and accurate),
    )
    return out


REPORT_FILES = {"report.md": to_markdown, "report.html": to_html, "report.json": None}  # None: the JSON itself


def write_report(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    report = build_report(run_dir)
    for name, render in REPORT_FILES.items():
        if render is None:
            write_json(run_dir / name, report)
        else:
            write_text(run_dir / name, render(report))
    return report


def remove_report(run_dir: Path) -> None:
    """Delete a report that no longer describes the run folder (its stages are about to change)."""
    for name in REPORT_FILES:
        (run_dir / name).unlink(missing_ok=True)
