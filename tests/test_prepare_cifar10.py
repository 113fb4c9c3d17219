"""`effvision data prepare cifar10`'s library side: torchvision's cifar-10-python.tar.gz becomes
the two ImageFolder zips the cifar10 card reads; a tampered pickle, a damaged archive and an
offline machine each end in one clear line."""

from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from effvision import load_dataset
from effvision.data.images import prepare_cifar10 as prep
from effvision.data.images.prepare_cifar10 import prepare_cifar10
from effvision.errors import EffvisionError
from effvision.recipe import DataConfig

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
PER_BATCH, TEST_SIZE = 4, 12  # 20 training images and 12 test images: every class in both splits
MARKER = "effvision-was-exploited"


class _Py2Pickler(pickle._Pickler):
    """Writes bytes as Python 2 byte strings (SHORT_BINSTRING/BINSTRING), as the real files are
    (cPickle, protocol 2): unpickled with encoding='latin1' they come back as str."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj: bytes) -> None:
        n = len(obj)
        self.write(
            pickle.SHORT_BINSTRING + bytes([n]) + obj if n < 256 else pickle.BINSTRING + struct.pack("<i", n) + obj
        )
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str


def _pickle(obj, style: str) -> bytes:
    if style == "py3":  # a Python 3 re-pickle: bytes keys, protocol 2 (bytes spelled _codecs.encode)
        return pickle.dumps(obj, protocol=2)
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    # the real files name numpy's reconstruction by its numpy 1 module
    return buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def _images(n: int, rng) -> np.ndarray:
    """n smooth, distinct RGB images as CIFAR's N x 3072 rows (noise would not survive JPEG)."""
    coarse = rng.integers(20, 236, size=(n, 3, 4, 4), dtype=np.uint8)
    return np.ascontiguousarray(coarse.repeat(8, axis=2).repeat(8, axis=3).reshape(n, 3072))


def write_archive(path: Path, style: str = "py2", members: dict[str, bytes] | None = None) -> dict:
    """A cifar-10-python.tar.gz in torchvision's layout; returns the images and labels it holds."""
    rng = np.random.default_rng(0)
    enc = (lambda s: s.encode()) if style == "py2" else (lambda s: s)
    key = str.encode  # both the real files and Python 3 re-pickles hold byte-string keys
    files, truth = {}, {"train": ([], []), "test": ([], [])}
    meta = {key("num_cases_per_batch"): PER_BATCH, key("label_names"): [enc(c) for c in CLASSES], key("num_vis"): 3072}
    files["batches.meta"] = _pickle(meta, style)
    for name, n, start in [(f"data_batch_{i}", PER_BATCH, (i - 1) * PER_BATCH) for i in range(1, 6)] + [
        ("test_batch", TEST_SIZE, 3)
    ]:
        data = _images(n, rng)
        labels = [(start + k) % 10 for k in range(n)]
        batch = {key("batch_label"): enc(name), key("labels"): labels, key("data"): data}
        batch[key("filenames")] = [enc(f"{name}_{k}.png") for k in range(n)]
        files[name] = _pickle(batch, style)
        split = "test" if name == "test_batch" else "train"
        truth[split][0].append(data)
        truth[split][1].extend(labels)
    files.update(members or {})
    with tarfile.open(path, "w:gz") as tf:
        for name, blob in files.items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tf.addfile(info, io.BytesIO(blob))
    return {
        s: (np.concatenate(d).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), np.array(y)) for s, (d, y) in truth.items()
    }


