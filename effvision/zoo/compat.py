"""docs/compat.md: the conformance run over timm's efficient families, one row per model.

`effvision zoo compat` writes it; every row is measured when the command runs (nothing cached).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from .conformance import STEPS, Conformance, run_conformance

# timm's compact families; ImageNet input size (224), 10 classes.
DEFAULT_MODELS = (
    "mobilenetv2_050",
    "mobilenetv2_100",
    "mobilenetv2_140",
    "mobilenetv3_small_050",
    "mobilenetv3_small_075",
    "mobilenetv3_small_100",
    "mobilenetv3_large_075",
    "mobilenetv3_large_100",
    "mobilenetv4_conv_small",
    "mobilenetv4_conv_medium",
    "mobilenetv4_hybrid_medium",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_es",
    "efficientnet_lite0",
    "tf_efficientnet_lite0",
    "ghostnet_050",
    "ghostnet_100",
    "ghostnetv2_100",
    "ghostnetv3_100",
    "regnetx_002",
    "regnetx_004",
    "regnety_002",
    "regnety_004",
    "mobilevit_xxs",
    "mobilevit_xs",
    "mobilevitv2_050",
    "mobilevitv2_075",
    "fastvit_t8",
    "fastvit_t12",
    "fastvit_s12",
    "efficientvit_b0",
    "efficientvit_m0",
    "efficientvit_m1",
    "repvit_m0_9",
    "repvit_m1",
    "repvit_m1_0",
    "levit_128s",
    "levit_conv_128s",
    "edgenext_xx_small",
    "edgenext_x_small",
    "convnext_atto",
    "convnext_femto",
    "convnext_pico",
    "tinynet_a",
    "tinynet_e",
    "hardcorenas_a",
    "hardcorenas_f",
    "lcnet_050",
    "lcnet_100",
    "mobileone_s0",
    "mobileone_s1",
    "fbnetc_100",
    "mnasnet_100",
    "semnasnet_100",
    "spnasnet_100",
    "rexnet_100",
    "efficientformerv2_s0",
    "resnet10t",
    "resnet18",
)


def plain_torch_pruning_error(name: str, size: int, num_classes: int, ratio: float) -> str | None:
    """Prune a fresh copy with torch-pruning alone (MetaPruner, L2, only the classifier kept) and
    run it: the error it hits, or None when it works. Tells an upstream limit from a defect of ours."""
    import torch
    import torch_pruning as tp

    from ..errors import one_line
    from ..models.adapters import classifier_of
    from ..models.builder import create_model

    model = create_model(f"timm:{name}", num_classes=num_classes, input_size=[3, size, size]).eval()
    x = torch.randn(1, 3, size, size)
    try:
        tp.pruner.MetaPruner(
            model,
            x,
            importance=tp.importance.GroupMagnitudeImportance(p=2),
            pruning_ratio=ratio,
            ignored_layers=[classifier_of(model)],
        ).step()
        with torch.inference_mode():
            model(x)
    except Exception as exc:  # noqa: BLE001
        return one_line(exc, 240)
    return None


def export_unpruned_error(name: str, size: int, num_classes: int) -> str | None:
    import tempfile

    from ..deploy import export_onnx
    from ..errors import one_line
    from ..models.builder import create_model

    model = create_model(f"timm:{name}", num_classes=num_classes, input_size=[3, size, size])
    with tempfile.TemporaryDirectory() as tmp:
        try:
            export_onnx(model, f"{tmp}/m.onnx", shape=[3, size, size])
        except Exception as exc:  # noqa: BLE001
            return one_line(exc, 240)
    return None


def blame(r: Conformance, size: int, num_classes: int, ratio: float) -> str:
    """Whose failure a row is: rerun the failing step without effvision where that is possible."""
    name = r.name.removeprefix("timm:")
    if r.failed_step in ("prune", "pruned forward"):
        err = plain_torch_pruning_error(name, size, num_classes, ratio)
        return f"upstream: torch-pruning alone fails too ({err})" if err else "effvision: torch-pruning alone works"
    if r.failed_step in ("export", "parity"):
        err = export_unpruned_error(name, size, num_classes)
        return (
            f"upstream: the unpruned model fails to export too ({err})"
            if err
            else "effvision or pruning: the unpruned model exports"
        )
    return "not classified"


def _child(
    name: str, size: int, num_classes: int, ratio: float, timeout_s: float, folder: str, runtimes: list[str]
) -> None:
    """One model in its own process: a stuck step dumps its stack to trace.txt and exits. Each other
    runtime gets its own time limit, and the row so far is on disk before each starts."""
    import faulthandler
    import warnings

    from ..fileio import write_json, write_text
    from ..runtimes import runtime_named

    warnings.simplefilter("ignore")  # torch-pruning's and the exporter's notes would bury the table

    trace = open(Path(folder) / "trace.txt", "w")

    def on_step(step: str) -> None:
        write_text(Path(folder) / "step.txt", step)
        if step.startswith("runtime "):
            faulthandler.cancel_dump_traceback_later()
            faulthandler.dump_traceback_later(timeout_s, exit=True, file=trace)

    faulthandler.dump_traceback_later(timeout_s, exit=True, file=trace)
    r = run_conformance(
        f"timm:{name}",
        [3, size, size],
        num_classes=num_classes,
        prune_ratio=ratio,
        on_step=on_step,
        runtimes=[runtime_named(n) for n in runtimes],
        on_row=lambda row: write_json(Path(folder) / "result.json", row.as_dict()),
    )
    faulthandler.cancel_dump_traceback_later()
    write_json(Path(folder) / "result.json", r.as_dict())
    write_text(Path(folder) / "step.txt", "done")
    if not r.ok:  # the rerun without effvision gets its own time limit; the row above stands if it hangs
        faulthandler.dump_traceback_later(timeout_s, exit=True, file=open(Path(folder) / "blame-trace.txt", "w"))
        r.cause = blame(r, size, num_classes, ratio)
        faulthandler.cancel_dump_traceback_later()
        write_json(Path(folder) / "result.json", r.as_dict())


def stuck_in(trace: str) -> str | None:
    """The innermost library frame of a faulthandler dump, as package/file.py:function."""
    for line in trace.splitlines():  # most recent call first
        m = re.search(r'site-packages/([^"]+)", line \d+ in (\w+)', line)
        if m:
            return f"{m.group(1)}:{m.group(2)}"
    return None


def _why_stopped(folder: Path, timeout_s: float, exitcode) -> tuple[str, str | None]:
    """(reason, where it was stuck) for a child that stopped inside a step: faulthandler's dump
    says "Timeout" when the step's time limit stopped it."""
    trace_file = folder / "trace.txt"
    trace = trace_file.read_text() if trace_file.is_file() else ""
    if "Timeout (" in trace:
        where = stuck_in(trace)
        return f"did not finish in {timeout_s:.0f} s" + (f" (stuck in {where})" if where else ""), where
    return f"the process died (exit code {exitcode})", None


