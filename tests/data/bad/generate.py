"""Writes the bad-input corpus: every file is made here from a good one (truncated, emptied,
renamed, lying headers ...), never edited by hand. Run `python tests/data/bad/generate.py` to
rewrite tests/data/bad/files; tests/test_bad_inputs.py holds what each case must end in.

The files are committed so anyone can point effvision (or another tool) at them; the test also
regenerates them to check the script and the committed copy agree on the case list."""

from __future__ import annotations

import io
import json
import pickle
import struct
import sys
import zipfile
import zlib
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
RNG = np.random.default_rng(0)


# ----------------------------------------------------------------------------- good originals
def _image(mode: str = "RGB", size=(32, 24), fmt="PNG") -> bytes:
    arr = RNG.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    img = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height and whose data is one empty IDAT: a decoder that
    trusts the header allocates width*height*3 bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _video(frames: int = 16, size=(64, 48), faststart: bool = False, audio_only: bool = False) -> bytes:
    import tempfile

    import av

    options = {"movflags": "faststart"} if faststart else {}  # the moov index first: needs a real file
    tmp = tempfile.NamedTemporaryFile(suffix=".mp4")
    with tmp, av.open(tmp.name, "w", format="mp4", options=options) as out:
        if audio_only:
            stream = out.add_stream("aac", rate=16000)
            for i in range(10):
                frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
                frame.sample_rate, frame.pts = 16000, i * 1024
                for p in stream.encode(frame):
                    out.mux(p)
        else:
            stream = out.add_stream("libx264", rate=Fraction(25))
            stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
            stream.options = {"preset": "ultrafast", "threads": "1"}
            out.start_encoding()  # the header is written even when no frame follows
            for i in range(frames):
                arr = np.full((size[1], size[0], 3), (i * 15) % 255, np.uint8)
                frame = av.VideoFrame.from_ndarray(arr, format="rgb24")
                frame.pts = i
                for p in stream.encode(frame):
                    out.mux(p)
        for p in stream.encode():
            out.mux(p)
        out.close()
        return Path(tmp.name).read_bytes()


def _ply(n: int, declared: int | None = None, binary: bool = False) -> bytes:
    pts = RNG.random((n, 3)).astype(np.float32)
    fmt = "binary_little_endian 1.0" if binary else "ascii 1.0"
    head = (
        f"ply\nformat {fmt}\nelement vertex {declared or n}\nproperty float x\nproperty float y\nproperty float "
        "z\nend_header\n"
    )
    body = pts.tobytes() if binary else "".join(f"{x} {y} {z}\n" for x, y, z in pts).encode()
    return head.encode() + body


def _pcd(n: int, declared: int | None = None) -> bytes:
    pts = RNG.random((n, 3)).astype(np.float32)
    d = declared or n
    head = (
        f"# .PCD v0.7\nVERSION 0.7\nFIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 1\nWIDTH {d}\nHEIGHT 1\n"
        f"VIEWPOINT 0 0 0 1 0 0 0\nPOINTS {d}\nDATA ascii\n"
    )
    return (head + "".join(f"{x} {y} {z}\n" for x, y, z in pts)).encode()


def _off(nv: int = 8, declared_v: int | None = None, faces: bool = True, joined: bool = False) -> bytes:
    verts = [(x, y, z) for x in (0, 1) for y in (0, 1) for z in (0, 1)][:nv]
    tris = [(0, 1, 3), (0, 3, 2), (4, 5, 7), (4, 7, 6)] if faces else []
    counts = f"{declared_v or nv} {len(tris) if faces else 4} 0"
    head = f"OFF{counts}\n" if joined else f"OFF\n{counts}\n"
    return (
        head + "".join(f"{x} {y} {z}\n" for x, y, z in verts) + "".join(f"3 {a} {b} {c}\n" for a, b, c in tris)
    ).encode()


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return buf.getvalue()


class _Evil:
    """Unpickling this runs a shell command: what a malicious checkpoint or .npy carries."""

    def __reduce__(self):
        import os

        return os.system, ("touch effvision-was-exploited",)


