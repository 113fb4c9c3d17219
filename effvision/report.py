"""report.json / report.md / report.html of a run folder, built from the stages' metrics.json."""
from __future__ import annotations

import html
from pathlib import Path

from .errors import EffvisionError
from .fileio import read_json, write_json, write_text

# Per-stage details kept in metrics.json but too bulky (or internal) for the report.
_INTERNAL = {"history", "measurements", "fingerprint", "input_model", "artifacts", "index"}


def _stage_dirs(run_dir: Path) -> list[Path]:
    dirs = [d for d in (run_dir / "stages").glob("*") if d.is_dir() and (d / "metrics.json").is_file() and not d.name.startswith("0-")]
    return sorted(dirs, key=lambda d: int(d.name.split("-", 1)[0]))


def _pick(measurements: list[dict], stage: str, batch: int) -> dict | None:
    return next((m for m in measurements if m["stage"] == stage and m["batch"] == batch), None)


def build_report(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    if not (run_dir / "env.json").is_file():
        raise EffvisionError(f"{run_dir} is not a run folder (no env.json); run `effvision compress RECIPE --run-dir {run_dir}` first")
    records = [read_json(d / "metrics.json") for d in _stage_dirs(run_dir)]
    env = read_json(run_dir / "env.json")
    benches = [r for r in records if r["type"] == "bench"]
    measurements = [m for r in benches for m in r.get("measurements", [])]
    lat_batch = min((m["batch"] for m in measurements), default=1)
    tp_batch = max((m["batch"] for m in measurements), default=1)
    stages, artifacts = [], {}
    for r in records:
        row = {k: v for k, v in r.items() if k not in _INTERNAL}
        row.setdefault("time_to_accuracy_s", None)
        subject = r.get("artifact_of", r["name"])
        lat, tp = _pick(measurements, subject, lat_batch), _pick(measurements, subject, tp_batch)
        row["latency_ms"] = {"backend": lat["backend"], "batch": lat["batch"], "p50": lat["p50"], "p90": lat["p90"], "p99": lat["p99"]} if lat else None
        row["throughput"] = {"backend": tp["backend"], "batch": tp["batch"], "samples_per_s": tp["samples_per_s"]} if tp else None
        if r["type"] == "bench":
            row["all_measurements"] = r.get("measurements", [])
        stages.append(row)
        for kind, path in r.get("artifacts", {}).items():
            artifacts["checkpoint" if kind == "model" else kind] = path
    dataset = read_json(run_dir / "dataset.json") if (run_dir / "dataset.json").is_file() else None
    if dataset:
        dataset = {k: v for k, v in dataset.items() if k != "bad_files"}
    return {"recipe": env.get("recipe"), "run_dir": str(run_dir), "dataset": dataset, "stages": stages, "artifacts": artifacts,
            "env": {k: env.get(k) for k in ("torch", "torchvision", "timm", "onnx", "onnxruntime", "torch_pruning", "python", "cpu", "cpu_count", "gpu", "git_sha")}}


def fmt_num(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def _fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


_SHORT = {"onnxruntime-cpu": "ort-cpu", "torch-eager": "eager"}


def table_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """The per-stage table shared by report.md, report.html and the CLI."""
    head = ["#", "stage", "type", "params", "MACs", "size", "top-1", "measured with", "p50 ms (b=1)", "samples/s", "wall s", "time-to-acc s"]
    rows = []
    for i, s in enumerate(report["stages"], 1):
        lat, tp = s.get("latency_ms"), s.get("throughput")
        rows.append([str(i), s["name"], s["type"], fmt_num(s.get("params")), fmt_num(s.get("macs")), _fmt_bytes(s.get("size_bytes")),
                     f"{s['accuracy']:.4f}" if s.get("accuracy") is not None else "-", s.get("evaluated_with") or "-",
                     f"{lat['p50']:.3f} {_SHORT.get(lat['backend'], lat['backend'])}" if lat else "-", f"{tp['samples_per_s']:.0f} (b={tp['batch']})" if tp else "-",
                     f"{s.get('wall_s', 0):.1f}", f"{s['time_to_accuracy_s']:.1f}" if s.get("time_to_accuracy_s") is not None else "-"])
    return head, rows


def to_markdown(report: dict) -> str:
    head, rows = table_rows(report)
    out = [f"# effvision report: {report['run_dir']}", "", f"Recipe: `{report['recipe']}`"]
    if report.get("dataset"):
        d = report["dataset"]
        out.append(f"Dataset: {d['name']} ({d['modality']}), train {d['train_size']}, val {d['val_size']}, {d.get('bad_samples', 0)} unreadable files skipped")
    out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    bench = [s for s in report["stages"] if s["type"] == "bench"]
    if bench and bench[-1].get("all_measurements"):
        out += ["", "## Benchmark (every artifact)", "", "| stage | backend | batch | p50 ms | p90 ms | p99 ms | samples/s |", "|---|---|---|---|---|---|---|"]
        out += [f"| {m['stage']} | {m['backend']} | {m['batch']} | {m['p50']:.3f} | {m['p90']:.3f} | {m['p99']:.3f} | {m['samples_per_s']:.0f} |" for m in bench[-1]["all_measurements"]]
    out += ["", "Accuracy is top-1 on the validation split of the artifact each stage produced; ONNX stages are measured by running the file in ONNX Runtime."]
    out += ["", "Artifacts: " + ", ".join(f"{k}: `{v}`" for k, v in report["artifacts"].items())]
    e = report["env"]
    out += ["", f"Environment: torch {e['torch']}, onnxruntime {e['onnxruntime']}, timm {e['timm']}, CPU {e['cpu']} ({e['cpu_count']} cores), GPU {e['gpu'] or 'none'}, git {e['git_sha']}", ""]
    return "\n".join(out)


def _bars(title: str, items: list[tuple[str, float]], fmt: str) -> str:
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    h, w = 24 * len(items) + 30, 640
    parts = [f'<svg width="{w}" height="{h}" role="img"><text x="0" y="16" font-weight="bold">{html.escape(title)}</text>']
    for i, (label, v) in enumerate(items):
        y = 28 + 24 * i
        parts.append(f'<text x="0" y="{y + 14}" font-size="12">{html.escape(label)}</text>'
                     f'<rect x="160" y="{y}" width="{380 * v / top:.1f}" height="18" fill="#4c78a8"/>'
                     f'<text x="{166 + 380 * v / top:.1f}" y="{y + 14}" font-size="12">{fmt.format(v)}</text>')
    return "".join(parts) + "</svg>"


def to_html(report: dict) -> str:
    head, rows = table_rows(report)
    stages = [s for s in report["stages"] if s["type"] != "bench"]
    charts = [
        _bars("top-1 accuracy", [(s["name"], s["accuracy"]) for s in stages if s.get("accuracy") is not None], "{:.4f}"),
        _bars("MACs (millions)", [(s["name"], s["macs"] / 1e6) for s in stages if s.get("macs")], "{:.2f}"),
        _bars("size on disk (kB)", [(s["name"], s["size_bytes"] / 1024) for s in stages if s.get("size_bytes")], "{:.1f}"),
        _bars("latency p50 at batch 1 (ms)", [(f"{s['name']} ({s['latency_ms']['backend']})", s["latency_ms"]["p50"]) for s in stages if s.get("latency_ms")], "{:.3f}"),
    ]
    table = "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>"
    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>effvision report</title><style>{style}</style></head><body>"
            f"<h1>effvision report</h1><p>{html.escape(str(report['recipe']))} &rarr; {html.escape(report['run_dir'])}</p>{table}"
            + "".join(f"<div>{c}</div>" for c in charts) + "</body></html>\n")


def write_report(run_dir: str | Path) -> dict:
    run_dir = Path(run_dir)
    report = build_report(run_dir)
    write_json(run_dir / "report.json", report)
    write_text(run_dir / "report.md", to_markdown(report))
    write_text(run_dir / "report.html", to_html(report))
    return report
