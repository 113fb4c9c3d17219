"""Video: decoding (decord, PyAV fallback), frame samplers, datasets, models, views, inspection."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import INT8_ALWAYS, SHARED, needs_shared

from effvision.data.video.frame_samplers import get_sampler, segment_indices
from effvision.data.video.io import VideoError, open_video
from effvision.data.video.synthetic_motion import CLASSES, generate, render_clip, write_mp4
from effvision.errors import EffvisionError

SAMPLER_NAMES = ("tsn", "dense", "keyframes", "motion")
SHARED_VIDEOS = sorted(p for p in (SHARED / "testdata/videos").rglob("*") if p.is_file()) if SHARED.is_dir() else []


@pytest.fixture(scope="module")
def clip_file(tmp_path_factory):
    """A 16-frame H.264 mp4 of a shape moving right (key frame every 8 frames)."""
    path = tmp_path_factory.mktemp("video") / "right.mp4"
    write_mp4(path, render_clip(CLASSES.index("move_right"), np.random.default_rng(0)))
    return path


@pytest.fixture(scope="module")
def raw_stream(tmp_path_factory):
    """A raw MPEG-4 Part 2 stream without a container (decord cannot open these)."""
    import av

    path = tmp_path_factory.mktemp("video") / "raw.m4v"
    with av.open(str(path), "w", format="m4v") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for f in render_clip(0, np.random.default_rng(1), frames=12, size=64)[:, :48]:
            for p in s.encode(__import__("av").VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def test_decord_resizes_while_decoding_and_knows_key_frames(clip_file):
    video = open_video(clip_file, short_side=32)
    assert video.backend == "decord" and len(video) == 16 and video.fps == pytest.approx(10)
    assert video.key_indices() == [0, 8]
    frames = video.frames([3, 1, 3])
    assert frames.shape == (3, 32, 32, 3) and frames.dtype == np.uint8 and (frames[0] == frames[2]).all()
    assert video.decoded == 2  # the repeated index is decoded once


def test_pyav_fallback_reads_a_raw_stream(raw_stream):
    with pytest.raises(VideoError, match="decord cannot open"):
        open_video(raw_stream, backend="decord")
    video = open_video(raw_stream, short_side=24)
    assert video.backend == "pyav" and len(video) == 12 and video.key_indices()[0] == 0
    assert video.frames([0, 11]).shape == (2, 24, 32, 3)  # aspect kept: 48x64 -> 24x32


def test_a_scanned_file_is_opened_once_per_clip_and_never_recounted(clip_file, raw_stream, monkeypatch):
    import av
    import decord

    from effvision.data.video import io as video_io
    from effvision.data.video.datasets import VideoDataset

    ds = VideoDataset([(clip_file, 0), (raw_stream, 1)], ["a", "b"], get_sampler("tsn", 4), 32)
    assert [(i.backend, i.frames, i.width, i.height) for i in ds.info] == [("decord", 16, 64, 64), ("pyav", 12, 64, 48)]
    assert ds.info[0].keys == (0, 8) and ds.info[1].keys[0] == 0
    opened = []
    real_av, real_decord = av.open, decord.VideoReader
    monkeypatch.setattr(av, "open", lambda *a, **k: opened.append("av") or real_av(*a, **k))
    monkeypatch.setattr(decord, "VideoReader", lambda *a, **k: opened.append("decord") or real_decord(*a, **k))
    monkeypatch.setattr(video_io.PyAVVideo, "_scan", lambda self: pytest.fail("a clip read counted frames again"))
    clip, decoded = ds.read(0)
    assert opened == ["decord"] and clip.shape == (4, 3, 32, 32) and decoded == 4
    opened.clear()
    clip, decoded = ds.read(1)
    # one pass up to the last frame it keeps (frame 10 of 12), converting only the 4 it keeps
    assert opened == ["av"] and clip.shape == (4, 3, 32, 43) and decoded == 11


def _write_m4v(path, frames: int, gop: int | None = None):
    import av

    with av.open(str(path), "w", format="m4v") as c:
        s = c.add_stream("mpeg4", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        if gop:
            s.codec_context.gop_size = gop
        for f in render_clip(0, np.random.default_rng(1), frames=frames, size=64)[:, :48]:
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def _sequentially(video, indices):
    """The same frames, decoded one after another from the first (no group skipping)."""
    import dataclasses

    from effvision.data.video.io import PyAVVideo

    return PyAVVideo(video.path, video.size, dataclasses.replace(video.info, in_order=False)).frames(indices)


def test_a_stream_without_an_index_skips_the_groups_of_pictures_it_needs_nothing_from(tmp_path):
    from effvision.data.video.io import scan_video

    path = _write_m4v(tmp_path / "gop4.m4v", 12, gop=4)
    info = scan_video(path)
    assert (info.backend, info.frames, info.keys, info.in_order) == ("pyav", 12, (0, 4, 8), True)
    video = open_video(path, 24, info=info)
    frames = video.frames([9, 1])
    assert video.decoded == 4  # frames 0-1 and 8-9: frames 2-7 were never decoded
    assert np.array_equal(frames, _sequentially(video, [9, 1]))


@needs_shared
def test_shared_streams_read_by_groups_give_the_frames_sequential_decoding_gives():
    from effvision.data.video.io import scan_video

    streams = 0
    for path in SHARED_VIDEOS:
        info = scan_video(path)
        if not info.in_order:
            continue
        streams += 1
        video = open_video(path, 112, info=info)
        idx = segment_indices(info.frames, 8, True, np.random.default_rng(streams))
        assert np.array_equal(video.frames(idx), _sequentially(video, idx)), path
        assert video.decoded < max(idx) + 1
    assert streams == 8  # the UCF101 raw MPEG-4 streams


def test_segment_indices_cover_the_video_and_centre_in_evaluation():
    rng = np.random.default_rng(0)
    assert segment_indices(80, 8, False, rng) == [5, 15, 25, 35, 45, 55, 65, 75]
    train = segment_indices(80, 8, True, rng)
    assert all(10 * k <= i < 10 * (k + 1) for k, i in enumerate(train))
    assert (
        segment_indices(3, 8, False, rng) == sorted(segment_indices(3, 8, False, rng))
        and max(segment_indices(3, 8, False, rng)) <= 2
    )


@pytest.mark.parametrize("name", SAMPLER_NAMES)
@pytest.mark.parametrize("backend", ["decord", "pyav"])
def test_every_sampler_gives_a_clip_and_counts_decoded_frames(clip_file, name, backend):
    clip = get_sampler(name, 4).clip(clip_file, 32, train=True, rng=np.random.default_rng(0), backend=backend)
    assert clip.frames.shape == (4, 32, 32, 3) and clip.indices == sorted(clip.indices) and clip.backend == backend
    assert clip.total == 16 and clip.decoded >= len(set(clip.indices))
    if name == "keyframes":
        assert set(clip.indices) <= {0, 8}
    if name == "dense":
        assert np.diff(clip.indices).tolist() == [2, 2, 2]
    if name == "motion":
        assert clip.decoded >= 16  # the low-resolution scan decodes the whole (short) clip


def test_keyframe_sampler_on_a_stream_that_marks_no_key_frame(clip_file, monkeypatch):
    from effvision.data.video import io as video_io

    monkeypatch.setattr(video_io.PyAVVideo, "key_indices", lambda self: [])
    clip = get_sampler("keyframes", 3).clip(clip_file, 32, train=True, backend="pyav")
    assert clip.indices == [0, 0, 0] and clip.frames.shape == (3, 32, 32, 3)


def test_motion_sampler_prefers_moving_frames(tmp_path):
    frames = np.zeros((12, 32, 32, 3), np.uint8)
    frames[6:9] = np.random.default_rng(0).integers(0, 255, (3, 32, 32, 3))  # change only around frames 6..9
    write_mp4(tmp_path / "still.mp4", frames)
    clip = get_sampler("motion", 2, scan_size=16).clip(tmp_path / "still.mp4", 32)
    assert set(clip.indices) <= {6, 7, 8, 9}


def test_an_unreadable_video_is_one_error_and_stderr_keeps_working(tmp_path):
    """decord's own log line is muted while it opens a file; what the process writes after still shows."""
    import subprocess
    import sys

    (tmp_path / "notes.mp4").write_text("not a video")
    script = (
        "import sys\nfrom effvision.data.video.io import DecordVideo, VideoError\n"
        f"try:\n    DecordVideo({str(tmp_path / 'notes.mp4')!r})\nexcept VideoError as exc:\n    print(exc)\n"
        "sys.stderr.write('still here\\n')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "notes.mp4: decord cannot open it" in done.stdout, done.stderr
    assert done.stderr == "still here\n"


def test_unknown_sampler_and_option_list_the_valid_ones():
    with pytest.raises(EffvisionError, match="unknown video sampler 'tsm'.*dense, keyframes, motion, tsn"):
        get_sampler("tsm")
    with pytest.raises(EffvisionError, match="takes stride"):
        get_sampler("dense", 4, strde=2)


def test_synthetic_motion_is_cached_and_no_single_frame_tells_the_class(tmp_path):
    root = generate(tmp_path / "sm", train_per_class=2, val_per_class=1, frames=8, size=32)
    files = sorted(root.rglob("*.mp4"))
    assert len(files) == 3 * len(CLASSES) and {p.parent.name for p in files} == set(CLASSES)
    stamp = files[0].stat().st_mtime_ns
    generate(tmp_path / "sm", train_per_class=2, val_per_class=1, frames=8, size=32)
    assert files[0].stat().st_mtime_ns == stamp  # reused, not rewritten
    # Classes differ only over time: the mean frame of every class is alike, consecutive frames move.
    rng = np.random.default_rng(0)
    means = [np.mean([render_clip(c, rng, 8, 32).mean() for _ in range(20)]) for c in range(len(CLASSES))]
    assert max(means) - min(means) < 12
    clip = render_clip(CLASSES.index("turn_clockwise"), rng, 8, 32).astype(int)
    assert np.abs(np.diff(clip, axis=0)).mean() > 1


def _video_tree(root, bad: bool = True):
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("val", 1)):
        for c, label in enumerate(("left", "right")):
            (root / split / label).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                write_mp4(root / split / label / f"{i}.mp4", render_clip(c, rng, frames=8, size=32))
    if bad:
        (root / "train/left/notes.mp4").write_text("not a video")
        good = (root / "train/left/0.mp4").read_bytes()
        (root / "train/right/cut.mp4").write_bytes(good[: len(good) // 3])
    return root


def _video_config(root, **over):
    from effvision.recipe import DataConfig

    return DataConfig(name="videofolder", root=str(root), batch_size=2, **over)


def test_video_folder_dataset_skips_and_counts_bad_files(tmp_path, monkeypatch):
    from effvision.data import load_dataset
    from effvision.data.cards import DatasetCard

    card = DatasetCard(
        name="videofolder", modality="video", source="videofolder", image_size=32, num_frames=4, hflip=False
    )
    monkeypatch.setattr("effvision.data.get_card", lambda name: card)
    bundle = load_dataset(_video_config(_video_tree(tmp_path)))
    assert bundle.input_size == [3, 4, 32, 32] and bundle.classes == ["left", "right"]
    x, y = next(iter(bundle.train_loader(2)))
    assert x.shape == (2, 3, 4, 32, 32) and x.dtype == torch.float32
    for _ in bundle.train_loader(2):  # the truncated file either decodes its head or is skipped, never a crash
        pass
    bad = {p.split("/")[-1] for p, _ in bundle.bad_samples}
    assert "notes.mp4" in bad and len(bundle.train) + len([b for b in bad if b == "notes.mp4"]) >= 6
    with pytest.raises(EffvisionError, match="notes.mp4"):
        load_dataset(_video_config(tmp_path, on_bad_sample="fail"))


def test_annotation_lists_text_and_csv(tmp_path):
    from effvision.data.layouts import class_names, list_entries
    from effvision.data.video.io import is_video

    (tmp_path / "a b").mkdir()
    (tmp_path / "list.txt").write_text("# comment\nx/v1.mp4 jump\nx/v2.avi 2\na b/v3.mp4\n")
    pairs = list_entries(tmp_path / "list.txt", tmp_path, is_video)
    assert [(p.name, c) for p, c in pairs] == [("v1.mp4", "jump"), ("v2.avi", "2"), ("v3.mp4", "a b")]
    (tmp_path / "list.csv").write_text("label,path\nrun,x/v1.mp4\n")
    assert [(p.name, c) for p, c in list_entries(tmp_path / "list.csv", tmp_path, is_video)] == [("v1.mp4", "run")]
    assert class_names(["10", "2", "1"]) == ["1", "2", "10"]
    with pytest.raises(EffvisionError, match="annotation list not found"):
        list_entries(tmp_path / "missing.txt", tmp_path, is_video)


def test_temporal_shift_moves_channel_folds_in_time():
    from effvision.models.video import TemporalShift

    t, c = 4, 8
    x = torch.arange(t, dtype=torch.float32).view(1, t, 1, 1, 1).expand(2, t, c, 2, 2).reshape(2 * t, c, 2, 2)
    y = TemporalShift(t, c, fold_div=4)(x).reshape(2, t, c, 2, 2)[0, :, :, 0, 0]
    assert y[:, 0].tolist() == [1, 2, 3, 0]  # fold 1 sees the next frame (zeros after the last)
    assert y[:, 2].tolist() == [0, 0, 1, 2]  # fold 2 sees the previous frame
    assert y[:, 4].tolist() == [0, 1, 2, 3]  # the rest stay


def test_pruning_keeps_each_channels_shift_direction():
    """The shift masks are pruned with their channels: a kept channel shifts the way it was
    trained to (recomputing the folds from the pruned width would scramble the directions)."""
    from effvision.compression.prune import prune
    from effvision.models import create_model
    from effvision.models.video import TemporalShift

    model = create_model(
        "tsm", num_classes=4, input_size=[3, 4, 32, 32], backbone="cifar_resnet8", width=0.5, fold_div=4
    )
    wrapped = [m for m in model.modules() if isinstance(m, torch.nn.Sequential) and isinstance(m[0], TemporalShift)]
    widths = [seq[1].in_channels for seq in wrapped]
    with torch.no_grad():  # tag every input channel of the shifted convs with its index
        for seq in wrapped:
            shift, conv = seq
            tags = torch.arange(1.0, conv.in_channels + 1)
            conv.weight.copy_(tags.view(1, -1, 1, 1).expand_as(conv.weight))
            shift.back.mul_(tags.view(1, -1, 1, 1)), shift.ahead.mul_(tags.view(1, -1, 1, 1))
    prune(model, 0.5)
    for seq, width in zip(wrapped, widths, strict=True):
        shift, conv = seq
        kept = conv.weight[0, :, 0, 0]  # the original index (+1) of every input channel left
        assert shift.back.shape[1] == len(kept) < width and not shift.back.requires_grad
        assert torch.equal(shift.back.flatten(), torch.where(shift.back.flatten() > 0, kept, 0.0))
        assert torch.equal(shift.ahead.flatten(), torch.where(shift.ahead.flatten() > 0, kept, 0.0))
    assert model(torch.randn(2, 3, 4, 32, 32)).shape == (2, 4)


def _int8_against_fp32(fp32, int8, loader) -> tuple[float, float]:
    """Top-1 agreement of an int8 ONNX file with the fp32 one it was quantized from, and the
    relative error of its logits' variation from sample to sample (each class's mean over the
    samples removed): 0 when int8 follows fp32 exactly, 1 when its output ignores the input (zeroed
    weights, ranges from garbage calibration), 1 or more for an unrelated model."""
    from effvision.runtimes.onnx_files import onnx_predictor

    f, q = onnx_predictor(fp32), onnx_predictor(int8)
    a, b = (np.concatenate([p(x.numpy()) for x, *_ in loader]) for p in (f, q))
    da, db = a - a.mean(0), b - b.mean(0)
    return float((a.argmax(1) == b.argmax(1)).mean()), float(np.linalg.norm(db - da) / np.linalg.norm(da))


VIDEO_MODELS = [
    "tsm_resnet8_050.synthetic_motion",
    "tsm_mobilenetv3_small_100",
    "tsm_resnet18",
    "tsn_mobilenetv3_small_100",
    "r3d_18",
    "mc3_18",
    "r2plus1d_18",
]


# make test keeps the compact TSM; the larger backbones' int8 runs go to make bench (slow).
@pytest.mark.parametrize(
    "name",
    [n if n == "tsm_resnet8_050.synthetic_motion" else pytest.param(n, marks=pytest.mark.slow) for n in VIDEO_MODELS],
)
def test_video_model_quantizes_to_int8(name, tmp_path, monkeypatch):
    """Contract, pruning and ONNX parity of every video model run in test_models (parametrized
    over the registry and the zoo); here the exported clip model also goes through int8, leaving
    nothing in the working directory."""
    from effvision.models import create_model
    from effvision.runtimes.onnx_files import export_onnx, onnx_predictor
    from effvision.runtimes.onnx_int8 import quantize_onnx

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    torch.manual_seed(0)
    shape = [3, 4, 32, 32]
    model = create_model(name, num_classes=5, input_size=shape).eval()
    onnx_file = export_onnx(model, tmp_path / "m.onnx", shape)
    int8 = quantize_onnx(onnx_file, tmp_path / "m.int8.onnx", [(torch.randn(2, *shape), None)])
    clips = torch.randn(8, *shape)
    out = onnx_predictor(int8)(clips.numpy())
    # The untrained nets give one class for every clip, so top-1 cannot tell a broken int8 file;
    # the logits can. Measured (7-bit weights, no VNNI): error 0.10-0.51 over the seven models
    # (0.18-0.35 over six seeds of the compact TSM); zeroed int8 weights or garbage ranges: 1.0.
    _, err = _int8_against_fp32(onnx_file, int8, [(clips,)])
    assert err <= 0.75, f"{name}: int8 logits stray from fp32's (relative error {err:.2f})"
    assert out.shape == (8, 5) and np.isfinite(out).all() and not list(cwd.iterdir())


def test_single_frame_model_is_the_same_backbone_with_one_frame():
    from effvision.models import create_model

    model = create_model("tsm_resnet8_050.synthetic_motion", input_size=[3, 1, 32, 32])
    assert model.num_frames == 1 and model(torch.randn(2, 3, 1, 32, 32)).shape == (2, 6)


def test_views_average_clips_and_crops(tmp_path, monkeypatch):
    from torch.utils.data import DataLoader

    from effvision.data import load_dataset
    from effvision.data.cards import DatasetCard
    from effvision.data.video.views import ViewsDataset, crop_offsets, views_accuracy

    assert crop_offsets(40, 32, 3) == [0, 4, 8] and crop_offsets(40, 32, 1) == [4]
    card = DatasetCard(
        name="videofolder", modality="video", source="videofolder", image_size=24, resize=32, num_frames=4, hflip=False
    )
    monkeypatch.setattr("effvision.data.get_card", lambda name: card)
    bundle = load_dataset(_video_config(_video_tree(tmp_path, bad=False)))
    views = ViewsDataset(bundle.val, clips=2, crops=3, size=24, mean=card.mean, std=card.std)
    x, y, decoded = views[0]
    assert x.shape == (6, 3, 4, 24, 24) and decoded == 2 * 4  # two 4-frame TSN clips, nothing decoded besides
    assert not torch.equal(x[0], x[2])  # left and right crops differ
    seen = []
    acc, frames_per_video = views_accuracy(
        lambda v: seen.append(len(v)) or torch.nn.functional.one_hot(torch.zeros(len(v), dtype=torch.long), 2).float(),
        DataLoader(views, batch_size=2),
    )
    assert (
        seen == [12] and acc == 0.5 and frames_per_video == 8
    )  # both val videos, 6 views each; class 0 is right for one of two


def test_data_inspect_reports_videos(clip_file, tmp_path, capsys):
    from effvision.cli import main

    (tmp_path / "fake.mp4").write_text("hello")
    (tmp_path / "ok.mp4").write_bytes(clip_file.read_bytes())
    assert main(["data", "inspect", str(tmp_path), "--json"]) == 0
    rows = {r["path"].split("/")[-1]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ok.mp4"]["ok"] and rows["ok.mp4"]["kind"] == "video" and rows["ok.mp4"]["frames"] == 16
    assert (
        rows["ok.mp4"]["shape"] == [64, 64, 3] and rows["ok.mp4"]["backend"] == "decord" and rows["ok.mp4"]["fps"] == 10
    )
    assert not rows["fake.mp4"]["ok"] and "not a readable video" in rows["fake.mp4"]["error"]


@needs_shared
@pytest.mark.parametrize("name", SAMPLER_NAMES)
def test_every_shared_clip_decodes_with_every_sampler(name):
    sampler = get_sampler(name, 8)
    for path in SHARED_VIDEOS:
        clip = sampler.clip(path, 112)
        assert clip.frames.shape[0] == 8 and min(clip.frames.shape[1:3]) == 112, path


@needs_shared
def test_labelled_shared_clips_train_one_epoch(tmp_path, monkeypatch):
    """UCF101 (label in v_<Class>_g..) and Kinetics (label before __) clips through an annotation list."""
    from effvision.data import load_dataset
    from effvision.data.cards import DatasetCard
    from effvision.models import create_model
    from effvision.train.config import TrainSettings
    from effvision.train.loop import fit

    root = SHARED / "testdata/videos"
    lines = [
        f"{p.relative_to(root)} {p.name.split('__')[0] if p.parent.name == 'kinetics400' else p.name.split('_')[1]}"
        for p in SHARED_VIDEOS
        if p.parent.name in ("ucf101", "kinetics400")
    ]
    (tmp_path / "all.txt").write_text("\n".join(lines))
    card = DatasetCard(
        name="clips",
        modality="video",
        source="videolist",
        train=str(tmp_path / "all.txt"),
        val=str(tmp_path / "all.txt"),
        image_size=64,
        num_frames=4,
    )
    monkeypatch.setattr("effvision.data.get_card", lambda name: card)
    from effvision.recipe import DataConfig

    bundle = load_dataset(DataConfig(name="clips", root=str(root), batch_size=4))
    assert len(bundle.train) == len(lines) == 16 and not bundle.bad_samples
    model = create_model(
        "tsn", num_classes=bundle.num_classes, input_size=bundle.input_size, backbone="timm:mobilenetv3_small_050"
    )
    result = fit(model, bundle, TrainSettings(epochs=1, lr=0.01, optimizer="adamw"), torch.device("cpu"))
    assert len(result.history) == 1 and np.isfinite(result.history[0]["loss"])


def test_video_recipe_runs_every_stage(tmp_path, monkeypatch):
    """The whole pipeline on a few generated clips: train, prune, distill, export, int8, views, bench."""
    from effvision.data import load_dataset
    from effvision.data.cards import get_card
    from effvision.pipeline import run_pipeline
    from effvision.recipe import validate_recipe

    card = get_card("synthetic-motion").model_copy(
        update={
            "image_size": 32,
            "resize": 36,
            "num_frames": 4,
            "generate": {"train_per_class": 3, "val_per_class": 2, "frames": 8, "size": 36},
        }
    )
    monkeypatch.setattr("effvision.data.get_card", lambda name: card)
    recipe = validate_recipe(
        {
            "name": "video-tiny",
            "data": {"name": "synthetic-motion", "root": str(tmp_path / "clips"), "batch_size": 6},
            "model": {"name": "tsm", "kwargs": {"backbone": "cifar_resnet8", "width": 0.25}},
            "stages": [
                {"name": "baseline", "type": "train", "epochs": 1, "optimizer": "adamw", "lr": 3e-3},
                {"type": "prune", "ratio": 0.5},
                {"type": "distill", "epochs": 1, "features": {"method": "both"}},
                {"type": "export"},
                {"type": "quantize", "calibration": {"n": 8}, **INT8_ALWAYS},
                {"type": "evaluate", "clips": 2, "crops": 3},
                {"type": "bench", "warmup": 1, "repeats": 3, "batches": [1, 2]},
            ],
        }
    )
    report = run_pipeline(recipe, tmp_path / "run")
    stages = {s["name"]: s for s in report["stages"]}
    assert report["dataset"]["modality"] == "video" and report["dataset"]["train_size"] == 18
    assert stages["prune"]["macs"] < stages["baseline"]["macs"]
    # feature distillation on the frames folded into the batch: the end of every backbone stage
    assert stages["distill"]["features"] == {
        "method": "both",
        "layers": ["backbone.stages.0", "backbone.stages.1", "backbone.stages"],
        "from": "hooks",
    }
    # int8 against the fp32 file it was quantized from, both run in ONNX Runtime on the 12 val clips
    fp32, int8 = stages["export"], stages["quantize"]
    assert fp32["evaluated_with"] == int8["evaluated_with"] == "onnxruntime"
    assert int8["fp32_onnx_bytes"] == fp32["size_bytes"]
    assert abs(int8["accuracy"] - fp32["accuracy"]) <= 2 / 12 + 1e-9, (int8["accuracy"], fp32["accuracy"])
    # One epoch leaves the net at chance (1/6, one class for every clip), so accuracy cannot tell a
    # broken quantizer; the logits can. Measured (7-bit weights, no VNNI): agreement 1.0, error
    # 0.06; zeroed int8 weights or garbage calibration: error 1.0.
    agree, err = _int8_against_fp32(
        tmp_path / "run/stages/4-export/model.onnx",
        tmp_path / "run/stages/5-quantize/model.onnx",
        load_dataset(recipe.data).val_loader(),
    )
    assert agree >= 0.75 and err <= 0.6, f"int8 vs fp32: top-1 agreement {agree:.2f}, logit error {err:.2f}"
    views = stages["evaluate"]
    assert (
        views["views"] == 6
        and views["evaluated_with"] == "onnxruntime"
        and views["macs_per_video"] == 6 * stages["quantize"]["macs"]
    )
    assert (
        views["frames_decoded_per_clip"] == 4
        and report["dataset"]["sampler"] == "tsn"
        and report["dataset"]["frames_per_clip"] == 4
    )
    assert "2 clips x 3 crops" in (tmp_path / "run/report.md").read_text()
