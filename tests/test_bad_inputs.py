"""The bad-input corpus (tests/data/bad, written by its generate.py) through every reader, the
datasets (skip and count, or fail naming the file), DataLoader workers and the CLI: each case ends
in its own specific outcome, one line, no traceback, no hang."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from effvision.cli import main
from effvision.data.images.folders import FileSource, ImageFolderDataset
from effvision.data.inspect import inspect_one
from effvision.errors import EffvisionError

BAD = Path(__file__).parent / "data" / "bad"
FILES = BAD / "files"
CASE_TIMEOUT_S = 30
UNSUPPORTED = "unsupported file type"

# What each file must end in: ("ok", shape or None) or ("error", words the one-line error holds).
EXPECTED = {
    "images/zero_bytes.jpg": ("error", "empty file"),
    "images/zero_bytes.png": ("error", "empty file"),
    "images/truncated.jpg": ("error", "image file is truncated"),
    "images/truncated.png": ("error", "image file is truncated"),
    "images/header_only.jpg": ("error", "not an image Pillow can read"),
    "images/text_named.jpg": ("error", "not an image Pillow can read"),
    "images/random_bytes.png": ("error", "not an image Pillow can read"),
    "images/bad_crc.png": ("error", "not an image Pillow can read"),
    "images/bomb_20000x20000.png": ("error", "400000000 pixels) exceeds limit"),
    "images/bomb_12000x12000.png": ("error", "144000000 pixels) exceeds limit"),
    "images/png_named.jpg": ("ok", [24, 32, 3]),
    "images/jpeg_named.png": ("ok", [24, 32, 3]),
    "images/gray_1ch.png": ("ok", [24, 32, 3]),
    "images/gray_alpha_2ch.png": ("ok", [24, 32, 3]),
    "images/rgba_4ch.png": ("ok", [24, 32, 3]),
    "images/cmyk.jpg": ("ok", [24, 32, 3]),
    "images/palette.png": ("ok", [24, 32, 3]),
    "images/gray_16bit.png": ("ok", [64, 64, 3]),
    "images/one_pixel.png": ("ok", [1, 1, 3]),
    "videos/zero_bytes.mp4": ("error", "not a readable video"),
    "videos/text_named.mp4": ("error", "not a readable video"),
    "videos/truncated.mp4": ("error", "not a readable video"),
    "videos/truncated_faststart.mp4": ("error", "decoding failed"),
    "videos/zero_frames.mp4": ("error", "no video stream"),
    "videos/audio_only.mp4": ("error", "no video stream"),
    "videos/random_bytes.avi": ("error", "not a readable video"),
    "videos/jpeg_named.mp4": ("ok", [24, 32, 3]),  # FFmpeg reads a JPEG as a one-frame video
    "videos/mp4_named.avi": ("ok", [48, 64, 3]),
    "videos/mp4_named.mkv": ("ok", [48, 64, 3]),
    "points/zero_bytes.ply": ("error", "empty file"),
    "points/zero_bytes.pcd": ("error", "empty file"),
    "points/zero_bytes.off": ("error", "empty file"),
    "points/zero_bytes.bin": ("error", "empty file"),
    "points/truncated_binary.ply": ("error", "truncated (1000 bytes of data, the header needs at least 1200)"),
    "points/lying_count.ply": ("error", "truncated (the header declares 100 rows, the file has 10)"),
    "points/lying_count_binary.ply": ("error", "truncated (120 bytes of data"),
    "points/lying_count.pcd": ("error", "truncated (the header declares 100 points, the file has 10 rows)"),
    "points/text_named.pcd": ("error", "not a PCD file"),
    "points/text_named.ply": ("error", "not a PLY file"),
    "points/truncated.off": ("error", "face 1 lists 1 of its 3 vertex indices"),
    "points/lying_count.off": ("error", "header says 50 4 0"),
    "points/header_defect.off": ("ok", [8, 3]),
    "points/partial_record.bin": ("error", "1606 bytes is not a whole number of 4-float32 records"),
    "points/nan_points.xyz": ("error", "no finite points"),
    "points/two_columns.xyz": ("error", "expected rows of at least 3 values"),
    "points/pickled_object.npy": ("error", "Object arrays cannot be loaded when allow_pickle=False"),
    "points/text_named.npy": ("error", "cannot read it"),
    "points/garbage.stl": ("error", "no triangles could be read"),
    "other/notes.txt": ("error", UNSUPPORTED),
    "other/archive.unknownext": ("error", UNSUPPORTED),
    "other/no_extension": ("error", UNSUPPORTED),
}
ARCHIVES = {
    "zip_slip.zip": "'../../escaped.png': a path that leaves the archive's folder (zip-slip)",
    "absolute_path.zip": "'/tmp/effvision-absolute.png': an absolute path (zip-slip)",
    "zip_bomb.zip": "'cat/huge.png': expands",
    "not_a_zip.zip": "is neither a folder nor a .zip archive",
    "truncated.zip": "is neither a folder nor a .zip archive",  # its central directory, at the end, is gone
}
RECIPES = {
    "unknown_key": "stagess: unknown key; did you mean 'stages'?",
    "unknown_nested_key": "data.batchsize: unknown key; did you mean 'batch_size'?",
    "wrong_type": "data.batch_size: Input should be a valid integer",
    "unknown_stage": "stages.0.type: unknown stage type 'prnue'; did you mean 'prune'?",
    "stage_type_is_code": "stages.0.type: unknown stage type 'os.system'",
    "negative_ratio": "stages.0.ratio: Input should be greater than 0 (got -0.5)",
    "ratio_above_one": "stages.0.ratio: Input should be less than 1 (got 1.5)",
    "negative_epochs": "stages.0.epochs: Input should be greater than or equal to 0",
    "stage_not_mapping": "stages.0: a stage must be a mapping",
    "duplicate_stage_names": "names must be unique; repeated: prune",
    "missing_model": "model: required key is missing",
    "empty": "model: required key is missing",
    "list_not_mapping": "a recipe must be a YAML mapping",
    "not_yaml": "line 2 is not valid YAML",
    "python_tag": "could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system'",
    "unknown_model": "unknown model 'cifar_resnet_8'; did you mean 'cifar_resnet8'",
    "missing_data_root": "data path not found: /nonexistent/cifar10",
    "missing_pretrained": "checkpoint not found: /nonexistent/weights.pth",
    "unknown_dataset": "unknown dataset 'imagenet-but-misspelt'",
    "bad_on_bad_sample": "data.on_bad_sample: Input should be 'skip' or 'fail'",
}


@contextlib.contextmanager
def time_limit(seconds: int, case: str):
    """Fail the case (not the session) when a reader hangs."""

    def stop(*_):
        raise TimeoutError(f"{case}: no outcome within {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def assert_one_line_error(code: int, err: str, *words: str) -> None:
    err = err.strip()
    assert code == 1, f"exit {code}: {err}"
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "internal error" not in err, err
    for w in words:
        assert w in err, f"{w!r} not in {err!r}"


def test_corpus_has_every_kind_of_case_and_matches_its_generator(tmp_path):
    spec = importlib.util.spec_from_file_location("bad_corpus", BAD / "generate.py")
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    names = generator.write_corpus(tmp_path)
    committed = json.loads((FILES / "MANIFEST.json").read_text())
    assert sorted(names) == committed
    assert (
        sorted(str(p.relative_to(FILES)) for p in FILES.rglob("*") if p.is_file() and p.name != "MANIFEST.json")
        == committed
    )
    cases = set(EXPECTED) | {f"archives/{n}" for n in ARCHIVES} | {f"recipes/{n}.yaml" for n in RECIPES}
    assert cases | {"checkpoints/malicious.pt", "checkpoints/text_named.pt"} == set(committed)
    bad = [n for n, (outcome, _) in EXPECTED.items() if outcome == "error"] + list(ARCHIVES) + list(RECIPES)
    assert len(bad) >= 40, len(bad)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_reader_ends_each_file_in_its_outcome(name):
    outcome, detail = EXPECTED[name]
    with time_limit(CASE_TIMEOUT_S, name):
        status = inspect_one(FileSource(FILES), name)
    assert status["path"] == str(FILES / name)
    if outcome == "ok":
        assert status["ok"] and status["shape"] == detail, status
    else:
        assert not status["ok"] and detail in status["error"], status
        assert "\n" not in status["error"]


def test_16bit_image_keeps_its_range():
    from effvision.data.images.folders import decode_image

    img = decode_image((FILES / "images/gray_16bit.png").read_bytes())
    assert img.dtype == torch.uint8 and img.min() == 0 and img.max() == 255
    assert 120 < img.float().mean() < 135  # a 0..65520 ramp: mid-grey on average, not clipped white


def test_cli_inspects_the_whole_corpus_in_one_run():
    """The real command in its own process: every file gets its row, nothing escapes as a traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "effvision.cli", "data", "inspect", str(FILES), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    # decord's C++ logger and its FFmpeg would add a line per unreadable video: the row says it all.
    assert "video_reader.cc" not in done.stderr and "moov atom" not in done.stderr, done.stderr[-2000:]
    rows = {
        str(Path(r["path"]).relative_to(FILES.resolve() if Path(r["path"]).is_absolute() else FILES)): r
        for r in json.loads(done.stdout)
    }
    for name, (outcome, detail) in EXPECTED.items():
        assert rows[name]["ok"] == (outcome == "ok"), rows[name]
        if outcome == "error":
            assert detail in rows[name]["error"], rows[name]


