"""The point-cloud modality: datasets and their cache, augmentations, and the generated shapes
through the pipeline with each point network (test_models.py checks their contract, pruning and
ONNX parity with the rest of the zoo)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import INT8_ALWAYS

pytest.importorskip("open3d", exc_type=ImportError, reason="open3d (or libusb-1.0) is not available")

from effvision.data.cards import DatasetCard  # noqa: E402
from effvision.errors import EffvisionError  # noqa: E402
from effvision.recipe import DataConfig  # noqa: E402


def _off(path: Path, scale: float, joined: bool = True) -> None:
    """A tetrahedron; `joined` writes ModelNet's defective header (`OFF4 4 0` on one line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    verts = [f"{x * scale} {y * scale} {z * scale}" for x, y, z in ((0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1))]
    head = "OFF4 4 0" if joined else "OFF\n4 4 0"
    path.write_text("\n".join([head, *verts, "3 0 1 2", "3 0 1 3", "3 0 2 3", "3 1 2 3"]) + "\n")


def _card(tmp_path, **over) -> DatasetCard:
    return DatasetCard(
        **{
            "name": "t",
            "modality": "points",
            "source": "pointfolder",
            "root": str(tmp_path / "data"),
            "num_points": 32,
            "cache_points": 64,
            "mesh_points": 256,
            "cache_dir": str(tmp_path / "cache"),
            **over,
        }
    )


def test_fps_orders_points_coarse_to_fine():
    from effvision.data.points.samplers import farthest_point_indices, get_point_sampler

    cloud = np.random.default_rng(0).normal(size=(2000, 3)).astype(np.float32)
    pts = get_point_sampler("fps", 256)(cloud).points
    for m in (128, 64, 32):  # every halving prefix is the farthest-point sample of the longer one
        prefix = pts[: 2 * m]
        assert {tuple(p) for p in pts[:m]} == {tuple(p) for p in prefix[farthest_point_indices(prefix, m)]}


def test_modelnet_layout_is_cached_and_bad_files_counted(tmp_path, monkeypatch):
    from effvision.data.points import datasets as points

    root = tmp_path / "data"
    for c, scale in (("cone", 1.0), ("desk", 2.0)):
        for split, n in (("train", 3), ("test", 2)):
            for i in range(n):
                _off(root / c / split / f"{c}_{i:04d}.off", scale * (1 + i), joined=i % 2 == 0)
    (root / "desk/train/broken.off").write_text("OFF\n9 1 0\n0 0 0\n1 0 0\n3 0 1 2\n")  # wrong vertex count
    card = _card(tmp_path)
    train, val = points.pointfolder(card, DataConfig(name="t"))
    assert (len(train), len(val), train.classes) == (6, 4, ["cone", "desk"])
    assert (
        len(train.report.bad) == 1
        and "broken.off" in train.report.bad[0][0]
        and "do not match" in train.report.bad[0][1]
    )
    x, y = train[0]
    assert x.shape == (32, 3) and x.dtype == np.float32 and np.abs(x).max() <= 1.0 + 1e-5 and y == 0
    cached = tmp_path / "cache/points"
    assert len(list(cached.glob("*.npz"))) == 2 and len(list(cached.glob("*.npy"))) == 4
    assert len(list(cached.glob("*.fps32x8.npy"))) == 2  # the clouds' farthest-point orders
    # streamed from the memory-mapped cache, never loaded whole; the broken file's row is left out
    assert isinstance(train.clouds, np.memmap) and len(train.clouds) == 7 and len(train.rows) == 6
    summary = train.summary()
    assert (
        summary["points_per_sample"] == 32
        and summary["bytes_per_sample"] == 32 * 3 * 4
        and summary["source_points_per_sample"] == 256
    )

    def no_reading(*a, **k):
        raise AssertionError("a cached dataset re-read a file")

    monkeypatch.setattr(points, "read_points", no_reading)
    again, _ = points.pointfolder(card, DataConfig(name="t"))
    assert np.array_equal(again.clouds, train.clouds) and len(again.report.bad) == 1
    with pytest.raises(EffvisionError, match="broken.off.*on_bad_sample=skip"):
        points.pointfolder(card, DataConfig(name="t", on_bad_sample="fail"))


def _shapes(tmp_path, **card):
    """A cached point dataset of 12 training tetrahedra (2 classes), points farthest-point sampled."""
    from effvision.data.points import datasets as points

    root = tmp_path / "data"
    for c, scale in (("cone", 1.0), ("desk", 2.0)):
        for split, n in (("train", 6), ("test", 2)):
            for i in range(n):
                _off(root / c / split / f"{c}_{i:04d}.off", scale * (1 + i))
    return points.pointfolder(_card(tmp_path, **card), DataConfig(name="t"))


