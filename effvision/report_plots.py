"""report.html: the run's table with its plots (accuracy against latency and size, the bench
stage's batch sweeps, per-stage bars), every image inline."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from .report_text import table_rows


def _bars(title: str, items: list[tuple[str, float]], fmt: str) -> str:
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    h, w = 24 * len(items) + 30, 640
    parts = [
        f'<svg width="{w}" height="{h}" role="img"><text x="0" y="16" font-weight="bold">{html.escape(title)}</text>'
    ]
    for i, (label, v) in enumerate(items):
        y = 28 + 24 * i
        parts.append(
            f'<text x="0" y="{y + 14}" font-size="12">{html.escape(label)}</text>'
            f'<rect x="160" y="{y}" width="{380 * v / top:.1f}" height="18" fill="#4c78a8"/>'
            f'<text x="{166 + 380 * v / top:.1f}" y="{y + 14}" font-size="12">{fmt.format(v)}</text>'
        )
    return "".join(parts) + "</svg>"


def undominated(points: list[tuple]) -> list[bool]:
    """Per point (a tuple of values, larger is better in each): whether no other point is at
    least as good in every value and better in one: the Pareto front."""

    def beats(q, p) -> bool:
        return all(b >= a for a, b in zip(p, q, strict=True)) and any(b > a for a, b in zip(p, q, strict=True))

    return [not any(beats(q, p) for j, q in enumerate(points) if j != i) for i, p in enumerate(points)]


def pareto_points(report: dict) -> list[dict]:
    """Per stage: accuracy, latency p50 at the smallest batch and size on disk, and whether it is
    on the Pareto front (no other stage is at least as accurate and at least as fast/small)."""
    backend = (report.get("headline") or {}).get("backend")

    def latency(s: dict):  # every latency on the plot from one backend: the headline's, when there is one
        lat = s.get("latency_ms") or {}
        return lat.get("p50") if backend is None or lat.get("backend") == backend else None

    pts = [
        {"name": s["name"], "accuracy": s["accuracy"], "latency": latency(s), "size": s.get("size_bytes")}
        for s in report["stages"]
        if s["type"] != "bench" and s.get("accuracy") is not None
    ]
    ref = report.get("reference")
    if ref and ref.get("accuracy") is not None:
        pts.insert(
            0, {"name": "reference", "accuracy": ref["accuracy"], "latency": latency(ref), "size": ref["size_bytes"]}
        )
    for key in ("latency", "size"):
        known = [p for p in pts if p[key] is not None]
        front = dict(zip(map(id, known), undominated([(p["accuracy"], -p[key]) for p in known]), strict=True))
        for p in pts:
            p[f"front_{key}"] = front.get(id(p), False)
    return pts


def pareto_png(report: dict) -> bytes | None:
    """Accuracy against latency and against size, one point per stage, the front joined."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pts = pareto_points(report)
    if not pts:
        return None
    backend = (report.get("headline") or {}).get("backend")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, xlabel in (
        (axes[0], "latency", f"latency p50 at the smallest batch (ms, {backend or 'as measured'})"),
        (axes[1], "size", "size on disk (kB)"),
    ):
        have = [p for p in pts if p[key] is not None]
        scale = 1 / 1024 if key == "size" else 1
        for p in have:
            ax.scatter(p[key] * scale, p["accuracy"], color="#e45756" if p[f"front_{key}"] else "#4c78a8", zorder=3)
            ax.annotate(
                p["name"], (p[key] * scale, p["accuracy"]), fontsize=8, xytext=(4, 4), textcoords="offset points"
            )
        front = sorted((p for p in have if p[f"front_{key}"]), key=lambda p: p[key])
        if len(front) > 1:
            ax.plot([p[key] * scale for p in front], [p["accuracy"] for p in front], color="#e45756", alpha=0.6)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("top-1 accuracy")
        ax.grid(True, alpha=0.3)
        if not have:
            ax.text(0.5, 0.5, f"no {key} measured", ha="center", transform=ax.transAxes)
    fig.suptitle("Pareto front (red): accuracy vs latency and size per stage")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _img(data: bytes | None, alt: str) -> str:
    return (
        ""
        if not data
        else f'<img alt="{html.escape(alt)}" style="max-width:100%" '
        f'src="data:image/png;base64,{base64.b64encode(data).decode()}"/>'
    )


def _bench_plots(report: dict) -> list[bytes]:
    """The PNG plots the bench stages wrote, read so the page carries them inline."""
    run_dir = Path(report["run_dir"])
    found = []
    for s in report["stages"]:
        for name in s.get("plots") or []:
            path = run_dir / "stages" / s["stage_dir"] / name if s.get("stage_dir") else None
            if path and path.is_file():
                found.append(path.read_bytes())
    return found


def to_html(report: dict) -> str:
    head, rows = table_rows(report)
    stages = [s for s in report["stages"] if s["type"] != "bench"]
    charts = [
        _bars(
            "top-1 accuracy", [(s["name"], s["accuracy"]) for s in stages if s.get("accuracy") is not None], "{:.4f}"
        ),
        _bars("MACs (millions)", [(s["name"], s["macs"] / 1e6) for s in stages if s.get("macs")], "{:.2f}"),
        _bars(
            "size on disk (kB)", [(s["name"], s["size_bytes"] / 1024) for s in stages if s.get("size_bytes")], "{:.1f}"
        ),
        _bars(
            "latency p50 at batch 1 (ms)",
            [
                (f"{s['name']} ({s['latency_ms']['backend']})", s["latency_ms"]["p50"])
                for s in stages
                if s.get("latency_ms")
            ],
            "{:.3f}",
        ),
    ]
    table = (
        "<table><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        + "</table>"
    )
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid "
        "#ccc;padding:4px 8px;text-align:right}"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>effvision "
        f"report</title><style>{style}</style></head><body>"
        f"<h1>effvision report</h1><p>{html.escape(str(report['recipe']))} &rarr; "
        f"{html.escape(report['run_dir'])}</p>{table}"
        + f"<h2>Accuracy against latency and size</h2>{_img(pareto_png(report), 'Pareto plot')}"
        + "".join(
            f"<h2>Benchmark</h2>{_img(png, 'latency and throughput against batch size')}"
            for png in _bench_plots(report)
        )
        + "<h2>Per stage</h2>"
        + "".join(f"<div>{c}</div>" for c in charts)
        + "</body></html>\n"
    )
