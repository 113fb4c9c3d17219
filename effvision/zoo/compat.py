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


def _child(name: str, size: int, num_classes: int, ratio: float, timeout_s: float, folder: str) -> None:
    """One model in its own process: a stuck step dumps its stack to trace.txt and exits."""
    import faulthandler
    import warnings

    from ..fileio import write_json, write_text

    warnings.simplefilter("ignore")  # torch-pruning's and the exporter's notes would bury the table

    trace = open(Path(folder) / "trace.txt", "w")
    faulthandler.dump_traceback_later(timeout_s, exit=True, file=trace)
    r = run_conformance(
        f"timm:{name}",
        [3, size, size],
        num_classes=num_classes,
        prune_ratio=ratio,
        on_step=lambda step: write_text(Path(folder) / "step.txt", step),
    )
    faulthandler.cancel_dump_traceback_later()
    write_json(Path(folder) / "result.json", r.as_dict())
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


def run_isolated(name: str, size: int, num_classes: int, ratio: float, timeout_s: float) -> Conformance:
    """run_conformance in a fresh process, so a step that never ends (or crashes the
    interpreter) becomes a row saying where, not a hung sweep."""
    import multiprocessing as mp
    import tempfile

    from ..fileio import read_json

    with tempfile.TemporaryDirectory() as folder:
        proc = mp.get_context("spawn").Process(target=_child, args=(name, size, num_classes, ratio, timeout_s, folder))
        start = time.perf_counter()
        proc.start()
        proc.join(2 * timeout_s + 120)  # the child stops itself; this is for a wedged one
        if proc.is_alive():
            proc.kill()
            proc.join()
        result_file, step_file = Path(folder) / "result.json", Path(folder) / "step.txt"
        if result_file.is_file():
            data = read_json(result_file)
            data.pop("ok", None)
            r = Conformance(**data)
            r.cause = r.cause or (None if r.ok else "not classified (the rerun without effvision did not finish)")
            return r
        step = step_file.read_text() if step_file.is_file() else "create"
        where = stuck_in((Path(folder) / "trace.txt").read_text())
        timed_out = time.perf_counter() - start >= timeout_s
        reason = (
            (f"did not finish in {timeout_s:.0f} s" + (f" (stuck in {where})" if where else ""))
            if timed_out
            else f"the process died (exit code {proc.exitcode})"
        )
        r = Conformance(
            f"timm:{name}",
            [3, size, size],
            failed_step=step,
            reason=reason,
            seconds=round(time.perf_counter() - start, 1),
        )
        r.passed = list(STEPS[: STEPS.index(step)])
        r.cause = f"upstream: {where.split('/')[0]}" if timed_out and where else "not classified"
        return r


def run_compat(
    names: list[str],
    size: int = 224,
    num_classes: int = 10,
    prune_ratio: float = 0.3,
    timeout_s: float = 300,
    progress=None,
) -> list[Conformance]:
    """Every model in its own process with a time limit; a typo in a name fails before any runs."""
    import timm

    from ..registry import UnknownNameError, suggest

    names = list(names)
    for n in names:
        if not timm.is_model(n):
            raise UnknownNameError(suggest(n, timm.list_models(), "timm model"))
    items = progress(names, "conformance") if progress else names
    return [run_isolated(n, size, num_classes, prune_ratio, timeout_s) for n in items]


def _mparams(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def to_markdown(rows: list[Conformance], size: int, prune_ratio: float, env: dict, command: str) -> str:
    from ..deploy.exporters import FP32_RELATIVE_TOLERANCE

    passed = sum(r.ok for r in rows)
    lines = [
        "# Compatibility: timm's efficient models through effvision",
        "",
        f"Generated by `{command}` (effvision {env.get('effvision')}, git {env.get('git_sha')}; timm "
        f"{env.get('timm')}, "
        f"torch {env.get('torch')}, torch-pruning {env.get('torch_pruning')}, onnxruntime {env.get('onnxruntime')}; "
        f"{env.get('cpu')}).",
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
        "| model | params (M) | pruned (M) | MACs (G) | pruned MACs (G) | parity max diff | relative | top-1 agree "
        "| result | failing step: reason | s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in rows:
        macs = "-" if r.macs is None else f"{r.macs / 1e9:.3f}"
        pmacs = "-" if r.pruned_macs is None else f"{r.pruned_macs / 1e9:.3f}"
        err = "-" if r.parity_error is None else f"{r.parity_error:.1e}"
        rel = "-" if r.parity_relative is None else f"{r.parity_relative:.1e}"
        agree = "-" if r.parity_agreement is None else f"{r.parity_agreement:.0%}"
        why = "" if r.ok else f"{r.failed_step}: {r.reason} — {r.cause}".replace("|", "\\|")
        name = r.name.removeprefix("timm:")
        lines.append(
            f"| {name} | {_mparams(r.params)} | {_mparams(r.pruned_params)} | {macs} | {pmacs} | {err} | {rel} | "
            f"{agree} | {'pass' if r.ok else 'FAIL'} | {why} | {r.seconds:.0f} |"
        )
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


def write_compat(rows: list[Conformance], path: str | Path, size: int, prune_ratio: float, command: str) -> Path:
    from ..env import collect_env
    from ..fileio import write_json, write_text

    path = Path(path)
    env = collect_env()
    write_json(
        path.with_suffix(".json"),
        {"env": env, "command": command, "size": size, "prune_ratio": prune_ratio, "rows": [r.as_dict() for r in rows]},
    )
    return write_text(path, to_markdown(rows, size, prune_ratio, env, command))
