import json
from collections import Counter

import pytest
import torch
from conftest import SHARED, needs_shared, zip_folder

from effvision.data import load_dataset
from effvision.data.images.folders import ImageFolderDataset
from effvision.data.inspect import inspect_path
from effvision.errors import EffvisionError
from effvision.recipe import DataConfig


def test_digits_is_the_real_sklearn_set_with_a_fixed_stratified_split():
    a, b = load_dataset("digits"), load_dataset("digits")
    assert len(a.train) == 1437 and len(a.val) == 360 and a.num_classes == 10
    assert a.train.targets == b.train.targets  # fixed split
    counts = Counter(a.val.targets)
    assert max(counts.values()) - min(counts.values()) <= 2  # stratified
    img, _ = a.train.image(0), a.train.targets[0]
    assert img.shape == (3, 32, 32) and img.dtype == torch.uint8 and img.max() > 200


def test_loaders_apply_transforms():
    b = load_dataset(DataConfig(name="digits", batch_size=16))
    x, y = next(iter(b.train_loader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 and y.shape == (16,)
    xv, yv = next(iter(b.val_loader(8)))
    # Evaluation is the card's normalisation, (x / 255 - mean) / std per channel, of the raw images
    # (already at the card's 32 px, so resize and centre crop leave them as they are).
    raw = torch.stack([b.val[i][0] for i in range(8)]).float() / 255
    mean, std = torch.tensor(b.card.mean), torch.tensor(b.card.std)
    assert b.card.mean == [0.30, 0.30, 0.30] and b.card.std == [0.32, 0.32, 0.32]
    assert yv.tolist() == [b.val[i][1] for i in range(8)]
    for c, (m, s) in enumerate(zip(b.card.mean, b.card.std, strict=True)):
        assert float(xv[:, c].mean()) == pytest.approx((float(raw[:, c].mean()) - m) / s, abs=1e-4)
        assert float(xv[:, c].std()) == pytest.approx(float(raw[:, c].std()) / s, rel=1e-4)
    assert torch.allclose(xv, (raw - mean[:, None, None]) / std[:, None, None], atol=1e-5)


def test_stratified_subset():
    b = load_dataset(DataConfig(name="digits", max_train_samples=100, max_val_samples=50))
    assert len(b.train) == 100 and len(b.val) == 50 and set(b.train.targets) == set(range(10))


def test_subset_smaller_than_the_class_count():
    b = load_dataset(DataConfig(name="digits", max_train_samples=4))
    assert len(b.train) == 4


def test_imagefolder_from_folder_and_zip(image_root, tmp_path):
    folder = ImageFolderDataset(image_root / "train")
    assert folder.classes == ["cat", "dog"] and len(folder) == 12
    zipped = zip_folder(image_root / "train", tmp_path / "train.zip", prefix="train/")
    z = ImageFolderDataset(zipped)
    assert z.classes == ["cat", "dog"] and len(z) == 12
    assert torch.equal(z.image(0), folder.image(0))


def test_imagefolder_dataset_card_via_root(image_root):
    b = load_dataset(DataConfig(name="imagefolder", root=str(image_root), image_size=16))
    assert len(b.train) == 12 and len(b.val) == 6 and b.input_size == [3, 16, 16]
    x, _ = next(iter(b.train_loader(4)))
    assert x.shape == (4, 3, 16, 16)


def test_corrupt_image_skipped_and_counted_or_fails_with_path(image_root):
    bad = image_root / "train" / "cat" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    ds = ImageFolderDataset(image_root / "train", on_bad_sample="skip")
    assert len(ds) == 12 and len(ds.report.bad) == 1 and ds.report.bad[0][0].endswith("broken.png")
    with pytest.raises(EffvisionError, match=r"corrupt image .*broken\.png"):
        ImageFolderDataset(image_root / "train", on_bad_sample="fail")


def test_dataset_larger_than_its_cache_budget_streams_from_the_files(image_root):
    cached = ImageFolderDataset(image_root / "train")
    streamed = ImageFolderDataset(image_root / "train", cache_bytes=3 * 20 * 20 * 4)  # room for four images
    assert cached.cache is not None and streamed.cache is None
    assert all(torch.equal(cached[i][0], streamed[i][0]) for i in range(len(cached)))


def test_missing_data_path(tmp_path):
    with pytest.raises(EffvisionError, match="data path not found"):
        load_dataset(DataConfig(name="imagefolder", root=str(tmp_path / "nope")))
    with pytest.raises(EffvisionError, match="needs a path"):
        load_dataset(DataConfig(name="cifar10"))


def test_unknown_dataset_suggests():
    with pytest.raises(EffvisionError, match="did you mean 'digits'"):
        load_dataset("digit")


def test_inspect_reports_one_status_per_file(image_root):
    (image_root / "train" / "dog" / "bad.jpg").write_bytes(b"garbage")
    (image_root / "train" / "notes.txt").write_text("hi")
    results = inspect_path(image_root / "train")
    assert len(results) == 14
    by_name = {r["path"].rsplit("/", 1)[-1]: r for r in results}
    assert by_name["0.png"]["ok"] and by_name["0.png"]["shape"] == [20, 20, 3] and by_name["0.png"]["kind"] == "image"
    assert not by_name["bad.jpg"]["ok"] and by_name["bad.jpg"]["error"]
    assert not by_name["notes.txt"]["ok"] and by_name["notes.txt"]["kind"] is None
    assert set(results[0]) == {"path", "ok", "kind", "shape", "frames", "points", "error"}
    json.dumps(results)


@needs_shared
def test_real_cifar10_images_from_shared_testdata():
    ds = ImageFolderDataset(SHARED / "testdata" / "images" / "cifar10_test")
    assert len(ds) == 300 and len(ds.classes) == 10 and ds.image(0).shape == (3, 32, 32)


@needs_shared
@pytest.mark.slow
def test_real_cifar10_zip_from_shared_datasets():
    ds = ImageFolderDataset(SHARED / "datasets" / "cifar10-jpeg-test.zip")
    assert len(ds) == 10000 and len(ds.classes) == 10 and not ds.report.bad


def _write_then_hang(root, started):
    import time

    from effvision.data.generated import write_once

    def sample(folder, label, n, rng):
        (folder / f"{n}.txt").write_text(str(n))
        if n == 1:
            started.set()
            time.sleep(60)

    write_once(root, {"seed": 0}, ["a"], {"train": 3}, sample, "hang")


def test_a_generation_killed_midway_leaves_no_folder_behind(tmp_path):
    """The next generation deletes the abandoned temporary folder; a live writer's is kept."""
    import multiprocessing
    import os

    from effvision.data.generated import write_once

    ctx = multiprocessing.get_context("fork")
    started = ctx.Event()
    writer = ctx.Process(target=_write_then_hang, args=(tmp_path / "set", started))
    writer.start()
    assert started.wait(30)
    writer.kill()
    writer.join()
    abandoned = list(tmp_path.glob(".set.*"))
    assert len(abandoned) == 1 and (abandoned[0] / "train/a/0.txt").is_file()
    live = tmp_path / f".set.{os.getpid()}.keep"
    live.mkdir()
    root = write_once(
        tmp_path / "set",
        {"seed": 0},
        ["a"],
        {"train": 2},
        lambda f, label, n, rng: (f / f"{n}.txt").write_text("x"),
        "again",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "set"]
    assert sorted(p.name for p in (root / "train/a").iterdir()) == ["0.txt", "1.txt"]
