"""What an exported model needs to be run by someone else: its classes, its preprocessing, its
input, the accuracy it was measured at and what made it (timm's pretrained_cfg, TFLite's
metadata). One JSON document, stored

- in an ONNX file as `metadata_props["effvision"]` (readable with onnxruntime alone:
  `InferenceSession(path).get_modelmeta().custom_metadata_map["effvision"]`),
- beside a .pte program as `<file>.json` (ExecuTorch programs carry no free-form metadata),
- in an effvision checkpoint under its `metadata` key.

The preprocessing is named in the dataset card's words (size, resize, interpolation, mean, std;
frames and sampler for video; points, channels and sampler for point clouds), so the same readers
as training rebuild it (`effvision predict`) and a bundle's predict.py can follow it by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import EffvisionError
from ..fileio import write_json

KEY = "effvision"
FORMAT = "effvision-model/1"
LAYOUTS = {"image": "NCHW", "video": "NCTHW", "points": "NCP"}


def class_names(dataset_card, model_card=None, num_classes: int | None = None) -> list[str]:
    """The classes in output order: the dataset card's, ImageNet's for an ImageNet card (timm's
    descriptions), else their indices."""
    if dataset_card is not None and dataset_card.classes:
        return list(dataset_card.classes)
    if model_card is not None and model_card.dataset == "imagenet-1k" and model_card.num_classes == 1000:
        from timm.data import ImageNetInfo

        return list(ImageNetInfo().label_descriptions())
    return [str(i) for i in range(num_classes or 0)]


def preprocessing(dataset_card, modality: str, input_size: list[int], sampler: str | None = None) -> dict:
    """How a file becomes the model's input, from the (resolved) dataset card the model was
    evaluated with; `input_size` fixes frames and points (a recipe may override the card's)."""
    c = dataset_card
    if modality == "points":
        return {
            "points": int(input_size[1]),
            "channels": int(input_size[0]),
            "normalisation": "unit_sphere",  # centred on the centroid, scaled into the unit sphere
            "sampler": sampler or c.sampler or "fps",
            "sampler_options": dict(c.sampler_options),
            "cache_points": c.cache_points,
            "mesh_points": c.mesh_points,
            "bin_width": c.bin_width,
            "up_axis": c.up_axis,
        }
    out = {
        "size": c.image_size,
        "resize": (c.resize or c.image_size) if modality == "video" else c.image_size,
        "interpolation": c.interpolation,
        "mean": list(c.mean),
        "std": list(c.std),
        "scale": 255,  # uint8 RGB divided by 255 before mean and std
        "channel_order": "RGB",
    }
    if modality == "video":
        out.update(
            frames=int(input_size[1]), sampler=sampler or c.sampler or "tsn", sampler_options=dict(c.sampler_options)
        )
    return out


def card_preprocessing(pre) -> dict:
    """A pretrained model card's own pipeline (resize the short side to size / crop_fraction,
    centre-crop size)."""
    return {
        "size": pre.size,
        "resize": pre.resize,
        "interpolation": pre.interpolation,
        "mean": list(pre.mean),
        "std": list(pre.std),
        "scale": 255,
        "channel_order": "RGB",
    }


def describe(
    modality: str,
    classes: list[str],
    prep: dict,
    input_size: list[int],
    batch: int | None = None,
    accuracy: dict | None = None,
    source: dict | None = None,
) -> dict:
    """The document. batch None: the batch dimension is dynamic (ONNX); else the program's fixed one."""
    from ..env import git_sha, package_version

    return {
        "format": FORMAT,
        "task": "classification",
        "modality": modality,
        "classes": list(classes),
        "preprocessing": prep,
        "input": {
            "name": "input",
            "shape": [batch if batch else "batch", *input_size],
            "layout": LAYOUTS[modality],
            "dtype": "float32",
            "dynamic_axes": {} if batch else {"0": "batch"},
        },
        "output": {"name": "logits", "shape": ["batch" if not batch else batch, len(classes)], "softmax": False},
        "accuracy": accuracy,
        "source": {"effvision": package_version("effvision"), "commit": git_sha(), **(source or {})},
    }


def for_data(bundle, model, **kw) -> dict:
    """The document of a model evaluated on a DatasetBundle (a run's data or an export's)."""
    from ..models.zoo import get_card

    spec = getattr(model, "effvision_spec", {}) or {}
    kw.setdefault("source", {})
    kw["source"] = {"model": spec.get("name"), "arch": spec.get("arch"), "data": bundle.name, **kw["source"]}
    prep = preprocessing(bundle.card, bundle.modality, bundle.input_size, bundle.card.sampler_name(bundle.config))
    names = bundle.classes if bundle.classes else class_names(bundle.card, get_card(spec.get("name", "")))
    return describe(bundle.modality, names, prep, list(bundle.input_size), **kw)


def for_artifact(bundle, model, top1: float, path: Path | None = None, source: dict | None = None) -> dict:
    """The document of a model or its exported file (path: a runtime's file; None: the checkpoint),
    with the top-1 just measured on the bundle's whole validation split in the file's runtime.
    Format, precision, fixed batch and runtime are read from the file itself (a file that does not
    say its precision takes its exporter's word, source["precision"])."""
    batch, fmt, precision, runtime = None, "checkpoint", "fp32", "torch"
    if path is not None:
        from ..runtimes import runtime_of_path

        files = runtime_of_path(path)
        batch = files.input_shape(path)[0] or None  # 0: a dynamic batch
        fmt, runtime, precision = (
            files.format,
            files.name,
            files.precision(path, (source or {}).get("precision")),
        )
    meta = for_data(bundle, model, batch=batch, source={**(source or {}), "format": fmt, "precision": precision})
    return with_accuracy(meta, top1, "val", len(bundle.val), runtime, bundle.name)


def for_card(card) -> dict:
    """The document of a zoo card's model, from its dataset card (or its own preprocessing)."""
    from ..data.cards import get_card as get_dataset_card

    data = None
    if card.dataset:
        try:
            data = get_dataset_card(card.dataset)
        except EffvisionError:
            data = None  # e.g. imagenet-1k: no dataset card, the model card's preprocessing says it all
    if card.modality == "image" and card.preprocessing is not None:
        prep = card_preprocessing(card.preprocessing)
    elif data is not None:
        prep = preprocessing(data, card.modality, list(card.input_size))
    else:
        raise EffvisionError(f"model card {card.name} names neither a dataset card nor its preprocessing")
    trained = card.trained
    accuracy = (
        {"top1": trained.accuracy, "split": trained.split, "data": card.dataset, "runtime": "torch"}
        if trained
        else None
    )
    source = {"model": card.name, "arch": card.arch, "data": card.dataset}
    if trained:
        source.update(recipe=trained.recipe, stage=trained.stage)
    return describe(
        card.modality, class_names(data, card, card.num_classes), prep, list(card.input_size), None, accuracy, source
    )


# -- storage ---------------------------------------------------------------------------


def sidecar(path: str | Path) -> Path:
    return Path(str(path) + ".json")


def write_metadata(path: str | Path, meta: dict) -> Path:
    """Store `meta` where the artifact's runtime keeps it: in the file (ONNX), else beside it."""
    from ..runtimes import runtime_of_path

    path = Path(path)
    if not runtime_of_path(path).write_metadata(path, KEY, json.dumps(meta)):
        write_json(sidecar(path), meta)
    return path


def read_metadata(path: str | Path) -> dict | None:
    """The document of an artifact, or None when it carries none (a plain ONNX file)."""
    from ..runtimes import runtime_of_path

    path = Path(path)
    files = runtime_of_path(path)
    if files.suffix is None and path.suffix in (".pt", ".pth"):
        from ..models.checkpoint import read_checkpoint

        return read_checkpoint(path).get("metadata")
    if files.keeps_metadata_inside:
        text = files.read_metadata(path, KEY)
    else:
        text = sidecar(path).read_text() if sidecar(path).is_file() else None
    if text is None:
        return None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EffvisionError(f"{path}: its effvision metadata is not JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise EffvisionError(f"{path}: its metadata is not {FORMAT}")
    return meta


def with_accuracy(meta: dict, top1: float, split: str, samples: int, runtime: str, data: str | None) -> dict:
    return {**meta, "accuracy": {"top1": top1, "split": split, "samples": samples, "runtime": runtime, "data": data}}


def plain(input_size: list[int], mean: Any, std: Any, size: int | None, num_classes: int) -> dict:
    """The document of an ONNX classifier without ours, from what the user says it expects."""
    side = size or input_size[-1]
    prep = {
        "size": side,
        "resize": side,
        "interpolation": "bilinear",
        "mean": list(mean),
        "std": list(std),
        "scale": 255,
        "channel_order": "RGB",
    }
    return describe("image", [str(i) for i in range(num_classes)], prep, [3, side, side])
