"""What every study shares: rows kept in a results file as they are measured (a rerun resumes
where a killed one stopped), mean and spread over seeds, and a plot of curves with error bars."""

from __future__ import annotations

import io
import statistics
from pathlib import Path
from typing import Callable, Iterable

from ..fileio import atomic_write, read_json, write_json
from ..progress import log


class Rows:
    """Measured rows of a study in <out>/results.json; a row whose key is already there is not
    measured again (so a study stopped halfway resumes), unless the study's settings changed."""

    def __init__(self, out_dir: Path, settings: dict):
        self.path = Path(out_dir) / "results.json"
        saved = read_json(self.path) if self.path.is_file() else {}
        if saved.get("settings") == settings:
            self.rows = saved.get("rows", [])
        else:
            if saved:
                log(f"[yellow]{self.path}: the study's settings changed; measuring afresh[/]")
            self.rows = []
        self.settings = settings

    def get(self, **key) -> dict | None:
        return next((r for r in self.rows if all(r.get(k) == v for k, v in key.items())), None)

    def measure(self, key: dict, run: Callable[[], dict]) -> dict:
        row = self.get(**key)
        if row is None:
            row = {**key, **run()}
            self.rows.append(row)
            self.save()
        return row

    def save(self, **extra) -> Path:
        return write_json(self.path, {"settings": self.settings, "rows": self.rows, **extra})


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    v = list(values)
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)


def plot_curves(
    path: Path,
    curves: dict[str, list[tuple[float, float, float]]],
    xlabel: str,
    ylabel: str,
    title: str,
    reference: tuple[str, float] | None = None,
    logx: bool = False,
    joined: bool = True,
) -> Path | None:
    """(x, mean, std) points with error bars per label: one line per label, or (joined=False)
    separate labelled points, each its own setting. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, pts in curves.items():
        pts = sorted(pts)
        xs, means, stds = zip(*pts, strict=True)
        ax.errorbar(
            xs,
            means,
            yerr=stds,
            marker="o",
            capsize=3,
            label=label if joined else None,
            linestyle=("--" if label == "random" else "-") if joined else "none",
            color=None if joined else "#4c78a8",
        )
        if not joined:
            ax.annotate(label, (xs[0], means[0]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    if reference:
        ax.axhline(reference[1], color="grey", linestyle=":", label=reference[0])
    if logx:
        ax.set_xscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, alpha=0.3)
    if joined or reference:
        ax.legend(fontsize=8)
    return save_png(fig, path)


def save_png(fig, path: Path) -> Path:
    """A matplotlib figure written atomically as PNG, then closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return atomic_write(path, lambda p: p.write_bytes(buf.getvalue()))


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(
        ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    )
