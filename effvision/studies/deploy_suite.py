"""Benchmark suites: the fixed sets of models x (backend, precision, compile mode) x batch sizes
behind the tables in BENCHMARKS.md. `cpu` runs here; `gpu` is what `make gpu-bench` runs on one
CUDA GPU. A suite writes results.json / results.md / bench.png into its folder after every model
(a crash or the time budget loses nothing measured), exports through the verified exporters (the
parity figures land beside each artifact and in results.json) and measures the device's roofline
in the same run.

    python -m effvision.studies.deploy_suite cpu --out runs/bench-cpu --images ../shared/testdata/images/cifar10_test
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..deploy.backends import BackendUnavailable, check_pair
from ..deploy.bench import benchmark, settle_shares
from ..deploy.roofline import Roofline
from ..deploy.verify import export_for_runtime, export_verified
from ..device import resolve_device
from ..errors import EffvisionError, one_line
from ..interrupts import Interrupted, deferred_signals, interruptible
from ..runtimes import runtime_of_backend
from .suite_cells import STATUSES, Clock, Predictor, describe, settle

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

# (backend, precision, torch.compile mode) in the order they run: when the time budget runs out
# the later ones are skipped (and listed as skipped), so the most asked-for figures come first.
SUITES = {
    "cpu": {
        "device": "cpu",
        "input_size": [3, 224, 224],
        "batches": [1, 32],
        "channels_last": False,
        "warmup": 5,
        "repeats": 30,
        "models": {"resnet18": "torchvision:resnet18", "mobilenetv3_small_100": "timm:mobilenetv3_small_100"},
        "runs": [
            ("onnxruntime-cpu", "fp32", None),
            ("onnxruntime-cpu", "int8", None),
            ("torch-eager", "fp32", None),
            ("executorch", "fp32", None),
            ("executorch", "int8", None),
            ("torch-compile", "fp32", "default"),
            ("torch-compile", "int8", "default"),
        ],
    },
    "gpu": {
        "device": "cuda",
        "input_size": [3, 224, 224],
        "batches": [1, 256],
        "channels_last": True,
        "warmup": 10,
        "repeats": 50,
        "models": {
            "resnet50": "torchvision:resnet50",
            "resnet18": "timm:resnet18",
            "mobilenetv3_large_100": "timm:mobilenetv3_large_100",
            "efficientnet_b0": "timm:efficientnet_b0",
            "resnet18-pruned-distilled": "variant",
        },
        # No int8/float8 rows: torchao's GPU configs quantize nn.Linear alone, one classifier
        # layer of these convolutional nets, so such a row would be bf16 under another name.
        # The eager rows first (seconds each), then the compiled ones (a cold compile each, most
        # asked-for first): a spent budget skips the tail, not the cheap rows.
        "runs": [
            ("torch-eager", "bf16", None),
            ("torch-eager", "fp16", None),
            ("torch-eager", "tf32", None),
            ("torch-eager", "fp32", None),
            ("torch-compile", "bf16", "reduce-overhead"),
            ("torch-compile", "fp16", "reduce-overhead"),
            ("torch-compile", "bf16", "default"),
            ("torch-compile", "fp32", "default"),
            ("onnxruntime-cuda", "fp32", None),
            ("onnxruntime-cuda", "fp16", None),
        ],
    },
}


def real_images(folder: str | Path, size: int, mean, std):
    """(calibration, validation) loaders over a labelled image folder: every third image
    calibrates, the others verify, so the check never sees its own calibration data."""
    from torch.utils.data import DataLoader

    from ..data import Subset, Transformed
    from ..data.images.folders import ImageFolderDataset
    from ..data.images.transforms import eval_transform

    ds, tf = ImageFolderDataset(Path(folder)), eval_transform(size, mean, std)
    calib = [i for i in range(len(ds)) if i % 3 == 0]
    val = [i for i in range(len(ds)) if i % 3]
    return tuple(DataLoader(Transformed(Subset(ds, idx), tf), batch_size=32) for idx in (calib, val))


def build_model(
    label: str, arch: str, weights: dict[str, str], variant_of: str = "torchvision:resnet18"
) -> tuple[torch.nn.Module, str]:
    """The model for a suite row and where its weights came from."""
    from ..models import create_model, load_checkpoint

    if label in weights:
        return load_checkpoint(weights[label]).eval(), f"checkpoint {weights[label]}"
    if arch == "variant":  # no pipeline checkpoint given: the pruned structure, untrained
        from ..compression.prune import prune

        model = create_model(variant_of, num_classes=1000).eval()
        prune(model, 0.5, "l2")
        return model.eval(), "random init, pruned 50% by torch-pruning (no checkpoint given: speed only)"
    return create_model(arch, num_classes=1000).eval(), "random init (speed only)"


def _norm_of(model) -> tuple:
    """The normalisation a checkpoint was trained with (its pretrained model card's, else its
    dataset card's), else ImageNet's."""
    from ..models.zoo import get_card as model_card

    spec = getattr(model, "effvision_spec", {})
    card = model_card(spec.get("name", ""))
    if card is not None and card.preprocessing is not None:
        return card.preprocessing.mean, card.preprocessing.std
    data = spec.get("data")
    if data:
        from ..data.cards import get_card

        card = get_card(data["name"])
        return card.mean, card.std
    return IMAGENET_MEAN, IMAGENET_STD


def native_agreement(model, images: str, work: Path, shape: list[int]) -> dict | None:
    """A checkpoint trained at another input size (CIFAR's 32 px) is out of its regime at the
    suite's size, where int8 agreement says little; its int8 ONNX file is then also verified at
    the size it was trained for, on the same real images (checkpoints only: a model built from
    its name has no trained size)."""
    native = list(getattr(model, "effvision_spec", {}).get("input_size") or shape)
    if native == list(shape):
        return None
    calib, val = real_images(images, native[-1], *_norm_of(model))
    _, figures = export_verified(
        model,
        "onnx",
        "int8",
        Path(work) / "model.int8.native.onnx",
        native,
        calib,
        val,
        max_batches=10_000,
        data="real images, trained input size",
    )
    return figures


def plan_cells(suite: dict, labels: list[str]) -> list[dict]:
    """Every cell of a suite, in the order it runs: run by run across the models (so a spent
    budget cuts the slowest configurations of every model rather than whole models), then batch."""
    return [
        {
            "model": label,
            "backend": backend,
            "precision": precision,
            **({"compile_mode": mode} if mode else {}),
            "batch": b,
            "status": "pending",
        }
        for backend, precision, mode in suite["runs"]
        for label in labels
        for b in suite["batches"]
    ]


def run_suite(
    name: str,
    out_dir: str | Path,
    weights: dict[str, str] | None = None,
    images: str | None = None,
    budget_s: float | None = None,
    only: list[str] | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    log=print,
    overrides: dict | None = None,
    work_dir: str | Path | None = None,
) -> dict:
    """Run a suite cell by cell. results.json and results.md hold every planned cell from the
    start and are rewritten (atomically) after each; a cell's error is recorded and the run goes
    on; a cell predicted to overrun the budget is skipped with the reason; SIGTERM/SIGINT and
    the budget's end stop the run with everything measured so far on disk (meta["stopped"]).
    `overrides` replaces suite settings (device, models, batches, input_size); exported
    artifacts go to work_dir (default: <out_dir>-artifacts), never into out_dir."""
    from ..env import collect_env

    if name not in SUITES:
        raise EffvisionError(f"unknown suite '{name}' (choices: {', '.join(SUITES)})")
    suite, weights = {**SUITES[name], **(overrides or {})}, weights or {}
    device = resolve_device(suite["device"])
    out_dir = Path(out_dir)
    work_dir = Path(work_dir) if work_dir else out_dir.with_name(out_dir.name + "-artifacts")
    out_dir.mkdir(parents=True, exist_ok=True)
    clock = Clock(budget_s)
    labels = [label for label in suite["models"] if not only or label in only]
    cells, exports, models = plan_cells(suite, labels), [], {}
    shape = suite["input_size"]
    meta = {
        "suite": name,
        "device": str(device),
        "input_shape": shape,
        "batches": suite["batches"],
        "budget_s": budget_s,
        "env": collect_env(),
    }
    title = f"effvision {name} suite ({meta['env']['gpu'] or meta['env']['cpu']})"
    save = _Saver(cells, out_dir, meta, title, clock, models, exports)
    for cell in cells:  # known before any work: a backend or precision this machine cannot run
        try:
            check_pair(cell["backend"], cell["precision"], device)
        except BackendUnavailable as exc:
            settle(cell, "unavailable", str(exc))
    save()
    current = None
    try:
        with interruptible(clock.left()):  # the deadline: what is left of the budget, whole run counted
            roofline = save.roofline = Roofline(device)
            built = {
                label: _build(label, suite, weights, images, shape, models, exports, work_dir, log) for label in labels
            }
            run = _Run(suite, device, shape, work_dir, clock, roofline, exports, repeats, warmup, log)
            for cell in (c for c in cells if c["status"] == "pending"):
                current = cell
                run.cell(cell, built[cell["model"]])
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                save()
            current = None
    except Interrupted as stop:
        meta["stopped"] = {"reason": stop.reason, "exit_code": stop.exit_code}
        log(f"[{clock.elapsed():6.0f}s] {stop.reason}: saving what was measured")
        for cell in cells:  # a cell settled before the signal (it lands as save() ends) keeps its status
            if cell["status"] == "pending":
                settle(cell, "failed" if cell is current else "skipped", stop.reason)
    save(plot=True)
    return meta


class _Saver:
    """results.json and results.md of every cell as they stand, written whole (signals wait)."""

    def __init__(self, cells, out_dir, meta, title, clock, models, exports):
        self.cells, self.out_dir, self.meta, self.title, self.clock = cells, out_dir, meta, title, clock
        self.models, self.exports, self.roofline = models, exports, None

    def __call__(self, plot: bool = False) -> None:
        from ..deploy.results import write_results

        cells, roofline = self.cells, self.roofline
        settle_shares(cells, roofline)
        self.meta.update(
            roofline=roofline.summary() if roofline else None,
            models=self.models,
            exports=self.exports,
            elapsed_s=round(self.clock.elapsed(), 1),
            cells={s: sum(c["status"] == s for c in cells) for s in STATUSES},
        )
        with deferred_signals():
            write_results(cells, self.out_dir, self.meta, self.title, plot=plot)


def _build(label, suite, weights, images, shape, models, exports, work_dir, log) -> dict:
    """A suite model with its MACs and loaders, or the reason it could not be built."""
    from ..models import count_macs

    try:
        model, source = build_model(label, suite["models"][label], weights)
    except Exception as exc:  # noqa: BLE001  (a library built for another torch raises anything)
        log(f"{label}: cannot build: {one_line(exc)}")
        models[label] = {"arch": suite["models"][label], "error": one_line(exc)}
        return {"error": f"model not built: {one_line(exc)}"}
    try:
        macs = count_macs(model, shape)
    except Exception as exc:  # noqa: BLE001
        macs = None
        models.setdefault(label, {})["macs_error"] = one_line(exc)
    models[label] = {
        **models.get(label, {}),
        "arch": suite["models"][label],
        "weights": source,
        "macs": macs,
        "params": sum(p.numel() for p in model.parameters()),
    }
    loaders = real_images(images, shape[-1], *_norm_of(model)) if images else (None, None)
    if images and label in weights:
        try:
            native = native_agreement(model, images, Path(work_dir) / label, shape)
        except Exception as exc:  # noqa: BLE001
            native = {"artifact": "model.int8.native.onnx", "error": one_line(exc)}
        if native:
            exports.append({"model": label, **native})
    return {"model": model, "macs": macs, "calib": loaders[0], "val": loaders[1]}


@dataclass
class _Run:
    """What every cell of one suite run shares."""

    suite: dict
    device: torch.device
    shape: list[int]
    work_dir: Path
    clock: Clock
    roofline: Roofline
    exports: list
    repeats: int | None
    warmup: int | None
    log: Callable[[str], None]
    predictor: Predictor = field(default_factory=Predictor)
    exported: dict = field(default_factory=dict)  # one export per model, file type and precision (.pte: and batch)

    def cell(self, cell: dict, built: dict) -> None:
        """Measure one pending cell, or settle it as failed or skipped; never raises."""
        backend, precision, batch = cell["backend"], cell["precision"], cell["batch"]
        if "error" in built:
            settle(cell, "failed", built["error"])
            return
        why = self.clock.would_overrun(self.predictor.predict(cell))
        if why:
            settle(cell, "skipped", why)
            return
        self.log(f"[{self.clock.elapsed():6.0f}s] {describe(cell)}")
        began = time.perf_counter()
        try:
            runtime = runtime_of_backend(backend)
            target = built["model"] if runtime.suffix is None else self.export(cell, built, runtime)
            (row,) = benchmark(
                target,
                self.shape,
                backend,
                precision,
                (batch,),
                self.device,
                self.suite["channels_last"] and runtime.suffix is None,
                cell.get("compile_mode") or "default",
                self.warmup or self.suite["warmup"],
                self.repeats or self.suite["repeats"],
                macs=built["macs"],
                roofline=self.roofline,
                calibration=(x for x, _ in built["calib"]) if built["calib"] is not None else (),
            )
            cell.update(row, status="measured", cell_s=round(time.perf_counter() - began, 2))
        except BackendUnavailable as exc:  # found only once loaded (an ONNX Runtime provider that did not start)
            settle(cell, "unavailable", str(exc))
        except Exception as exc:  # noqa: BLE001  (recorded: one broken cell must not end the run)
            settle(cell, "failed", one_line(exc))
            if os.environ.get("EFFVISION_DEBUG"):
                traceback.print_exc()
        self.predictor.record(cell, time.perf_counter() - began)

    def export(self, cell: dict, built: dict, runtime):
        key = (cell["model"], runtime.name, cell["precision"], runtime.file_name(cell["precision"], cell["batch"]))
        if key not in self.exported:
            self.exported[key], figures = export_for_runtime(
                built["model"],
                runtime,
                cell["precision"],
                self.work_dir / cell["model"],
                self.shape,
                built["calib"],
                built["val"],
                batch=cell["batch"],
            )
            if figures:
                self.exports.append({"model": cell["model"], **figures})
        return self.exported[key]


def _pairs(values: list[str], what: str) -> dict[str, str]:
    bad = [v for v in values if "=" not in v or not v.split("=", 1)[0]]
    if bad:
        raise EffvisionError(f"{what} takes NAME=VALUE, got {bad[0]!r}")
    return dict(v.split("=", 1) for v in values)


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise EffvisionError(f"{what} takes positive integers separated by commas, got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m effvision.studies.deploy_suite", description="Run a benchmark suite (see BENCHMARKS.md)."
    )
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT"),
        help="folder for results.json, results.md and bench.png alone (default: $OUT, else runs/bench-<suite>)",
    )
    parser.add_argument("--work", help="folder for exported artifacts (default: <out>-artifacts)")
    parser.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="MODEL=CHECKPOINT",
        help="trained weights for a suite model (repeatable)",
    )
    parser.add_argument(
        "--images", help="labelled image folder: int8 calibration and the parity/agreement check of every export"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole run: a cell predicted to overrun is skipped (and listed); at the end the run stops",
    )
    parser.add_argument("--models", help="comma list: only these suite models")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="LABEL=ARCH",
        help="replace the suite's models with these (repeatable; ARCH as in create_model, or 'variant')",
    )
    parser.add_argument("--device", help="run the suite on this device instead (e.g. cpu, for a rehearsal)")
    parser.add_argument("--batches", help="comma list of batch sizes instead of the suite's")
    parser.add_argument("--input-size", help="C,H,W instead of the suite's")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--warmup", type=int)
    args = parser.parse_args(argv)
    out = args.out or f"runs/bench-{args.suite}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        weights = _pairs(args.weights, "--weights")
        overrides = {
            k: v
            for k, v in {
                "models": _pairs(args.model, "--model") or None,
                "device": args.device,
                "batches": _ints(args.batches, "--batches") if args.batches else None,
                "input_size": _ints(args.input_size, "--input-size") if args.input_size else None,
            }.items()
            if v
        }
        meta = run_suite(
            args.suite,
            out,
            weights,
            args.images,
            args.budget,
            args.models.split(",") if args.models else None,
            args.repeats,
            args.warmup,
            log=lambda m: print(m, flush=True),
            overrides=overrides,
            work_dir=args.work,
        )
    except EffvisionError as exc:
        print(f"effvision: error: {exc}", file=sys.stderr)
        return 1
    counts = ", ".join(f"{n} {s}" for s, n in meta["cells"].items() if n)
    print(f"wrote {out}/results.json, results.md, bench.png in {meta['elapsed_s']} s ({counts})", flush=True)
    if meta.get("stopped"):
        print(f"stopped: {meta['stopped']['reason']}", flush=True)
        return meta["stopped"]["exit_code"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