def _image_layout(tmp_path: Path) -> Path:
    """The corpus images as one class of an ImageFolder tree."""
    root = tmp_path / "images" / "any"
    root.mkdir(parents=True)
    for p in (FILES / "images").iterdir():
        (root / p.name).symlink_to(p)
    return tmp_path / "images"


def test_image_dataset_skips_and_counts_or_fails_naming_the_file(tmp_path):
    root = _image_layout(tmp_path)
    bad = sorted(n.split("/")[1] for n, (o, _) in EXPECTED.items() if n.startswith("images/") and o == "error")
    ds = ImageFolderDataset(root, on_bad_sample="skip")
    assert sorted(Path(p).name for p, _ in ds.report.bad) == bad
    assert len(ds) == ds.report.total - len(bad) == 9
    loader = torch.utils.data.DataLoader(ds, batch_size=1, num_workers=2)
    assert sum(1 for _ in loader) == 9  # each good one, in worker processes
    with pytest.raises(EffvisionError, match=r"corrupt image .*images/any/bad_crc\.png"):
        ImageFolderDataset(root, on_bad_sample="fail")


def test_video_dataset_skips_bad_files_in_dataloader_workers(tmp_path, capfd):
    from effvision.data.video.datasets import VideoDataset
    from effvision.data.video.frame_samplers import get_sampler

    videos = sorted((FILES / "videos").iterdir())
    ds = VideoDataset([(p, 0) for p in videos], ["any"], get_sampler("tsn", 4), short_side=32, on_bad_sample="skip")
    unopenable = {
        n.split("/")[1]
        for n, (o, d) in EXPECTED.items()
        if n.startswith("videos/") and o == "error" and d != "decoding failed"
    }
    assert {Path(p).name for p, _ in ds.report.bad} == unopenable
    assert len(ds) == 4  # three good files and the one that opens but breaks while decoding
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2)
    clips = [c for c, _ in loader]
    assert sum(len(c) for c in clips) == 4 and all(c.shape[1:3] == (4, 3) for c in clips)
    assert "skipped a video that failed to decode" in capfd.readouterr().err  # named by the worker, which lived on
    with pytest.raises(EffvisionError, match=r"videos/(random_bytes\.avi|audio_only\.mp4)"):
        VideoDataset([(p, 0) for p in videos], ["any"], get_sampler("tsn", 4), short_side=32, on_bad_sample="fail")