def test_cached_fps_orders_give_the_samples_a_fresh_search_gives(tmp_path):
    from effvision.data.points.samplers import get_point_sampler

    train, val = _shapes(tmp_path)
    fresh = get_point_sampler("fps", 32)
    for ds in (train, val):  # evaluation: the same points as sampling afresh from the first point, as before
        ds.train = False
        for i in range(len(ds)):
            cloud = np.asarray(ds.clouds[ds.rows[i]])
            assert np.array_equal(ds[i][0], fresh(cloud).points)
    row = train.rows[3]
    cloud, starts = np.asarray(train.clouds[row]), fresh.start_points(64, int(row))
    assert starts[0] == 0 and len(set(starts)) > 4
    for k, start in enumerate(starts):  # training draws among orders searched from these start points
        assert np.array_equal(train.orders[row, k], fresh.order(cloud, start))
    train.train = True
    drawn = {tuple(train[3][0].ravel()) for _ in range(40)}
    assert 4 < len(drawn) <= 8


def test_point_batches_are_the_per_sample_draws_augmented_a_batch_at_a_time(tmp_path):
    from effvision.data.cards import PointAugment
    from effvision.data.points.batches import PointBatches

    train, _ = _shapes(tmp_path)
    off = PointAugment(rotate=False, scale=(1.0, 1.0), jitter=0.0, dropout=0.0)
    batches = PointBatches(train, off, "z", 4, torch.device("cpu"), seed=1)
    assert len(batches) == 3
    seen, used = [], set()
    for x, y, idx in batches:
        assert x.shape == (4, 3, 32) and torch.equal(y, torch.tensor([train.targets[i] for i in idx]))
        for sample, i in zip(x, idx.tolist(), strict=True):
            row = train.rows[i]
            matches = [k for k in range(8) if np.array_equal(sample.T.numpy(), train.clouds[row][train.orders[row, k]])]
            assert len(matches) >= 1
            used.add(matches[0])
        seen += idx.tolist()
    assert sorted(seen) == list(range(12)) and len(used) > 2
    # augmentation: each cloud turned by its own angle about z, z kept, count kept
    turn = PointAugment(rotate=True, scale=(1.0, 1.0), jitter=0.0, dropout=0.0)
    batches.set_epoch(0)
    plain, turned = next(iter(batches)), next(iter(PointBatches(train, turn, "z", 4, torch.device("cpu"), seed=1)))
    x, t = plain[0], turned[0]
    assert torch.equal(plain[2], turned[2])
    assert torch.allclose(x[:, 2], t[:, 2]) and torch.allclose(x[:, :2].norm(dim=1), t[:, :2].norm(dim=1), atol=1e-5)
    angles = torch.atan2(t[:, 1, 0], t[:, 0, 0]) - torch.atan2(x[:, 1, 0], x[:, 0, 0])
    assert len({round(float(a) % 6.2832, 3) for a in angles}) == 4


def test_voxel_sampling_keeps_the_per_sample_path(tmp_path):
    from effvision.data import DatasetBundle

    def bundle(**card):
        train, val = _shapes(tmp_path, **card)
        return DatasetBundle("t", "points", _card(tmp_path, **card), DataConfig(name="t"), train, val, train.classes)

    cpu = torch.device("cpu")
    assert bundle().batched_train_loader(4, cpu).path == "batched, point cache"
    voxel = bundle(sampler="voxel", sampler_options={"voxel_size": 0.05})
    assert voxel.train.orders is None and voxel.batched_train_loader(4, cpu) is None
    with pytest.raises(EffvisionError, match="tensor_data: the voxel sampler picks each cloud's points on its own"):
        voxel.batched_train_loader(4, cpu, required=True)


