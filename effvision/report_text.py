"""report.md: the run's table, headline, plan and int8 details as text (and the number formats
the command line prints with)."""

from __future__ import annotations

from .goals import goal_of


def target_line(report: dict) -> str | None:
    """One line on the target: met or not, by how much, at what accuracy."""
    t = report.get("target")
    if not t:
        return None
    if t.get("measured_speedup") is None:
        return f"Target: not measured ({t['measured_by']})."
    goal = goal_of(t).describe()
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
        out.append(splits_line(d))
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


def splits_line(dataset: dict) -> str:
    """Which data the figures are on and which the choices were scored on."""
    said = f"Figures are measured on the whole validation split ({dataset['val_size']} samples)"
    split = dataset.get("decision")
    if not split:
        return said + "; no choice was scored on data (no decision split held out)."
    said += (
        f"; every choice on the decision split: {split['n']} training images held out at load time (of "
        f"{split['of']}, stratified, seed {split['seed']}, {split['sha256']}), never trained on"
    )
    return said + (f"; {split['starting_model']}." if split.get("starting_model") else ".")


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
