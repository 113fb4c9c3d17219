"""report.json / report.md / report.html of a run folder, built from the stages' metrics.json."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

from .errors import EffvisionError
from .fileio import read_json, write_json, write_text

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
    fast = (
        measured["ms"] <= target["latency_ms"]
        if target.get("latency_ms") is not None
        else True  # no speed asked: the fastest file within max_drop
        if target.get("speedup") is None
        else measured["speedup"] >= target["speedup"]
    )
    drop, delta = target.get("max_drop"), measured["accuracy_delta"]
    accurate = True if drop is None else None if delta is None else -delta <= drop + 1e-9
    out.update(
        measured_speedup=measured["speedup"],
        measured_ms=measured["ms"],
        accuracy_delta=delta,
        met=None if accurate is None else bool(fast and accurate),
    )
    return out


def target_line(report: dict) -> str | None:
    """One line on the target: met or not, by how much, at what accuracy."""
    t = report.get("target")
    if not t:
        return None
    if t.get("measured_speedup") is None:
        return f"Target: not measured ({t['measured_by']})."
    goal = (
        f"{t['latency_ms']} ms"
        if t.get("latency_ms") is not None
        else "the fastest file within max_drop"
        if t.get("speedup") is None
        else f"{t['speedup']}x"
    )
    acc = (
        f", top-1 {100 * t['accuracy_delta']:+.2f} points"
        + (f" (max drop {100 * t['max_drop']:.2f})" if t.get("max_drop") is not None else "")
        if t.get("accuracy_delta") is not None
        else ""
    )
    verdict = {True: "met", False: "NOT met", None: "speed measured, accuracy not compared"}[t["met"]]
    return (
        f"Target {goal} on {t['backend']} at batch {t['batch']}: {verdict}; measured "
        f"{t['measured_speedup']:.2f}x ({t['measured_ms']:.3f} ms){acc}."
    )


def fmt_num(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f}{unit}"
    return str(n)


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, div in (("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


_SHORT = {"onnxruntime-cpu": "ort-cpu", "torch-eager": "eager"}


def _measured_with(stage: dict) -> str:
    views = f", {stage['clips']} clips x {stage['crops']} crops" if stage.get("views") else ""
    return (stage.get("evaluated_with") or "-") + views


def table_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    """The per-stage table shared by report.md, report.html and the CLI."""
    head = [
        "#",
        "stage",
        "type",
        "params",
        "MACs",
        "size",
        "top-1",
        "measured with",
        "p50 ms (b=1)",
        "samples/s",
        "wall s",
        "time-to-acc s",
    ]
    rows = []
    for i, s in enumerate(report["stages"], 1):
        lat, tp = s.get("latency_ms"), s.get("throughput")
        rows.append(
            [
                str(i),
                s["name"],
                s["type"],
                fmt_num(s.get("params")),
                fmt_num(s.get("macs")),
                fmt_bytes(s.get("size_bytes")),
                f"{s['accuracy']:.4f}" if s.get("accuracy") is not None else "-",
                _measured_with(s),
                f"{lat['p50']:.3f} {_SHORT.get(lat['backend'], lat['backend'])}" if lat else "-",
                f"{tp['samples_per_s']:.0f} (b={tp['batch']})" if tp else "-",
                f"{s.get('wall_s', 0):.1f}",
                f"{s['time_to_accuracy_s']:.1f}" if s.get("time_to_accuracy_s") is not None else "-",
            ]
        )
    return head, rows


def _data_path(stage: dict) -> str:
    """How a training stage's batches were made, and the samples per second it trained at."""
    d = stage["data"]
    rate = d.get("train_samples_per_s")
    return f"{stage['name']} {d['path']}" + (f", {rate:,.0f} samples/s" if rate else "")