def test_point_dataset_skips_and_counts_or_fails_naming_the_file(tmp_path):
    from effvision.data.cards import DatasetCard
    from effvision.data.points.datasets import PointCloudDataset
    from effvision.data.points.samplers import get_point_sampler

    card = DatasetCard(
        name="bad",
        modality="points",
        source="pointfolder",
        cache_points=64,
        num_points=32,
        mesh_points=64,
        cache_dir=str(tmp_path / "cache"),
    )
    files = sorted((FILES / "points").iterdir())
    ds = PointCloudDataset([(p, 0) for p in files], ["any"], get_point_sampler("fps", 32), card, on_bad_sample="skip")
    bad = {n.split("/")[1] for n, (o, _) in EXPECTED.items() if n.startswith("points/") and o == "error"}
    assert {Path(p).name for p, _ in ds.report.bad} == bad
    assert len(ds) == 1 and ds[0][0].shape == (32, 3) and np.isfinite(ds[0][0]).all()
    with pytest.raises(EffvisionError, match=r"points/\w+\.\w+"):
        PointCloudDataset([(p, 0) for p in files], ["any"], get_point_sampler("fps", 32), card, on_bad_sample="fail")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_mistake_is_one_line(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with time_limit(CASE_TIMEOUT_S, name):
        code = main(["compress", str(FILES / f"recipes/{name}.yaml"), "--run-dir", str(tmp_path / "run")])
    assert_one_line_error(code, capsys.readouterr().err, RECIPES[name])
    assert not (tmp_path / "effvision-was-exploited").exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["compress", "no/such/recipe.yaml"], ["no/such/recipe.yaml", "not found"]),
        (["compress", "default", "--set", "stages.9.ratio=0.5"], ["index 9 out of range"]),
        (["compress", "default", "--set", "data.batch_size=[1"], ["not valid YAML"]),
        (["compress", "default", "--set", "nokey"], ["expected key.path=value"]),
        (["compress", "default", "--set", "data.batch_size=-3"], ["data.batch_size: Input should be greater than 0"]),
        (
            ["compress", "default", "--set", "stages.quantize.max_drop=1.5"],
            ["stages.4.max_drop", "less than 1", "(got 1.5)"],
        ),
        (
            ["compress", "default", "--set", "stages.quantize.max_drop=-0.01"],
            ["max_drop", "greater than or equal to 0"],
        ),
        (["data", "inspect", "no/such/folder"], ["path not found: no/such/folder"]),
        (["study", "selection", "default", "--budgets", "[1"], ["--budgets [1: give fractions"]),
        (
            ["study", "selection", "default", "--methods", "el2n:keep=[", "--budgets", "0.1"],
            ["el2n:keep=[", "value of keep is not valid YAML"],
        ),
    ],
)
def test_command_line_mistakes_are_one_line(argv, words, capsys):
    assert_one_line_error(main(argv), capsys.readouterr().err, *words)
