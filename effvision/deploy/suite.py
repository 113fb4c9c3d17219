"""Benchmark suites: the fixed sets of models x (backend, precision, compile mode) x batch sizes
behind the tables in BENCHMARKS.md. `cpu` runs here; `gpu` is what `make gpu-bench` runs on one
CUDA GPU. A suite writes results.json / results.md / bench.png into its folder after every model
(a crash or the time budget loses nothing measured), exports through the verified exporters (the
parity figures land beside each artifact and in results.json) and measures the device's roofline
in the same run.

    python -m effvision.deploy.suite cpu --out runs/bench-cpu --images ../shared/testdata/images/cifar10_test
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

import torch

from ..device import resolve_device
from ..errors import EffvisionError
from .backends import backend as get_backend
from .backends import check_pair
from .bench import batch_groups, benchmark
from .exporters import export_for_backend, export_verified

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
        "runs": [("torch-eager", p, None) for p in ("fp32", "tf32", "bf16", "fp16", "int8", "float8")]
        + [
            ("torch-compile", "bf16", "default"),
            ("torch-compile", "bf16", "reduce-overhead"),
            ("torch-compile", "fp16", "reduce-overhead"),
            ("torch-compile", "fp32", "default"),
            ("torch-compile", "int8", "reduce-overhead"),
            ("torch-compile", "float8", "reduce-overhead"),
            ("onnxruntime-cuda", "fp32", None),
            ("onnxruntime-cuda", "fp16", None),
        ],
    },
}


def real_images(folder: str | Path, size: int, mean, std):
    """(calibration, validation) loaders over a labelled image folder: every third image
    calibrates, the others verify, so the check never sees its own calibration data."""
    from torch.utils.data import DataLoader

    from ..data import Subset, _Transformed
    from ..data.images import ImageFolderDataset
    from ..data.transforms import eval_transform

    ds, tf = ImageFolderDataset(Path(folder)), eval_transform(size, mean, std)
    calib = [i for i in range(len(ds)) if i % 3 == 0]
    val = [i for i in range(len(ds)) if i % 3]
    return tuple(DataLoader(_Transformed(Subset(ds, idx), tf), batch_size=32) for idx in (calib, val))


def build_model(
    label: str, arch: str, weights: dict[str, str], variant_of: str = "torchvision:resnet18"
) -> tuple[torch.nn.Module, str]:
    """The model for a suite row and where its weights came from."""
    from ..models import create_model, load_checkpoint

    if label in weights:
        return load_checkpoint(weights[label]).eval(), f"checkpoint {weights[label]}"
    if arch == "variant":  # no pipeline checkpoint given: the pruned structure, untrained
        from ..compress.prune import prune

        model = create_model(variant_of, num_classes=1000).eval()
        prune(model, 0.5, "l2")
        return model.eval(), "random init, pruned 50% by torch-pruning (no checkpoint given: speed only)"
    return create_model(arch, num_classes=1000).eval(), "random init (speed only)"


def _norm_of(model) -> tuple:
    """The normalisation a checkpoint was trained with (its dataset card), else ImageNet's."""
    data = getattr(model, "effvision_spec", {}).get("data")
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
) -> dict:
    from ..env import collect_env
    from ..models import count_macs
    from .results import write_results
    from .roofline import Roofline

    if name not in SUITES:
        raise EffvisionError(f"unknown suite '{name}' (choices: {', '.join(SUITES)})")
    suite, weights = SUITES[name], weights or {}
    device = resolve_device(suite["device"])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    roofline = Roofline(device)
    rows, exports, models = [], [], {}
    shape, batches = suite["input_size"], suite["batches"]
    meta = {"suite": name, "device": str(device), "input_shape": shape, "batches": batches, "env": collect_env()}

    def save():
        meta.update(
            roofline=roofline.summary(), models=models, exports=exports, elapsed_s=round(time.perf_counter() - start, 1)
        )
        write_results(rows, out_dir, meta, f"effvision {name} suite ({meta['env']['gpu'] or meta['env']['cpu']})")

    built = {}
    for label, arch in suite["models"].items():
        if only and label not in only:
            continue
        model, source = build_model(label, arch, weights)
        macs = count_macs(model, shape)
        models[label] = {
            "arch": arch,
            "weights": source,
            "macs": macs,
            "params": sum(p.numel() for p in model.parameters()),
        }
        loaders = real_images(images, shape[-1], *_norm_of(model)) if images else (None, None)
        built[label] = (model, macs, *loaders)
        try:
            native = (
                native_agreement(model, images, out_dir / "artifacts" / label, shape)
                if images and label in weights
                else None
            )
        except (EffvisionError, RuntimeError, ValueError) as exc:
            native = {
                "artifact": "model.int8.native.onnx",
                "error": (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300],
            }
        if native:
            exports.append({"model": label, **native})
    # Run by run across the models, so a spent budget cuts the slowest configurations of every
    # model rather than whole models.
    for backend, precision, mode in suite["runs"]:
        for label, (model, macs, calib, val) in built.items():
            work = out_dir / "artifacts" / label
            base = {
                "model": label,
                "backend": backend,
                "precision": precision,
                **({"compile_mode": mode} if mode else {}),
            }
            if budget_s and time.perf_counter() - start > budget_s:
                rows.append({**base, "error": f"skipped: time budget {budget_s:.0f}s spent"})
                continue
            log(f"[{time.perf_counter() - start:6.0f}s] {label}: {backend} {precision}{' ' + mode if mode else ''}")
            try:
                check_pair(backend, precision, device)
                takes = get_backend(backend).takes
                for group in batch_groups(takes, batches):
                    target = model
                    if takes != "model":
                        target, figures = export_for_backend(
                            model, takes, precision, work, shape, calib, val, batch=group[0]
                        )
                        if figures:
                            exports.append({"model": label, **figures})
                    found = benchmark(
                        target,
                        shape,
                        backend,
                        precision,
                        group,
                        device,
                        suite["channels_last"] and takes == "model",
                        mode or "default",
                        warmup or suite["warmup"],
                        repeats or suite["repeats"],
                        macs=macs,
                        roofline=roofline,
                        calibration=(x for x, _ in calib) if calib is not None else (),
                    )
                    rows += [{"model": label, **r} for r in found]
            except (EffvisionError, RuntimeError, ValueError, NotImplementedError, AssertionError, ImportError) as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
                rows.append({**base, "error": f"{type(exc).__name__}: {first}"})
                if os.environ.get("EFFVISION_DEBUG"):
                    traceback.print_exc()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        save()
    save()
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m effvision.deploy.suite", description="Run a benchmark suite (see BENCHMARKS.md)."
    )
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument(
        "--out", default=os.environ.get("OUT"), help="output folder (default: $OUT, else runs/bench-<suite>)"
    )
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
        "--budget", type=float, default=None, help="seconds; later runs are skipped (and listed) once spent"
    )
    parser.add_argument("--models", help="comma list: only these suite models")
    parser.add_argument("--repeats", type=int)
    parser.add_argument("--warmup", type=int)
    args = parser.parse_args(argv)
    try:
        weights = dict(w.split("=", 1) for w in args.weights)
    except ValueError:
        print(f"effvision: error: --weights takes MODEL=CHECKPOINT, got {args.weights}", file=sys.stderr)
        return 2
    out = args.out or f"runs/bench-{args.suite}"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
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
        )
    except EffvisionError as exc:
        print(f"effvision: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}/results.json, results.md, bench.png in {meta['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
