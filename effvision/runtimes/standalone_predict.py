"""Run the model of this bundle on files: python predict.py [--topk K] [--json FILE] INPUT...

Copied into every deployment bundle (effvision export --bundle, runs/<name>/bundle/) as
predict.py. It needs only the file's runtime (onnxruntime for model.onnx, openvino for an IR's
model.xml), numpy and Pillow (PyAV for a video model, open3d for a point-cloud model's meshes and
PLY/PCD files): neither torch nor effvision. The model's classes and preprocessing come from
model.json beside it (the same document the file carries inside). Inputs: files or folders
(walked recursively); a folder whose files sit in folders named after classes is also scored
against those labels."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
EXTENSIONS = {
    "image": {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"},
    "video": {".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg", ".ogv", ".3gp", ".flv", ".wmv", ".ts"},
    "points": {".ply", ".pcd", ".xyz", ".xyzn", ".xyzrgb", ".pts", ".txt", ".npy", ".off", ".obj", ".stl", ".bin"},
}


# -- images: short side to `resize` (Pillow, antialiased), centre crop `size`, /255, mean, std ----
def resize_short_side(img, side: int, interpolation: str):
    from PIL import Image

    w, h = img.size
    if min(w, h) == side:
        return img
    scale = side / min(w, h)
    size = (side, int(h * scale)) if w <= h else (int(w * scale), side)
    modes = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "nearest": Image.NEAREST}
    return img.resize(size, modes[interpolation])


def centre_crop(arr: np.ndarray, size: int) -> np.ndarray:
    h, w = arr.shape[:2]
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return arr[top : top + size, left : left + size]


def normalise(arr: np.ndarray, p: dict) -> np.ndarray:
    x = arr.astype(np.float32) / float(p["scale"])
    return (x - np.asarray(p["mean"], np.float32)) / np.asarray(p["std"], np.float32)


def image_input(path: Path, p: dict) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB")
        img = resize_short_side(img, p["resize"], p["interpolation"])
        arr = centre_crop(np.asarray(img), p["size"])
    return normalise(arr, p).transpose(2, 0, 1)  # C, H, W


# -- video: `frames` frames, one from the centre of each of `frames` equal segments -----------
def video_input(path: Path, p: dict) -> np.ndarray:
    import av

    with av.open(str(path)) as container:
        frames = [f.to_image() for f in container.decode(video=0)]
    if not frames:
        raise ValueError("no frames")
    if p.get("sampler", "tsn") != "tsn":
        print(f"note: the model was evaluated with the {p['sampler']} sampler; this script samples as tsn")
    n, k = len(frames), p["frames"]
    edges = np.linspace(0, n, k + 1)
    picks = [min(n - 1, int(lo + 0.5 * (hi - lo))) for lo, hi in zip(edges[:-1], edges[1:], strict=True)]
    clip = []
    for i in picks:
        img = resize_short_side(frames[i], p["resize"], "bilinear")
        clip.append(normalise(centre_crop(np.asarray(img.convert("RGB")), p["size"]), p))
    return np.stack(clip).transpose(3, 0, 1, 2)  # C, T, H, W


# -- point clouds: xyz (+ channels), unit sphere, farthest-point sample of `points` ---------
def read_cloud(path: Path, p: dict) -> np.ndarray:
    ext = path.suffix.lower()
    if ext == ".npy":
        pts = np.load(path, allow_pickle=False)
    elif ext in (".xyz", ".xyzn", ".xyzrgb", ".pts", ".txt"):
        pts = np.loadtxt(path.read_text().replace(",", " ").splitlines(), dtype=np.float32, ndmin=2)
    elif ext == ".bin":
        pts = np.fromfile(path, dtype=np.float32).reshape(-1, p.get("bin_width") or 4)
    else:
        import open3d as o3d

        mesh = o3d.io.read_triangle_mesh(str(path)) if ext in (".off", ".obj", ".stl") else None
        if mesh is not None and len(mesh.triangles):
            pts = np.asarray(mesh.sample_points_uniformly(p["mesh_points"]).points)
        else:
            pts = np.asarray(o3d.io.read_point_cloud(str(path)).points)
    pts = np.asarray(pts, np.float32)
    pts = pts[np.isfinite(pts[:, :3]).all(axis=1)]
    if pts.ndim != 2 or pts.shape[1] < 3 or not len(pts):
        raise ValueError("no points")
    return pts


def farthest_points(xyz: np.ndarray, k: int) -> np.ndarray:
    chosen = np.zeros(k, np.int64)
    dist = np.full(len(xyz), np.inf)
    for i in range(1, k):
        dist = np.minimum(dist, ((xyz - xyz[chosen[i - 1]]) ** 2).sum(1))
        chosen[i] = int(dist.argmax())
    return chosen


def points_input(path: Path, p: dict) -> np.ndarray:
    pts = read_cloud(path, p)[:, : p["channels"]]
    pts = pts - np.r_[pts[:, :3].mean(axis=0), np.zeros(pts.shape[1] - 3)].astype(np.float32)
    radius = float(np.sqrt((pts[:, :3] ** 2).sum(axis=1)).max())
    if radius > 0:
        pts[:, :3] /= radius
    n = p["points"]
    idx = farthest_points(pts[:, :3], n) if len(pts) > n else np.resize(np.arange(len(pts)), n)
    return pts[idx].T.astype(np.float32)  # C, N


READERS = {"image": image_input, "video": video_input, "points": points_input}


def inputs(args: list[str], modality: str) -> list[Path]:
    found = []
    for a in args:
        path = Path(a)
        if path.is_dir():
            found += sorted(f for f in path.rglob("*") if f.is_file() and f.suffix.lower() in EXTENSIONS[modality])
        elif path.is_file():
            found.append(path)
        else:
            print(f"{a}: skipped: not found")
    return found


def onnxruntime_runner(model: Path):
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def openvino_runner(model: Path):
    """An OpenVINO IR (model.xml, its weights in model.bin), in f32 as it was measured."""
    import openvino as ov

    compiled = ov.Core().compile_model(
        str(model), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    )
    request = compiled.create_infer_request()

    def run(x):
        request.infer({0: x})
        return request.get_output_tensor(0).data.copy()

    return run


def litert_invoke(interpreter, x):
    """One batch through a LiteRT interpreter: its input resized to the batch's shape; an int8
    file's int8 input and output (de)quantized with the scales the file carries."""
    inp = interpreter.get_input_details()[0]
    if list(inp["shape"]) != list(x.shape):
        interpreter.resize_tensor_input(inp["index"], list(x.shape))
        interpreter.allocate_tensors()
        inp = interpreter.get_input_details()[0]
    if inp["dtype"] != np.float32:
        scale, zero = inp["quantization"]
        info = np.iinfo(inp["dtype"])
        x = np.clip(np.round(x / scale) + zero, info.min, info.max).astype(inp["dtype"])
    interpreter.set_tensor(inp["index"], x)
    interpreter.invoke()
    out = interpreter.get_output_details()[0]
    y = interpreter.get_tensor(out["index"])
    if y.dtype != np.float32:
        scale, zero = out["quantization"]
        return (y.astype(np.float32) - zero) * scale
    return np.array(y, dtype=np.float32)