def to_markdown(report: dict) -> str:
    head, rows = table_rows(report)
    out = [f"# effvision report: {report['run_dir']}", "", f"Recipe: `{report['recipe']}`"]
    if report.get("dataset"):
        d = report["dataset"]
        out.append(
            f"Dataset: {d['name']} ({d['modality']}), train {d['train_size']}, val {d['val_size']}, "
            f"{d.get('bad_samples', 0)} unreadable files skipped"
        )
        if d.get("points_per_sample"):
            out.append(
                f"Points per sample: {d['points_per_sample']} kept by the {d['sampler']} sampler "
                f"({fmt_bytes(d['bytes_per_sample'])}) "
                f"of {d['source_points_per_sample']:g} in the files ({fmt_bytes(d['source_bytes_per_sample'])} on disk)"
            )
    out += headline_lines(report)
    out += plan_lines(report.get("plan"))
    out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    trained = [s for s in report["stages"] if (s.get("data") or {}).get("path")]
    if trained:
        out += ["", "Training data: " + "; ".join(_data_path(s) for s in trained) + "."]
    for s in report["stages"]:
        if s["type"] in ("quantize", "qat") and s.get("decision"):
            out += ["", f"Int8 ({s['name']}): {s['decision']}."] + _int8_details(s)
        if s.get("views"):
            out += [
                "",
                f"Test views ({s['name']}): {s['clips']} clips x {s['crops']} crops = {s['views']} forward passes "
                "per video, "
                f"{fmt_num(s.get('macs_per_video'))} MACs, {s.get('frames_decoded_per_video')} decoded frames and "
                f"{s.get('ms_per_video')} ms per video (decoding included).",
            ]
        if s["type"] == "select":
            out += [
                "",
                f"Selection ({s['name']}): {s['selected']} of {s['of']} training samples kept by `{s['selector']}` "
                f"(budget {s['budget']}"
                f"{', weighted' if s.get('weighted') else ''}); proxy training {s['proxy_train_s']:.1f} s, scoring "
                f"{s['scoring_s']:.1f} s. "
                "Later stages train on them.",
            ]
    bench = [s for s in report["stages"] if s["type"] == "bench"]
    if bench and bench[-1].get("all_measurements"):
        from .deploy.results import markdown_table

        out += ["", "## Benchmark (every artifact)", "", markdown_table(bench[-1]["all_measurements"])]
        out += [
            f"![latency and throughput against batch size](stages/{bench[-1]['stage_dir']}/{p})"
            for p in bench[-1].get("plots") or []
        ]
        rf = bench[-1].get("roofline")
        if rf:
            how = rf.get("peak_how") or {}
            peaks = "; ".join(
                f"{k} {v / 1e9:.1f} GFLOP/s" + (f" ({how[k]})" if k in how else "")
                for k, v in rf["matmul_flops_per_s"].items()
                if v
            )
            out += [
                "",
                f"Device limits ({rf['device']}): peak {peaks}; copy {rf['copy_bytes_per_s'] / 1e9:.1f} GB/s, "
                "measured in the same run.",
            ]
    out += [
        "",
        "Accuracy is top-1 on the validation split of the artifact each stage produced; ONNX stages are measured by "
        "running the file in ONNX Runtime.",
    ]
    out += ["", "Artifacts: " + ", ".join(f"{k}: `{v}`" for k, v in report["artifacts"].items())]
    e = report["env"]
    out += [
        "",
        f"Environment: torch {e['torch']}, onnxruntime {e['onnxruntime']}, timm {e['timm']}, CPU {e['cpu']} "
        f"({e['cpu_count']} cores), GPU {e['gpu'] or 'none'}, git {e['git_sha']}",
        "",
    ]
    return "\n".join(out)


