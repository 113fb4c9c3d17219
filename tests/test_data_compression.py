"""`effvision data compress`: smaller copies of image, video and point-cloud datasets that keep
their layout and still load, with bytes and decode throughput measured; bad levels and unreadable
files handled."""

from pathlib import Path

import numpy as np
import pytest
from conftest import write_image_folder
from PIL import Image

from effvision.data.compression import Levels, compress_dataset
from effvision.errors import EffvisionError


def test_images_shrink_keep_their_layout_and_still_load(tmp_path):
    from effvision.data.images.folders import ImageFolderDataset

    src = write_image_folder(tmp_path / "src", per_class=4, size=40)
    (src / "cat" / "broken.png").write_bytes(b"\x89PNG not really")
    stats = compress_dataset(src, tmp_path / "out", Levels(max_size=20, quality=40))
    assert stats["compressed"] == 8 and [f["path"].endswith("broken.png") for f in stats["failed"]] == [True]
    assert (
        stats["bytes_after"] < stats["bytes_before"]
        and stats["decode_per_s_after"] > 0
        and stats["decode_per_s_before"] > 0
    )
    files = sorted((tmp_path / "out").rglob("*.jpg"))
    assert len(files) == 8 and all(max(Image.open(f).size) == 20 for f in files)
    ds = ImageFolderDataset(tmp_path / "out")
    assert ds.classes == ["cat", "dog"] and len(ds) == 8
    zipped = compress_dataset(src, tmp_path / "out.zip", Levels(image_format="webp", quality=30))
    assert zipped["compressed"] == 8 and len(ImageFolderDataset(tmp_path / "out.zip")) == 8


def test_video_stride_key_frames_and_size(tmp_path):
    from effvision.data.video.io import open_video
    from effvision.data.video.synthetic_motion import render_clip, write_mp4

    (tmp_path / "src/a").mkdir(parents=True)
    write_mp4(
        tmp_path / "src/a/clip.mp4", render_clip(0, np.random.default_rng(0), frames=16, size=32)
    )  # a key frame every 8
    stats = compress_dataset(tmp_path / "src", tmp_path / "s2", Levels(stride=2, short_side=16, crf=30))
    v = open_video(tmp_path / "s2/a/clip.mp4")
    assert (
        stats["compressed"] == 1
        and stats["decode_unit"] == "frames"
        and len(v) == 8
        and v.frames([0]).shape[1:3] == (16, 16)
    )
    assert abs(v.fps - 5) < 0.01
    compress_dataset(tmp_path / "src", tmp_path / "key", Levels(keyframes=True))
    assert len(open_video(tmp_path / "key/a/clip.mp4")) == 2


def test_points_keep_n_or_one_per_voxel(tmp_path):
    from effvision.data.points.io import read_points

    pytest.importorskip("open3d", exc_type=ImportError, reason="open3d (or libusb-1.0) is not available")
    rng = np.random.default_rng(0)
    (tmp_path / "src/box").mkdir(parents=True)
    cloud = rng.random((500, 3)).astype(np.float32)
    np.savetxt(tmp_path / "src/box/a.xyz", cloud)
    compress_dataset(tmp_path / "src", tmp_path / "n", Levels(num_points=64))
    kept = read_points(tmp_path / "n/box/a.npy")
    assert kept.shape == (64, 3) and np.isin(kept[:, 0], cloud[:, 0]).all()  # original points, not new ones
    compress_dataset(tmp_path / "src", tmp_path / "v", Levels(voxel_size=0.5))
    assert len(read_points(tmp_path / "v/box/a.npy")) == 8  # one point per occupied cell of a 2x2x2 grid


def test_bad_levels_and_destinations_are_one_line_errors(tmp_path, capsys):
    from effvision.cli import main

    src = write_image_folder(tmp_path / "src", per_class=1)
    for args, msg in (
        (["--quality", "0"], "--quality 0"),
        (["--short-side", "15"], "even"),
        (["--format", "gif"], "choices"),
        (["--voxel-size", "-1"], "positive"),
    ):
        assert main(["data", "compress", str(src), str(tmp_path / "o"), *args]) == 1
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(EffvisionError, match="already exists"):
        compress_dataset(src, src, Levels())
    with pytest.raises(EffvisionError, match="not found"):
        compress_dataset(tmp_path / "nowhere", tmp_path / "o2", Levels())
    assert Path(tmp_path / "o").exists() is False