def run_isolated(
    name: str, size: int, num_classes: int, ratio: float, timeout_s: float, runtimes: list[str] = ()
) -> Conformance:
    """run_conformance in a fresh process, so a step that never ends (or crashes the
    interpreter) becomes a row saying where, not a hung sweep."""
    import multiprocessing as mp
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        args = (name, size, num_classes, ratio, timeout_s, folder, list(runtimes))
        proc = mp.get_context("spawn").Process(target=_child, args=args)
        start = time.perf_counter()
        proc.start()
        proc.join((2 + len(runtimes)) * timeout_s + 120)  # the child stops itself; this is for a wedged one
        if proc.is_alive():
            proc.kill()
            proc.join()
        return child_row(Path(folder), name, size, timeout_s, proc.exitcode, time.perf_counter() - start)


def child_row(folder: Path, name: str, size: int, timeout_s: float, exitcode, seconds: float) -> Conformance:
    """The row a finished or stopped child left in `folder`: its result.json, with the runtime it
    stopped in (a hang or a crash) as that runtime's cell, the rest of the row kept; without one,
    a row failed at the step it stopped in."""
    from ..fileio import read_json

    result_file, step_file = folder / "result.json", folder / "step.txt"
    step = step_file.read_text() if step_file.is_file() else "create"
    if result_file.is_file():
        data = read_json(result_file)
        data.pop("ok", None)
        r = Conformance(**data)
        running = step.removeprefix("runtime ")
        if step.startswith("runtime ") and running not in r.runtimes:  # it stopped in this runtime
            r.runtimes[running] = {"ok": False, "reason": _why_stopped(folder, timeout_s, exitcode)[0]}
        r.cause = r.cause or (None if r.ok else "not classified (the rerun without effvision did not finish)")
        return r
    reason, where = _why_stopped(folder, timeout_s, exitcode)
    r = Conformance(f"timm:{name}", [3, size, size], failed_step=step, reason=reason, seconds=round(seconds, 1))
    r.passed = list(STEPS[: STEPS.index(step)])
    r.cause = f"upstream: {where.split('/')[0]}" if where else "not classified"
    return r


