"""A deployment bundle: what a device team needs to run a shipped file without effvision.

<dir>/model.onnx        the file (its metadata inside); an OpenVINO IR is model.xml and model.bin,
                        a LiteRT file model.tflite
<dir>/model.json        the same metadata, plus the file's name and sha256
<dir>/predict.py        the file's runtime (onnxruntime, openvino or ai-edge-litert) + numpy + Pillow (PyAV or open3d
                        for video or points)
<dir>/requirements.txt  those packages
<dir>/README.md         how to call it, what the model expects, what it scored
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ..errors import EffvisionError
from ..fileio import atomic_dir, write_text
from ..runtimes import STANDALONE_PREDICT
from .metadata import read_metadata

EXTRA = {"image": [], "video": ["av"], "points": ["open3d"]}
# How the README tells a reader to open the file and find the metadata inside it, by its suffix.
LOAD = {
    ".onnx": (
        "onnxruntime",
        'onnxruntime.InferenceSession("model.onnx").get_modelmeta().custom_metadata_map["effvision"]',
    ),
    ".xml": ("openvino", 'openvino.Core().read_model("model.xml").get_rt_info(["effvision", "effvision"])'),
    ".tflite": ("ai_edge_litert", 'the "effvision" entry of the flatbuffer\'s metadata table (or model.json)'),
}


def write_bundle(artifact: str | Path, out_dir: str | Path) -> Path:
    """Write the bundle of a file carrying effvision metadata into out_dir (replaced whole): an ONNX
    file, an OpenVINO IR or a LiteRT file (runtimes whose files a predict.py without torch can run)."""
    from ..models.weights import sha256_of
    from ..runtimes import runtime_of_path

    artifact, out_dir = Path(artifact), Path(out_dir)
    runtime = runtime_of_path(artifact)
    if runtime.bundle_package is None:
        raise EffvisionError(f"a bundle holds an ONNX file, an OpenVINO IR or a LiteRT file, not {artifact.name}")
    meta = read_metadata(artifact)
    if meta is None:
        raise EffvisionError(f"{artifact} carries no effvision metadata: export it with effvision first")
    if out_dir.exists() and (
        not out_dir.is_dir() or (any(out_dir.iterdir()) and not (out_dir / "model.json").is_file())
    ):
        raise EffvisionError(f"{out_dir} exists and is not a bundle: give a new or empty folder")
    meta = {**meta, "file": f"model{runtime.suffix}", "sha256": sha256_of(artifact)}
    packages = [runtime.bundle_package, "numpy", "Pillow", *EXTRA[meta["modality"]]]

    def fill(tmp: Path) -> None:
        for f in runtime.files(artifact):  # model.onnx; model.xml and model.bin; model.tflite
            shutil.copyfile(f, tmp / f"model{f.suffix}")
        write_text(tmp / "model.json", json.dumps(meta, indent=2) + "\n")
        shutil.copyfile(STANDALONE_PREDICT, tmp / "predict.py")
        write_text(tmp / "requirements.txt", "\n".join(packages) + "\n")
        write_text(tmp / "README.md", readme(meta))

    return atomic_dir(out_dir, fill)


def readme(meta: dict) -> str:
    p, acc, src = meta["preprocessing"], meta.get("accuracy"), meta.get("source", {})
    shape = " x ".join(str(d) for d in meta["input"]["shape"])
    if meta["modality"] == "image":
        expects = (
            f"RGB images: short side resized to {p['resize']} px ({p['interpolation']}), centre crop {p['size']} px, "
            f"values / {p['scale']}, minus mean {p['mean']}, divided by std {p['std']}"
        )
    elif meta["modality"] == "video":
        expects = (
            f"clips of {p['frames']} RGB frames ({p['sampler']} sampling: one per equal segment), short side "
            f"{p['resize']} px, centre crop {p['size']} px, values / {p['scale']}, mean {p['mean']}, std {p['std']}"
        )
    else:
        expects = (
            f"point clouds of {p['points']} points x {p['channels']} values (x, y, z first), centred and scaled into "
            f"the unit sphere, {p['sampler']} sampled"
        )
    scored = (
        f"top-1 {acc['top1']:.4f} on the {acc['split']} split of {acc['data']} ({acc.get('samples')} samples), "
        f"run in {acc['runtime']}"
        if acc
        else "not measured"
    )
    names = ", ".join(meta["classes"][:20]) + (" ..." if len(meta["classes"]) > 20 else "")
    made = src.get("recipe") or src.get("exported_from")
    file = meta.get("file", "model.onnx")
    package, inside = LOAD[Path(file).suffix]
    stage = f", stage {src['stage']}" if src.get("stage") else ""
    return f"""# {src.get("model") or "model"}: a deployment bundle

Made by effvision {src.get("effvision")} (commit {src.get("commit")}) from {made}{stage}: {src.get("format")}
{src.get("precision")}.

## Run it

    pip install -r requirements.txt
    python predict.py IMAGE_OR_FOLDER... [--topk 3] [--json predictions.json]

Or in your own code: load `{file}` with {package}, feed a float32 tensor {shape}
({meta["input"]["layout"]}; input `{meta["input"]["name"]}`), read `{meta["output"]["name"]}` (logits; softmax them).

## What the model expects

{expects}.

Classes ({len(meta["classes"])}, in output order): {names}

## What it scored

{scored}.

The same metadata is in `model.json` and inside the file (`{inside}`).
"""