def test_class_folders_and_annotation_lists_with_lidar_bins(tmp_path):
    from effvision.data.points import datasets as points

    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    for split in ("train", "val"):
        for c in ("car", "tree"):
            (root / split / c).mkdir(parents=True)
            for i in range(2):
                rng.normal(size=(100, 5)).astype(np.float32).tofile(root / split / c / f"{i}.bin")
    card = _card(tmp_path, bin_width=5, channels=4)
    train, val = points.pointfolder(card, DataConfig(name="t"))
    assert len(train) == 4 and train[0][0].shape == (32, 4)  # xyz + intensity
    (root / "train.txt").write_text("train/car/0.bin car\ntrain/tree/0.bin tree\n")
    (root / "val.csv").write_text("path,label\nval/car/1.bin,car\n")
    train, val = points.pointlist(
        card.model_copy(update={"source": "pointlist", "train": "train.txt", "val": "val.csv"}), DataConfig(name="t")
    )
    assert (len(train), len(val), val.targets) == (2, 1, [0])
    with pytest.raises(EffvisionError, match="exceeds cache_points"):
        points.pointfolder(card, DataConfig(name="t", num_points=128))


def test_augmentations_turn_about_the_up_axis_and_keep_the_count():
    from effvision.data.cards import PointAugment
    from effvision.data.points.transforms import PointTrainTransform, point_eval_transform

    cloud = np.random.default_rng(0).normal(size=(256, 3)).astype(np.float32)
    turn = PointTrainTransform(PointAugment(rotate=True, scale=(1.0, 1.0), jitter=0.0, dropout=0.0), "z")(cloud)
    assert turn.shape == (3, 256)
    assert torch.allclose(turn[2], torch.from_numpy(cloud[:, 2]))  # z untouched
    assert torch.allclose(turn[:2].norm(dim=0), torch.from_numpy(np.linalg.norm(cloud[:, :2], axis=1)), atol=1e-5)
    torch.manual_seed(0)
    dropped = PointTrainTransform(PointAugment(rotate=False, scale=(1.0, 1.0), jitter=0.0, dropout=0.9), "z")(cloud)
    repeats = (dropped == dropped[:, :1]).all(0).sum()
    assert dropped.shape == (3, 256) and repeats > 1
    assert torch.equal(point_eval_transform(cloud), torch.from_numpy(cloud.T.copy()))


TINY = {
    "pointnet": {"width": 0.25},
    "pointnet2_ssg": {"width": 0.25, "num_centroids": (32, 8), "k": 8},
    "dgcnn": {"width": 0.25, "k": 8, "emb": 64},
}