def run_compat(
    names: list[str],
    size: int = 224,
    num_classes: int = 10,
    prune_ratio: float = 0.3,
    timeout_s: float = 300,
    progress=None,
    runtimes: list[str] = (),
) -> list[Conformance]:
    """Every model in its own process with a time limit; a typo in a name fails before any runs.
    `runtimes`: the other runtimes (by name) each pruned model is also converted to and checked in."""
    import timm

    from ..registry import UnknownNameError, suggest

    names = list(names)
    for n in names:
        if not timm.is_model(n):
            raise UnknownNameError(suggest(n, timm.list_models(), "timm model"))
    items = progress(names, "conformance") if progress else names
    return [run_isolated(n, size, num_classes, prune_ratio, timeout_s, runtimes) for n in items]


def compat_runtimes(names: list[str]) -> tuple[list[str], list[str]]:
    """The runtimes besides ONNX Runtime that the table gets a column for ("all": every one whose
    fp32 export is installed here, the others noted with what to install; "none": no column; named
    ones must be installed)."""
    from ..deploy.runtime_compare import BASELINE, runtimes_asked

    if names == ["none"]:
        return [], []
    if names != ["all"] and BASELINE[0] not in names:
        names = [BASELINE[0], *names]
    kept, notes = runtimes_asked(names, precision="fp32")
    return [r.name for r in kept if r.name != BASELINE[0]], notes


