"""`effvision.load(path)`: any artifact (ONNX, ExecuTorch .pte, an effvision checkpoint, a zoo
card name) as a predictor that prepares its inputs the way the model was evaluated, from the
metadata the artifact carries (deploy/metadata.py), with the readers training uses."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from ..errors import EffvisionError
from . import metadata as md


class Preprocess:
    """One input (a file path, bytes, a PIL image or an array) to one model input, as the
    validation split was fed: images decoded to RGB, resized, centre-cropped, normalised; clips
    sampled and decoded by the frame sampler; clouds read, normalised and sampled."""

    def __init__(self, meta: dict):
        self.modality, self.p = meta["modality"], meta["preprocessing"]
        p = self.p
        if self.modality == "image":
            from ..data.images.transforms import eval_transform

            self.transform = eval_transform(p["size"], p["mean"], p["std"], p["resize"], p["interpolation"])
        elif self.modality == "video":
            from ..data.video.frame_samplers import get_sampler
            from ..data.video.transforms import video_eval_transform

            self.sampler = get_sampler(p["sampler"], p["frames"], **p.get("sampler_options", {}))
            self.transform = video_eval_transform(p["size"], p["mean"], p["std"])
        else:
            from ..data.cards import DatasetCard
            from ..data.points.samplers import get_point_sampler

            self.card = DatasetCard(
                name="predict",
                source="pointfolder",
                modality="points",
                **{k: p[k] for k in ("cache_points", "mesh_points", "bin_width", "up_axis")},
                channels=p["channels"],
            )
            self.sampler = get_point_sampler(p["sampler"], p["points"], **p.get("sampler_options", {}))

    def __call__(self, item: Any) -> torch.Tensor:
        if self.modality == "image":
            return self.transform(self._image(item))
        if self.modality == "video":
            if not isinstance(item, (str, os.PathLike)):
                raise EffvisionError("a video model takes video file paths")
            clip = self.sampler.clip(item, self.p["resize"], train=False)
            frames = torch.from_numpy(np.ascontiguousarray(clip.frames)).permute(0, 3, 1, 2)
            return self.transform(frames)
        from ..data.points.datasets import prepare_cloud
        from ..data.points.samplers import normalize_unit_sphere
        from ..data.points.transforms import point_eval_transform

        if isinstance(item, (str, os.PathLike)):
            cloud, _ = prepare_cloud(Path(item), self.card)
        else:
            cloud = normalize_unit_sphere(np.asarray(item, dtype=np.float32)[:, : self.card.channels])
        points = self.sampler(cloud, False, np.random.default_rng(0)).points
        return point_eval_transform(points)

    @staticmethod
    def _image(item: Any) -> torch.Tensor:
        from PIL import Image

        from ..data.images.folders import decode_image, rgb8

        if isinstance(item, (str, os.PathLike)):
            return decode_image(Path(item).read_bytes())
        if isinstance(item, bytes):
            return decode_image(item)
        if isinstance(item, Image.Image):
            return torch.from_numpy(rgb8(item).copy()).permute(2, 0, 1).contiguous()
        arr = np.asarray(item)
        if arr.ndim == 3 and arr.shape[-1] == 3 and arr.dtype == np.uint8:  # H x W x RGB, as Pillow gives
            return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()
        raise EffvisionError(
            f"an image model takes paths, bytes, PIL images or H x W x 3 uint8 arrays, not {arr.shape}"
        )


class Predictor:
    """`predict(x)` on one input or a list: the top-k (class, probability) pairs of each."""

    def __init__(self, run: Callable[[np.ndarray], np.ndarray], meta: dict, artifact: str, runtime: str):
        self.run, self.meta, self.artifact, self.runtime = run, meta, artifact, runtime
        self.classes, self.modality = meta["classes"], meta["modality"]
        self.preprocess = Preprocess(meta)

    def probabilities(self, batch: torch.Tensor | np.ndarray) -> np.ndarray:
        """Softmax over the classes of a batch already preprocessed."""
        x = batch.numpy() if isinstance(batch, torch.Tensor) else np.asarray(batch, dtype=np.float32)
        logits = np.asarray(self.run(x), dtype=np.float64)
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def top(self, probs: np.ndarray, k: int = 5) -> list[tuple[str, float]]:
        order = np.argsort(-probs)[:k]
        return [(self.classes[i] if i < len(self.classes) else str(i), float(probs[i])) for i in order]

    def predict(self, x: Any, topk: int = 5):
        many = isinstance(x, (list, tuple))
        items = list(x) if many else [x]
        probs = self.probabilities(torch.stack([self.preprocess(i) for i in items]))
        tops = [self.top(p, topk) for p in probs]
        return tops if many else tops[0]

    def __repr__(self) -> str:
        return f"Predictor({self.artifact}, {self.modality}, {len(self.classes)} classes, {self.runtime})"


def _plain_meta(path: str, shape: list[int], num_classes: int, mean, std, size) -> dict:
    if mean is None or std is None:
        raise EffvisionError(
            f"{path} carries no effvision metadata: pass --mean and --std (and --size) of the preprocessing it was "
            "trained with, e.g. --mean 0.485,0.456,0.406 --std 0.229,0.224,0.225"
        )
    if len(shape) != 3:
        raise EffvisionError(f"{path} takes input {shape}: without metadata only image models (C, H, W) are known")
    return md.plain(shape, mean, std, size, num_classes)


def _override(meta: dict, mean, std, size) -> dict:
    """A user's --mean/--std/--size win over what the file says (an image model's)."""
    if meta["modality"] != "image" or (mean is None and std is None and size is None):
        return meta
    p = dict(meta["preprocessing"])
    p.update({k: list(v) for k, v in (("mean", mean), ("std", std)) if v is not None})
    if size is not None:
        p.update(size=size, resize=size)
    return {**meta, "preprocessing": p}


def load(
    artifact: str | Path,
    backend: str | None = None,
    mean: list[float] | None = None,
    std: list[float] | None = None,
    size: int | None = None,
) -> Predictor:
    """A predictor for an ONNX file, a .pte program, an effvision checkpoint or a zoo card name,
    preprocessing inputs as its metadata says (or --mean/--std/--size for a plain ONNX file)."""
    from ..models import is_checkpoint_path
    from ..runtimes import open_file, runtime_of_path

    path = str(artifact)
    files = runtime_of_path(path)
    runtime = files.check_backend(backend)
    if (files.suffix is not None or is_checkpoint_path(path)) and not Path(path).is_file():
        raise EffvisionError(f"artifact not found: {path}")
    if files.suffix is not None:
        meta = md.read_metadata(path)
        run = open_file(path, runtime)
        if meta is None:
            shape = files.input_shape(path)[1:]
            meta = _plain_meta(path, shape, _num_outputs(run, shape), mean, std, size)
    else:
        from ..scoring import torch_predictor

        model, meta = _torch_model(path)
        run = _numpy(torch_predictor(model))
    return Predictor(run, _override(meta, mean, std, size), path, runtime)


def _numpy(predict: Callable) -> Callable:
    return lambda x: predict(torch.from_numpy(np.ascontiguousarray(x))).numpy()


def _num_outputs(run: Callable, shape: list[int]) -> int:
    return int(np.asarray(run(np.zeros((1, *shape), np.float32))).shape[-1])


def _torch_model(spec: str):
    """A checkpoint (its metadata, or what its spec says it was trained on) or a zoo card."""
    from ..models import is_checkpoint_path, load_model
    from ..models.zoo import get_card

    model = load_model(spec)
    if not is_checkpoint_path(spec):
        return model, md.for_card(get_card(spec))
    return model, getattr(model, "effvision_metadata", None) or _spec_meta(model.effvision_spec, spec)


def _spec_meta(spec: dict, path: str) -> dict:
    """A checkpoint written before exports carried metadata: its data's card says the rest."""
    from ..data import resolved_card
    from ..models.zoo import get_card
    from ..recipe import DataConfig

    data = spec.get("data") or {}
    card = get_card(spec.get("name", ""))
    if not data.get("name"):
        if card is not None:
            return md.for_card(card)
        raise EffvisionError(f"{path} says neither its dataset nor its preprocessing")
    config = DataConfig(name=data["name"], image_size=data.get("image_size"))
    dcard = resolved_card(config, card.preprocessing if card is not None else None)
    modality = spec.get("modality") or dcard.modality
    prep = md.preprocessing(dcard, modality, list(spec["input_size"]))
    names = md.class_names(dcard, card, spec["num_classes"])
    return md.describe(modality, names, prep, list(spec["input_size"]), source={"model": spec.get("name")})