# ----------------------------------------------------------------------------- the cases
def cases() -> dict[str, bytes]:
    jpg, png = _image(fmt="JPEG"), _image()
    mp4, mp4_fast = _video(), _video(faststart=True)
    text = b"this is a note, not a picture\n"
    cases = {
        # images
        "images/zero_bytes.jpg": b"",
        "images/zero_bytes.png": b"",
        "images/truncated.jpg": jpg[: len(jpg) // 2],
        "images/truncated.png": png[: len(png) // 2],
        "images/header_only.jpg": jpg[:20],
        "images/text_named.jpg": text,
        "images/random_bytes.png": RNG.integers(0, 256, 4096, dtype=np.uint8).tobytes(),
        "images/png_named.jpg": png,
        "images/jpeg_named.png": jpg,
        "images/gray_1ch.png": _image("L"),
        "images/gray_alpha_2ch.png": _image("LA"),
        "images/rgba_4ch.png": _image("RGBA"),
        "images/cmyk.jpg": _image("CMYK", fmt="JPEG"),
        "images/palette.png": _image("P"),
        "images/gray_16bit.png": _png16(),
        "images/one_pixel.png": _image(size=(1, 1)),
        "images/bomb_20000x20000.png": _png_header_only(20000, 20000),
        "images/bomb_12000x12000.png": _png_header_only(12000, 12000),
        "images/bad_crc.png": png[:40] + bytes([png[40] ^ 0xFF]) + png[41:],
        # videos
        "videos/zero_bytes.mp4": b"",
        "videos/text_named.mp4": text,
        "videos/truncated.mp4": mp4[: len(mp4) // 2],
        "videos/truncated_faststart.mp4": mp4_fast[: len(mp4_fast) * 2 // 3],
        "videos/zero_frames.mp4": _video(frames=0),
        "videos/audio_only.mp4": _video(audio_only=True),
        "videos/jpeg_named.mp4": jpg,
        "videos/random_bytes.avi": RNG.integers(0, 256, 8192, dtype=np.uint8).tobytes(),
        "videos/mp4_named.avi": mp4,
        "videos/mp4_named.mkv": mp4,
        # point clouds and meshes
        "points/zero_bytes.ply": b"",
        "points/zero_bytes.pcd": b"",
        "points/zero_bytes.off": b"",
        "points/zero_bytes.bin": b"",
        "points/truncated_binary.ply": _ply(100, binary=True)[:-200],
        "points/lying_count.ply": _ply(10, declared=100),
        "points/lying_count_binary.ply": _ply(10, declared=100, binary=True),
        "points/lying_count.pcd": _pcd(10, declared=100),
        "points/text_named.pcd": text,
        "points/text_named.ply": text,
        "points/truncated.off": _off()[:-20],
        "points/lying_count.off": _off(declared_v=50),
        "points/header_defect.off": _off(joined=True),
        "points/partial_record.bin": RNG.random((100, 4)).astype(np.float32).tobytes() + b"\x00" * 6,
        "points/nan_points.xyz": b"nan nan nan\nnan 1 2\n",
        "points/two_columns.xyz": b"1 2\n3 4\n5 6\n",
        "points/pickled_object.npy": _npy_pickle(),
        "points/text_named.npy": text,
        "points/garbage.stl": RNG.integers(0, 256, 300, dtype=np.uint8).tobytes(),
        # neither images, videos nor point clouds
        "other/notes.txt": text,
        "other/archive.unknownext": text,
        "other/no_extension": text,
        # archives
        "archives/zip_slip.zip": _zip({"cat/ok.png": png, "../../escaped.png": png}),
        "archives/absolute_path.zip": _zip({"cat/ok.png": png, "/tmp/effvision-absolute.png": png}),
        "archives/zip_bomb.zip": _zip({"cat/ok.png": png, "cat/huge.png": b"\0" * (32 << 20)}),
        "archives/not_a_zip.zip": text,
        "archives/truncated.zip": _zip({"cat/ok.png": png, "dog/ok.png": png})[:300],
        # a checkpoint whose unpickling would run a command
        "checkpoints/malicious.pt": pickle.dumps({"format": "effvision-checkpoint/1", "spec": _Evil()}),
        "checkpoints/text_named.pt": text,
    }
    cases.update({f"recipes/{name}.yaml": text.encode() for name, text in RECIPES.items()})
    return cases


_MODEL = "model: {name: cifar_resnet8}\n"
RECIPES = {  # one mistake each
    "unknown_key": _MODEL + "stagess: []\n",
    "unknown_nested_key": _MODEL + "data: {batchsize: 8}\n",
    "wrong_type": _MODEL + "data: {batch_size: many}\n",
    "unknown_stage": _MODEL + "stages: [{type: prnue}]\n",
    "stage_type_is_code": _MODEL + "stages: [{type: os.system}]\n",
    "negative_ratio": _MODEL + "stages: [{type: prune, ratio: -0.5}]\n",
    "ratio_above_one": _MODEL + "stages: [{type: prune, ratio: 1.5}]\n",
    "negative_epochs": _MODEL + "stages: [{type: train, epochs: -1}]\n",
    "stage_not_mapping": _MODEL + "stages: [prune]\n",
    "duplicate_stage_names": _MODEL + "stages: [{type: prune}, {type: prune}]\n",
    "missing_model": "stages: []\n",
    "empty": "",
    "list_not_mapping": "- model\n- stages\n",
    "not_yaml": "model: {name: [unclosed\n",
    "python_tag": "model: !!python/object/apply:os.system ['touch effvision-was-exploited']\n",
    "unknown_model": "model: {name: cifar_resnet_8}\n",
    "missing_data_root": _MODEL + "data: {name: cifar10, root: /nonexistent/cifar10}\n",
    "missing_pretrained": "model: {name: cifar_resnet8, pretrained: /nonexistent/weights.pth}\n",
    "unknown_dataset": _MODEL + "data: {name: imagenet-but-misspelt}\n",
    "bad_on_bad_sample": _MODEL + "data: {on_bad_sample: ignore}\n",
}


def _png16() -> bytes:
    arr = (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)  # a 0..65520 ramp
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def _npy_pickle() -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.array([_Evil()], dtype=object), allow_pickle=True)
    return buf.getvalue()


def write_corpus(folder: Path) -> list[str]:
    written = []
    for name, data in cases().items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(name)
    (folder / "MANIFEST.json").write_text(json.dumps(sorted(written), indent=1) + "\n")
    return written


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "files"
    print(f"{len(write_corpus(out))} bad-input files written to {out}")