def _mparams(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def runtime_cell(check: dict | None) -> str:
    if check is None:
        return "-"
    return f"ok {check['relative']:.0e}" if check["ok"] else "FAIL"


def runtime_summary(rows: list[Conformance], runtimes: list[str]) -> list[str]:
    """One line per runtime: of the models whose pruned model runs, how many convert and agree."""
    reached = [r for r in rows if "pruned forward" in r.passed]
    return [
        f"{name}: {sum(bool(r.runtimes.get(name, {}).get('ok')) for r in reached)} of {len(reached)}"
        for name in runtimes
    ]


def to_markdown(
    rows: list[Conformance],
    size: int,
    prune_ratio: float,
    env: dict,
    command: str,
    runtimes: list[str] = (),
    notes: list[str] = (),
) -> str:
    from ..deploy.verify import FP32_RELATIVE_TOLERANCE

    passed = sum(r.ok for r in rows)
    optional = {"openvino": "openvino", "litert": "ai-edge-litert", "executorch": "executorch"}
    versions = ", ".join(f"{label} {env[key]}" for key, label in optional.items() if env.get(key))
    lines = [
        "# Compatibility: timm's efficient models through effvision",
        "",
        f"Generated by `{command}` (effvision {env.get('effvision')}, git {env.get('git_sha')}; timm "
        f"{env.get('timm')}, "
        f"torch {env.get('torch')}, torch-pruning {env.get('torch_pruning')}, onnxruntime {env.get('onnxruntime')}"
        + (f", {versions}" if versions else "")
        + f"; {env.get('cpu')}).",
        "",
        f"Each model is built with random weights for 10 classes at 3x{size}x{size} and taken through "
        f"{' -> '.join(STEPS)}: forward checks shape and finite logits, backward that every trainable parameter gets "
        "a gradient, "
        f"prune removes {prune_ratio:.0%} of the channels of every prunable layer group (torch-pruning, L2, "
        "classifier kept), "
        "parity compares ONNX Runtime with PyTorch on the pruned model on 6 real photographs (crops of scikit-learn's "
        f"two sample images; a batch of 6 against the export's 2): it fails where max |diff| exceeds "
        f"{FP32_RELATIVE_TOLERANCE:g} of the largest |logit| (the export stage's bound) or where one top-1 differs, "
        "int8 quantizes statically (QDQ, per-channel, min/max calibration on random inputs) and runs it. "
        "A row stops at its first failing step.",
        "",
        f"**{passed} of {len(rows)} pass every step ({passed / max(len(rows), 1):.0%}).**",
        "",
    ]
    if runtimes or notes:
        lines += [
            "The other runtimes: once a model's pruned model runs, it is also exported as each runtime's fp32 file "
            "(effvision's own export for that runtime) and run there on the same 6 photographs, judged as the ONNX "
            "file is; a cell gives `ok` and the relative difference, or FAIL (the reason is listed below the table), "
            "or - where the pruned model did not run. Convert and agree, of the models whose pruned model runs: "
            + "; ".join(runtime_summary(rows, list(runtimes)))
            + ("." if runtimes else "")
            + "".join(f" {note}." for note in notes),
            "",
        ]
    lines += _table_lines(rows, list(runtimes))
    lines += [
        "",
        "MACs are torch-pruning's count of module operations: matrix products written as functions "
        "(attention scores) are not in it, so hybrid models count low. A large max diff with a small relative one is "
        "a model whose random-weight logits are huge: MobileOne's train-time branches (several convolutions and an "
        "identity, each with batch norm at unit variance) add up in every block, so its logits reach 1e8 and more "
        "before any training; rounding is then large in absolute terms and still 1e-7 of the scale.",
        "",
    ]
    return "\n".join(lines)


def _table_lines(rows: list[Conformance], runtimes: list[str]) -> list[str]:
    """The table, a row per model and a column per runtime, and why each runtime failed."""
    lines = [
        "| model | params (M) | pruned (M) | MACs (G) | pruned MACs (G) | parity max diff | relative | top-1 agree "
        + "".join(f"| {name} " for name in runtimes)
        + "| result | failing step: reason | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|" + "---|" * len(runtimes) + "---|---|---:|",
    ]
    for r in rows:
        macs = "-" if r.macs is None else f"{r.macs / 1e9:.3f}"
        pmacs = "-" if r.pruned_macs is None else f"{r.pruned_macs / 1e9:.3f}"
        err = "-" if r.parity_error is None else f"{r.parity_error:.1e}"
        rel = "-" if r.parity_relative is None else f"{r.parity_relative:.1e}"
        agree = "-" if r.parity_agreement is None else f"{r.parity_agreement:.0%}"
        why = "" if r.ok else f"{r.failed_step}: {r.reason} — {r.cause}".replace("|", "\\|")
        cells = "".join(f"{runtime_cell(r.runtimes.get(name))} | " for name in runtimes)
        name = r.name.removeprefix("timm:")
        lines.append(
            f"| {name} | {_mparams(r.params)} | {_mparams(r.pruned_params)} | {macs} | {pmacs} | {err} | {rel} | "
            f"{agree} | {cells}{'pass' if r.ok else 'FAIL'} | {why} | {r.seconds:.0f} |"
        )
    failures = [
        f"- {r.name.removeprefix('timm:')}, {name}: {check['reason']}"
        for r in rows
        for name in runtimes
        if (check := r.runtimes.get(name)) and not check["ok"]
    ]
    if failures:
        lines += ["", "Why a runtime failed:", "", *failures]
    return lines


def write_compat(
    rows: list[Conformance],
    path: str | Path,
    size: int,
    prune_ratio: float,
    command: str,
    runtimes: list[str] = (),
    notes: list[str] = (),
) -> Path:
    from ..env import collect_env
    from ..fileio import write_json, write_text

    path = Path(path)
    env = collect_env()
    write_json(
        path.with_suffix(".json"),
        {
            "env": env,
            "command": command,
            "size": size,
            "prune_ratio": prune_ratio,
            "runtimes": list(runtimes),
            "notes": list(notes),
            "rows": [r.as_dict() for r in rows],
        },
    )
    return write_text(path, to_markdown(rows, size, prune_ratio, env, command, runtimes, notes))