def plan_lines(plan: dict | None) -> list[str]:
    """The plan stage's levers as a table: what each gave and cost here, what was kept, what was
    left to pruning."""
    if not plan:
        return []
    floor = "no floor" if plan["max_drop"] is None else f"floor {100 * plan['max_drop']:.2f} points"
    goal = "the fastest file" if plan["goal_speedup"] is None else f"{plan['goal_speedup']:.2f}x"
    out = [
        "",
        f"Plan for {goal} on {plan['backend']} at batch {plan['batch']} ({floor}), levers "
        f"timed against the uncompressed model's fp32 file ({plan['timed']}), scored on {plan['scored_on']}:",
        "",
        "| lever | p50 ms | speed-up | top-1 (held out) | cost, points | kept |",
        "|---|---|---|---|---|---|",
        f"| reference: fp32 @{plan['reference']['size']} | {plan['reference']['p50_ms']:.3f} | 1.00x | "
        f"{plan['reference']['top1']:.4f} | 0.00 |  |",
    ]
    for lv in plan["levers"]:
        if lv["lever"] == f"fp32@{plan['reference']['size']}":
            continue
        out.append(
            f"| {lv['lever']} | {lv['p50_ms']:.3f} | {lv['speedup']:.2f}x | {lv['top1']:.4f} | "
            f"{100 * lv['cost']:.2f} | {'kept' if lv.get('kept') else ''} |"
        )
    left = (
        "nothing is pruned"
        if not plan["prune"]
        else "pruning goes on while the floor holds"
        if plan["remainder"] is None
        else f"pruning aims at the remaining {plan['remainder']:.2f}x"
    )
    return [*out, "", f"Kept {plan['kept']['lever']}: {plan['why']}; {left}."]


def headline_lines(report: dict) -> list[str]:
    """The final artifact against the uncompressed model on one backend (report.md, the CLI)."""
    h, ref = report.get("headline"), report.get("reference")
    aim = [target_line(report)] if report.get("target") else []
    if not h or not ref:
        if any(s["type"] == "bench" for s in report["stages"]):
            why = "no stage compressed the model, or the bench stage ran with `reference: false`"
            return ["", f"No headline: {why}.", *aim]
        return ["", *aim] if aim else []
    speed = ", ".join(f"{v:.2f}x at b={b}" for b, v in h["speedups"].items())
    size = f"{h['size_ratio']:.2f}x the size" if h.get("size_ratio") is not None else "size not compared"
    acc = (
        f"top-1 {ref['accuracy'] + h['accuracy_delta']:.4f} against {ref['accuracy']:.4f} "
        f"({100 * h['accuracy_delta']:+.2f} points)"
        if h.get("accuracy_delta") is not None
        else "top-1 not compared"
    )
    lines = [
        "",
        f"**Headline**: `{h['final']}` against the {ref['what']} ({ref['stage']}), both on {h['backend']}, "
        f"{ref['timed']}: speed-up {speed}; {size}; {acc}. Per-stage torch figures below are labelled `eager`.",
    ]
    return lines + aim


def _int8_details(stage: dict) -> list[str]:
    out = []
    for g in stage.get("speed_groups") or []:
        times = ", ".join(f"b={b} {g['p50_ms_int8'][b]:.3f} vs {g['p50_ms_float'][b]:.3f} ms" for b in g["p50_ms_int8"])
        out.append(f"- speed: {g['group']} ({g['layers']} nodes) int8 vs float: {times} -> {g['decision']}")
    search = stage.get("accuracy_search")
    if search and "ranking" not in search:  # a runtime's own tool: the whole graph, no node reverted
        out.append(
            f"- accuracy ({stage.get('tool')}): fp32 {search['fp32_accuracy']:.4f}, int8 "
            f"{search['int8_accuracy']:.4f}, max_drop {search['max_drop']}" + ("" if search["met"] else "; not met")
        )
    elif search:
        reverted = [r for r in search["ranking"] if r.get("decision") == "reverted"]
        out.append(
            f"- accuracy: fp32 {search['fp32_accuracy']:.4f}, all-int8 {search['int8_accuracy']:.4f}, max_drop "
            f"{search['max_drop']}: {len(reverted)} of {len(search['ranking'])} ranked nodes reverted to float"
            + (f" ({', '.join(r['layer'] for r in reverted[:8])})" if reverted else "")
            + ("" if search["met"] else "; not met")
        )
    parity = stage.get("parity")
    if parity:
        out.append(
            f"- parity: the int8 file agrees with the simulated QAT model on {parity['agreement']:.2%} of "
            f"{parity['samples']} validation samples (top-1 {parity['onnx_accuracy']:.4f} in ONNX Runtime, "
            f"{parity['simulated_accuracy']:.4f} simulated)" + ("" if parity["met"] else "; below min_agreement")
        )
    return out


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
