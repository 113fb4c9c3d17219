"""Benchmark results as files: JSON (everything), a Markdown table and PNG plots of latency and
throughput against batch size, one line per backend/precision (and model, in a suite)."""

from __future__ import annotations

from pathlib import Path

from ..fileio import atomic_write, write_json, write_text


def label(row: dict) -> str:
    parts = [row.get("model") or row.get("stage"), row["backend"], row["precision"]]
    if row.get("compile_mode") not in (None, "default"):
        parts.append(row["compile_mode"])
    if row.get("channels_last"):
        parts.append("channels_last")
    return " / ".join(p for p in parts if p)


def not_measured(row: dict) -> tuple[str, str] | None:
    """(status, reason) of a row without figures (a suite cell that failed, was skipped, is
    unavailable here or never ran); None for a measurement."""
    if row.get("status", "measured") != "measured":
        return row["status"], row.get("reason", "")
    return None


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _mib(mem) -> str:
    return "-" if not mem else f"{mem['bytes'] / (1 << 20):.0f}"


def _notes(row: dict) -> str:
    """What a reader needs to judge the row: how it was quantized and how much of it."""
    notes = [row["quantization"]] if row.get("quantization") else []
    if row.get("interleaved"):
        notes.append(f"interleaved with {len(row['interleaved']['with'])} more")
    if row.get("quantized_layers") is not None:
        notes.append(f"{row['quantized_layers']} layers quantized")
    return "; ".join(notes)


def markdown_table(rows: list[dict]) -> str:
    head = [
        "model",
        "backend",
        "precision",
        "batch",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "samples/s",
        "GFLOP/s",
        "% of peak",
        "peak MiB",
        "first call ms",
        "notes",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if not_measured(r):
            status, reason = not_measured(r)
            lines.append(
                f"| {r.get('model') or r.get('stage') or '-'} | {r['backend']} | {r['precision']} | "
                f"{r.get('batch', '-')} | "
                f"{status}: {reason} |" + " |" * (len(head) - 5)
            )
            continue
        name = (r.get("model") or r.get("stage") or "-") + (" (cl)" if r.get("channels_last") else "")
        backend = r["backend"] + (f" ({r['compile_mode']})" if r.get("compile_mode") not in (None, "default") else "")
        gflops = r.get("achieved_flops_per_s")
        lines.append(
            f"| {name} | {backend} | {r['precision']} | {r['batch']} | {r['p50']:.3f} | {r['p90']:.3f} | "
            f"{r['p99']:.3f} | "
            f"{r['samples_per_s']:.1f} | {'-' if gflops is None else f'{gflops / 1e9:.1f}'} | "
            f"{_pct(r.get('fraction_of_peak'))} | "
            f"{_mib(r.get('peak_memory'))} | {r.get('first_call_ms', 0):.0f} | {_notes(r)} |"
        )
    return "\n".join(lines) + "\n"


def parity_table(exports: list[dict]) -> str:
    """One row per verified export: how far its logits are from PyTorch's and how often its
    top-1 prediction agrees."""
    head = ["model", "artifact", "input", "max abs diff", "mean abs diff", "top-1 agreement", "samples", "MB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in exports:
        if e.get("error"):
            lines.append(f"| {e.get('model', '-')} | {e['artifact']} | failed: {e['error']} |" + " |" * (len(head) - 3))
            continue
        lines.append(
            f"| {e.get('model', '-')} | {e['artifact']} | {'x'.join(map(str, e['input_shape']))} | "
            f"{e['max_abs_diff']:.3g} | "
            f"{e['mean_abs_diff']:.3g} | {100 * e['top1_agreement']:.1f}% | {e['samples']} | "
            f"{e['size_bytes'] / 1e6:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot_sweep(rows: list[dict], path: str | Path, title: str = "") -> Path | None:
    """Latency p50 and throughput against batch size, one line per label; None if matplotlib is
    missing (the JSON and Markdown still carry every figure)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series: dict[str, list[dict]] = {}
    for r in rows:
        if not not_measured(r):
            series.setdefault(label(r), []).append(r)
    if not series:
        return None
    fig, (lat, tp) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.get_cmap("tab20").colors  # more series than the default 10-colour cycle
    owners = sorted({(r.get("model") or r.get("stage") or "") for pts in series.values() for r in pts})
    for i, (name, pts) in enumerate(series.items()):
        pts = sorted(pts, key=lambda r: r["batch"])
        b = [p["batch"] for p in pts]
        style = dict(
            marker="o",
            label=name,
            color=colors[i % len(colors)],
            linestyle=("-", "--", ":", "-.")[owners.index(pts[0].get("model") or pts[0].get("stage") or "") % 4],
        )
        lat.plot(b, [p["p50"] for p in pts], **style)
        tp.plot(b, [p["samples_per_s"] for p in pts], **style)
    for ax, y in ((lat, "latency p50 (ms)"), (tp, "throughput (samples/s)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size")
        ax.set_ylabel(y)
        ax.grid(True, which="both", alpha=0.3)
    tp.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()

    def save(tmp: Path) -> None:
        fig.savefig(tmp, format="png", dpi=110)

    out = atomic_write(path, save)
    plt.close(fig)
    return out


def write_results(
    rows: list[dict], out_dir: str | Path, meta: dict, title: str = "effvision bench", plot: bool = True
) -> dict[str, Path]:
    """results.json, results.md and (unless plot=False: it takes a good part of a second)
    bench.png in out_dir, each written atomically; returns the paths written."""
    out_dir = Path(out_dir)
    paths = {"json": write_json(out_dir / "results.json", {**meta, "results": rows})}
    md = [f"# {title}", "", markdown_table(rows)]
    if meta.get("exports"):
        md += ["## Export parity (against PyTorch)", "", parity_table(meta["exports"])]
    png = plot_sweep(rows, out_dir / "bench.png", title) if plot else None
    if png or (out_dir / "bench.png").is_file():
        paths["png"] = png
        md += ["![latency and throughput against batch size](bench.png)", ""]
    paths["md"] = write_text(out_dir / "results.md", "\n".join(md))
    return paths