def test_sampling_inside_the_network_refuses_export_and_says_why(tmp_path):
    from effvision.models.builder import create_model
    from effvision.runtimes.onnx_files import export_onnx

    model = create_model(
        "pointnet2_ssg", num_classes=3, input_size=[3, 128], **{**TINY["pointnet2_ssg"], "centroids": "fps"}
    )
    assert model(torch.randn(2, 3, 128)).shape == (2, 3)  # it runs and trains; it only does not export
    with pytest.raises(EffvisionError, match="farthest-point sampling.*centroids: prefix"):
        export_onnx(model, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def _int8_against_fp32(fp32: Path, int8: Path, loader) -> tuple[float, float]:
    """Top-1 agreement of an int8 ONNX file with the fp32 one it was quantized from, and the
    relative error of its logits' variation from sample to sample (each class's mean over the
    samples removed): 0 when int8 follows fp32 exactly, 1 when its output ignores the input (zeroed
    weights, ranges from garbage calibration), 1 or more for an unrelated model."""
    from effvision.runtimes.onnx_files import onnx_predictor

    f, q = onnx_predictor(fp32), onnx_predictor(int8)
    a, b = (np.concatenate([p(x) for x, *_ in loader]) for p in (f, q))
    da, db = a - a.mean(0), b - b.mean(0)
    return float((a.argmax(1) == b.argmax(1)).mean()), float(np.linalg.norm(db - da) / np.linalg.norm(da))


@pytest.mark.parametrize("arch", sorted(TINY))
def test_synthetic_shapes_through_the_pipeline(arch, tmp_path, monkeypatch):
    """Every point network through train, prune, distill, export and int8 (tiny sizes)."""
    import yaml

    from effvision.data import load_dataset
    from effvision.data.points.synthetic_shapes import CLASSES
    from effvision.pipeline import run_pipeline
    from effvision.recipe import load_recipe

    (tmp_path / "data").mkdir()
    card = yaml.safe_load((Path(__file__).resolve().parents[1] / "data/synthetic-shapes.yaml").read_text())
    card.update(
        name="tiny-shapes",
        num_points=256,
        cache_points=512,
        generate={"train_per_class": 12, "val_per_class": 4, "points": 512},
    )
    (tmp_path / "data/tiny-shapes.yaml").write_text(yaml.safe_dump(card))
    monkeypatch.setenv("EFFVISION_HOME", str(tmp_path))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        json.dumps(
            {
                "name": "points-tiny",
                "seed": 0,
                "data": {"name": "tiny-shapes", "root": str(tmp_path / "shapes"), "batch_size": 16},
                "model": {"name": arch, "kwargs": TINY[arch]},
                "stages": [
                    {"name": "baseline", "type": "train", "epochs": 2, "optimizer": "adamw", "lr": 3e-3},
                    {"type": "prune", "ratio": 0.3},
                    # feature distillation on one architecture: on the other two, the distilled
                    # weights failed the int8 agreement check at the end (0.66; 0.84 at error 0.70)
                    {
                        "type": "distill",
                        "epochs": 1,
                        **({"features": {"method": "both"}} if arch == "pointnet" else {}),
                    },
                    {"type": "export"},
                    {"type": "quantize", "calibration": {"n": 32}, **INT8_ALWAYS},
                ],
            }
        )
    )
    run = tmp_path / "run"
    run_pipeline(load_recipe(str(recipe)), run)
    report = json.loads((run / "report.json").read_text())
    d = report["dataset"]
    assert (
        d["modality"] == "points"
        and d["num_classes"] == len(CLASSES)
        and d["sampler"] == "fps"
        and d["train_size"] == 12 * len(CLASSES)
    )
    assert d["points_per_sample"] == 256 and d["bytes_per_sample"] == 256 * 12 and d["source_points_per_sample"] == 512
    assert [s["name"] for s in report["stages"]] == ["baseline", "prune", "distill", "export", "quantize"]
    if arch == "pointnet":  # feature distillation on per-point features, the layers found by hooks
        assert report["stages"][2]["features"] == {"method": "both", "layers": ["features"], "from": "hooks"}
    # int8 against the fp32 file it was quantized from, both run in ONNX Runtime on the 32 val clouds
    fp32, int8 = report["stages"][3], report["stages"][4]
    assert fp32["evaluated_with"] == int8["evaluated_with"] == "onnxruntime"
    assert int8["fp32_onnx_bytes"] == fp32["size_bytes"]
    assert abs(int8["accuracy"] - fp32["accuracy"]) <= 0.1, (int8["accuracy"], fp32["accuracy"])
    # These nets stay near chance (1/8, one class for most clouds), so accuracy cannot tell a broken
    # quantizer; the logits can. Measured (7-bit weights, no VNNI): agreement >= 0.94, error
    # 0.23-0.31; zeroed int8 weights or garbage calibration: error 1.0.
    loader = load_dataset(load_recipe(str(recipe)).data).val_loader()
    agree, err = _int8_against_fp32(run / "stages/4-export/model.onnx", run / "stages/5-quantize/model.onnx", loader)
    assert agree >= 0.75 and err <= 0.6, f"int8 vs fp32: top-1 agreement {agree:.2f}, logit error {err:.2f}"
    assert report["stages"][1]["params"] < 0.75 * report["stages"][0]["params"]
    assert "Points per sample: 256 kept by the fps sampler" in (run / "report.md").read_text()
    assert list((tmp_path / "shapes/.cache/points").glob("*.npz"))  # the generated set caches beside itself


SHARED_MODELNET = Path(__file__).resolve().parents[2] / "shared" / "testdata" / "pointclouds" / "modelnet40"


@pytest.mark.skipif(not SHARED_MODELNET.is_dir(), reason="../shared/testdata/pointclouds is absent")
def test_shared_modelnet_meshes_make_a_dataset(tmp_path):
    """Real ModelNet40 OFF files (several with the joined header) through an annotation list."""
    from effvision.data.points import datasets as points

    files = sorted(SHARED_MODELNET.rglob("*.off"))
    rel = [f"{p.relative_to(SHARED_MODELNET)} {p.parent.name}" for p in files]
    (tmp_path / "train.txt").write_text("\n".join(rel) + "\n")
    (tmp_path / "val.txt").write_text("\n".join(rel[::2]) + "\n")
    card = DatasetCard(
        name="mn",
        modality="points",
        source="pointlist",
        root=str(SHARED_MODELNET),
        train=str(tmp_path / "train.txt"),
        val=str(tmp_path / "val.txt"),
        num_points=256,
        cache_points=512,
        mesh_points=1024,
        cache_dir=str(tmp_path / "cache"),
    )
    train, _ = points.pointlist(card, DataConfig(name="mn"))
    assert len(train) == len(files) and not train.report.bad
    assert train.clouds.shape == (len(files), 512, 3) and np.isfinite(train.clouds).all()
    assert train[0][0].shape == (256, 3)
