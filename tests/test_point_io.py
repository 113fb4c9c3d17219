"""Point-cloud and mesh reading (issue 5 groundwork): every shared file loads, bad files fail
with their path."""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("open3d", exc_type=ImportError, reason="open3d (or libusb-1.0) is not available")

from effvision.data.points.io import PointCloudError, read_points  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "testdata" / "pointclouds"
SHARED_FILES = sorted(p for p in SHARED.rglob("*") if p.is_file()) if SHARED.is_dir() else []
BIN_WIDTH = {"nuscenes": 5, "scannet": 6, "sunrgbd": 6}  # KITTI: 4


@pytest.mark.skipif(not SHARED_FILES, reason="../shared/testdata/pointclouds is absent")
@pytest.mark.parametrize("path", SHARED_FILES, ids=lambda p: p.name[:40])
def test_every_shared_point_file_loads(path):
    width = next((w for k, w in BIN_WIDTH.items() if path.name.startswith(k)), 4)
    points = read_points(path, mesh_points=1024, bin_width=width)
    assert points.dtype == np.float32 and points.ndim == 2 and points.shape[1] >= 3 and np.isfinite(points[:, :3]).all()
    assert 300 <= len(points) <= 400_000
    if path.suffix in (".off", ".obj") or path.name == "bunny.ply":
        assert len(points) == 1024  # meshes are sampled on their surface
    assert np.ptp(points[:, :3], axis=0).max() > 0  # not collapsed to a point


def test_modelnet_header_defect_and_formats(tmp_path):
    (tmp_path / "joined.off").write_text("OFF4 2 0\n0 0 0\n1 0 0\n0 1 0\n0 0 1\n3 0 1 2\n3 0 1 3\n")
    assert read_points(tmp_path / "joined.off", mesh_points=64).shape == (64, 3)
    (tmp_path / "c.xyz").write_text("0 0 0\n1,2,3\n4 5 6\n")
    assert read_points(tmp_path / "c.xyz").tolist() == [[0, 0, 0], [1, 2, 3], [4, 5, 6]]
    np.save(tmp_path / "c.npy", np.ones((5, 4)))
    assert read_points(tmp_path / "c.npy").shape == (5, 4)
    np.arange(60, dtype=np.float32).tofile(tmp_path / "scan.bin")
    assert read_points(tmp_path / "scan.bin", bin_width=5).shape == (12, 5)


def test_bad_point_files_name_the_file(tmp_path):
    (tmp_path / "wrong.off").write_text("OFF\n5 1 0\n0 0 0\n1 0 0\n0 1 0\n3 0 1 2\n")
    (tmp_path / "empty.ply").write_bytes(b"")
    np.arange(25, dtype=np.float32).tofile(tmp_path / "odd.bin")
    header = (
        b"ply\nformat binary_little_endian 1.0\nelement vertex 1000\nproperty float x\nproperty float "
        b"y\nproperty float z\nend_header\n"
    )
    (tmp_path / "cut.ply").write_bytes(header + np.zeros(30, np.float32).tobytes())
    (tmp_path / "cut_ascii.ply").write_text(
        "ply\nformat ascii 1.0\nelement vertex 4\nproperty float x\nproperty float y\n"
        "property float z\nend_header\n0 0 0\n1 1 1\n"
    )
    expected = {
        "wrong.off": "do not match",
        "empty.ply": "empty file",
        "odd.bin": "not a whole number",
        "cut.ply": "truncated",
        "cut_ascii.ply": "truncated",
    }
    for name, words in expected.items():
        with pytest.raises(PointCloudError, match=words) as err:
            read_points(tmp_path / name)
        assert name in str(err.value)
    (tmp_path / "x.abc").write_text("1")
    with pytest.raises(PointCloudError, match="unknown point-cloud format"):
        read_points(tmp_path / "x.abc")


def test_data_inspect_reports_points_and_meshes(tmp_path, capsys):
    import json

    from effvision.cli import main

    (tmp_path / "m.off").write_text("OFF4 2 0\n0 0 0\n1 0 0\n0 1 0\n0 0 1\n3 0 1 2\n3 0 1 3\n")
    (tmp_path / "empty.pcd").write_bytes(b"")
    np.arange(24, dtype=np.float32).tofile(tmp_path / "scan.bin")
    assert main(["data", "inspect", str(tmp_path), "--json", "--bin-width", "6"]) == 0
    rows = {Path(r["path"]).name: r for r in json.loads(capsys.readouterr().out)}
    assert (
        rows["m.off"]["ok"] and rows["m.off"]["mesh"] and rows["m.off"]["points"] == 4 and rows["m.off"]["faces"] == 2
    )
    assert rows["scan.bin"]["shape"] == [4, 6] and rows["scan.bin"]["kind"] == "points"
    assert not rows["empty.pcd"]["ok"] and rows["empty.pcd"]["error"] == "empty file"


def test_point_samplers_keep_n_points_and_report_bytes():
    from effvision.data.points.samplers import farthest_point_indices, get_point_sampler, normalize_unit_sphere
    from effvision.errors import EffvisionError

    rng = np.random.default_rng(0)
    cloud = np.concatenate([rng.normal(0, 0.01, (500, 3)), [[5, 0, 0], [-5, 0, 0], [0, 5, 0]]]).astype(np.float32)
    assert set(farthest_point_indices(cloud, 4).tolist()) >= {500, 501, 502}  # far points come first
    for name in ("fps", "random", "uniform", "voxel"):
        out = get_point_sampler(name, 64)(cloud, train=True, rng=rng)
        assert out.points.shape == (64, 3) and out.kept <= 64 and out.bytes_kept == out.kept * 12
    few = get_point_sampler("fps", 16)(cloud[:5])
    assert few.points.shape == (16, 3) and few.kept == 5  # repeats to fill
    unit = normalize_unit_sphere(cloud * 10 + 3)
    assert np.allclose(unit.mean(0), 0, atol=1e-5) and np.isclose(np.linalg.norm(unit, axis=1).max(), 1)
    with pytest.raises(EffvisionError, match="fps"):
        get_point_sampler("fsp")
    with pytest.raises(EffvisionError, match="voxel_size"):
        get_point_sampler("voxel", 8, voxel=0.1)