@pytest.mark.parametrize("style", ["py2", "py3"])
def test_archive_becomes_the_zips_the_cifar10_card_reads(tmp_path, style):
    truth = write_archive(tmp_path / "cifar-10-python.tar.gz", style)
    out = tmp_path / "datasets"
    summary = prepare_cifar10(out, tmp_path / "cifar-10-python.tar.gz", progress=False)

    assert summary["classes"] == CLASSES
    assert [(f["split"], f["images"]) for f in summary["files"]] == [("train", 20), ("test", TEST_SIZE)]
    for f in summary["files"]:
        assert Path(f["path"]).stat().st_size == f["bytes"] > 0
    assert sorted(p.name for p in out.iterdir()) == ["cifar10-jpeg-test.zip", "cifar10-jpeg-train.zip"]  # no temp left
    with zipfile.ZipFile(out / "cifar10-jpeg-train.zip") as zf:
        assert zf.namelist()[:3] == ["train/airplane/0000.jpg", "train/airplane/0001.jpg", "train/automobile/0000.jpg"]
    with zipfile.ZipFile(out / "cifar10-jpeg-test.zip") as zf:
        assert zf.namelist()[0] == "test/airplane/0000.jpg"

    bundle = load_dataset(DataConfig(name="cifar10", root=str(out)))
    assert (len(bundle.train), len(bundle.val)) == (20, TEST_SIZE)
    assert bundle.classes == CLASSES
    for ds, (images, labels) in ((bundle.train, truth["train"]), (bundle.val, truth["test"])):
        for i in range(len(ds)):
            decoded = ds[i][0].permute(1, 2, 0).numpy().astype(np.int16)
            diffs = np.abs(images.astype(np.int16) - decoded).mean(axis=(1, 2, 3))
            nearest = int(diffs.argmin())
            # each decoded JPEG is, by far, the image put in the archive, and sits in its class
            assert diffs[nearest] < 2.0 and np.sort(diffs)[1] > 20, (i, diffs[nearest])
            assert ds.targets[i] == labels[nearest], (i, ds.targets[i], labels[nearest])