def litert_runner(model: Path):
    """A LiteRT file (model.tflite) in ai-edge-litert's interpreter (XNNPACK)."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(model))
    interpreter.allocate_tensors()
    return lambda x: litert_invoke(interpreter, x)


RUNNERS = {".onnx": onnxruntime_runner, ".xml": openvino_runner, ".tflite": litert_runner}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="files or folders")
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--json", help="write the predictions here")
    parser.add_argument("--model", default=None, help="the model file (default: the one beside this script)")
    args = parser.parse_args(argv)

    meta = json.loads((HERE / "model.json").read_text())
    model = Path(args.model) if args.model else HERE / meta["file"]
    run = RUNNERS[model.suffix](model)
    classes, p, read = meta["classes"], meta["preprocessing"], READERS[meta["modality"]]
    rows, correct, labelled, start = [], 0, 0, time.perf_counter()
    for path in inputs(args.inputs, meta["modality"]):
        try:
            x = read(path, p)[None].astype(np.float32)
        except Exception as exc:  # a bad file is a status line, never a stop
            print(f"{path}: skipped: {(str(exc).splitlines() or [type(exc).__name__])[0][:200]}")
            continue
        logits = run(x)[0].astype(np.float64)
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        top = [(classes[i], float(probs[i])) for i in np.argsort(-probs)[: args.topk]]
        label = path.parent.name if path.parent.name in classes else None
        labelled += label is not None
        correct += label is not None and top[0][0] == label
        rows.append({"input": str(path), "top": [{"class": c, "p": round(q, 6)} for c, q in top], "label": label})
        print(f"{path}: " + "  ".join(f"{c} {q:.3f}" for c, q in top))
    seconds = time.perf_counter() - start
    line = f"{len(rows)} predicted in {seconds:.2f} s"
    if labelled:
        line += f"; top-1 against folder labels {correct / labelled:.4f} ({correct}/{labelled})"
    print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"predictions": rows, "top1": correct / labelled if labelled else None}))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