def test_an_extracted_folder_works_too_and_reruns_give_identical_zips(tmp_path):
    write_archive(tmp_path / "c.tar.gz")
    with tarfile.open(tmp_path / "c.tar.gz") as tf:
        tf.extractall(tmp_path / "x", filter="data")
    prepare_cifar10(tmp_path / "a", tmp_path / "x", progress=False)
    prepare_cifar10(tmp_path / "b", tmp_path / "c.tar.gz", progress=False)
    prepare_cifar10(tmp_path / "b", tmp_path / "c.tar.gz", progress=False)  # overwrites in place
    for name in ("cifar10-jpeg-train.zip", "cifar10-jpeg-test.zip"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


class Payload:
    def __reduce__(self):
        return os.system, (f"touch {MARKER}",)


def test_a_tampered_batch_is_refused_and_nothing_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evil = pickle.dumps({b"data": Payload(), b"labels": []}, protocol=2)
    write_archive(tmp_path / "evil.tar.gz", members={"data_batch_3": evil})
    with pytest.raises(EffvisionError, match=r"evil\.tar\.gz!cifar-10-batches-py/data_batch_3: refused to unpickle"):
        prepare_cifar10(tmp_path / "out", tmp_path / "evil.tar.gz", progress=False)
    assert not (tmp_path / MARKER).exists(), "the payload ran"
    assert not list((tmp_path / "out").iterdir()), "nothing is written from a refused archive"
    pickle.loads(evil)  # the same bytes do run when unpickled plainly: the test would notice a regression
    assert (tmp_path / MARKER).exists()


def _one_line(exc: pytest.ExceptionInfo, *words: str) -> None:
    msg = str(exc.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_damaged_or_wrong_archives_give_one_line(tmp_path):
    good = tmp_path / "good.tar.gz"
    write_archive(good)
    cases = {
        "truncated.tar.gz": good.read_bytes()[: good.stat().st_size // 2],
        "garbage.tar.gz": b"not a tar at all" * 100,
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(EffvisionError) as exc:
            prepare_cifar10(tmp_path / "out", tmp_path / name, progress=False)
        _one_line(exc, name, "not a readable cifar-10-python.tar.gz")

    rows = np.zeros((4, 3000), np.uint8)
    wrong = {
        "shape": ({"data_batch_2": pickle.dumps({b"data": rows, b"labels": [0] * 4}, 2)}, "'data' is (4, 3000) uint8"),
        "label": (
            {"test_batch": pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, 2)},
            "label 10 of image 1 is outside 0..9",
        ),
        "not a pickle": ({"batches.meta": b"\x80\x02garbage"}, "batches.meta: not a readable CIFAR-10 batch"),
    }
    for what, (members, words) in wrong.items():
        path = tmp_path / f"{what.replace(' ', '_')}.tar.gz"
        write_archive(path, members=members)
        with pytest.raises(EffvisionError) as exc:
            prepare_cifar10(tmp_path / "out", path, progress=False)
        _one_line(exc, path.name, words)

    partial = tmp_path / "partial.tar.gz"
    with tarfile.open(partial, "w:gz") as tf:
        info = tarfile.TarInfo("cifar-10-batches-py/readme.html")
        tf.addfile(info, io.BytesIO())
    with pytest.raises(EffvisionError) as exc:
        prepare_cifar10(tmp_path / "out", partial, progress=False)
    _one_line(exc, "partial.tar.gz: missing cifar-10-batches-py/batches.meta", "data_batch_5")

    with pytest.raises(EffvisionError) as exc:
        prepare_cifar10(tmp_path / "out", tmp_path / "nowhere.tar.gz", progress=False)
    _one_line(exc, "not found", "nowhere.tar.gz")


def test_offline_without_an_archive_says_to_pass_from(tmp_path, monkeypatch):
    def offline(dest_dir: Path) -> Path:
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(prep, "_download", offline)  # never a real network call from a test
    with pytest.raises(EffvisionError) as exc:
        prepare_cifar10(tmp_path / "out", progress=False)
    _one_line(exc, "could not download CIFAR-10", "--from cifar-10-python.tar.gz", "name resolution", "data.root")
    assert not list((tmp_path / "out").iterdir()), "the temporary download folder is removed"


def test_a_download_is_converted_and_removed(tmp_path, monkeypatch):
    def fake_download(dest_dir: Path) -> Path:
        write_archive(dest_dir / "cifar-10-python.tar.gz")
        return dest_dir / "cifar-10-python.tar.gz"

    monkeypatch.setattr(prep, "_download", fake_download)
    summary = prepare_cifar10(tmp_path / "out", progress=False)
    assert [f["images"] for f in summary["files"]] == [20, TEST_SIZE]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cifar10-jpeg-test.zip", "cifar10-jpeg-train.zip"]


def test_jpeg_quality_is_used(tmp_path):
    write_archive(tmp_path / "c.tar.gz")
    low = prepare_cifar10(tmp_path / "low", tmp_path / "c.tar.gz", quality=20, progress=False)
    high = prepare_cifar10(tmp_path / "high", tmp_path / "c.tar.gz", progress=False)
    assert low["files"][0]["bytes"] < high["files"][0]["bytes"]
    with zipfile.ZipFile(tmp_path / "high" / "cifar10-jpeg-train.zip") as zf:
        img = Image.open(io.BytesIO(zf.read("train/airplane/0000.jpg")))
        assert (img.format, img.size, img.mode) == ("JPEG", (32, 32), "RGB")


def test_the_command_writes_the_zips_and_offline_says_what_to_pass(tmp_path, monkeypatch, capsys):
    from effvision.cli import main

    write_archive(tmp_path / "cifar-10-python.tar.gz")
    assert (
        main(["data", "prepare", "cifar10", str(tmp_path / "c10"), "--from", str(tmp_path / "cifar-10-python.tar.gz")])
        == 0
    )
    assert f"--set data.root={tmp_path / 'c10'}" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "c10").iterdir()) == ["cifar10-jpeg-test.zip", "cifar10-jpeg-train.zip"]

    def offline(dest_dir: Path) -> Path:
        raise OSError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(prep, "_download", offline)
    assert main(["data", "prepare", "cifar10", str(tmp_path / "offline")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("effvision: error: could not download CIFAR-10") and "--from" in err[0]
    assert main(["data", "prepare", "mnist", str(tmp_path / "m")]) == 1
    assert "choices: cifar10" in capsys.readouterr().err
