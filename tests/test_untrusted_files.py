"""Files from strangers: a checkpoint that would run code when unpickled, archives whose members
escape their folder (zip-slip) or expand absurdly (zip bombs). Each is refused with one line and
nothing runs or lands outside its folder."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
import torch
from test_bad_inputs import ARCHIVES, FILES, assert_one_line_error

from effvision.cli import main
from effvision.data.archive import ArchiveError, extract_once, inside
from effvision.data.images.folders import FileSource, ImageFolderDataset
from effvision.errors import EffvisionError
from effvision.models import create_model, load_checkpoint
from effvision.models.weights import load_pretrained

MARKER = "effvision-was-exploited"  # what the malicious payloads would create in the working folder


class Payload:
    def __reduce__(self):
        return os.system, (f"touch {MARKER}",)


@pytest.fixture
def malicious_checkpoints(tmp_path, monkeypatch):
    """The corpus's raw pickle and the same payload in torch.save's own (zip) format."""
    monkeypatch.chdir(tmp_path)
    torch_format = tmp_path / "torch_format.pt"
    torch.save({"format": "effvision-checkpoint/1", "spec": Payload(), "state_dict": {}}, torch_format)
    return [FILES / "checkpoints/malicious.pt", torch_format]


# warnings as errors: torch's pickle-protocol note, printed, would be a second line on stderr
@pytest.mark.filterwarnings("error")
def test_malicious_pickle_is_refused_everywhere_a_checkpoint_is_read(malicious_checkpoints, tmp_path, capsys):
    for path in malicious_checkpoints:
        with pytest.raises(EffvisionError, match=rf"cannot read checkpoint {path}: Weights only load failed"):
            load_checkpoint(path)
        with pytest.raises(EffvisionError, match="Weights only load failed"):
            load_pretrained(create_model("cifar_resnet8", num_classes=10), path)
        assert_one_line_error(
            main(["export", str(path), "--out", str(tmp_path / "m.onnx")]),
            capsys.readouterr().err,
            "Weights only load failed",
        )
        assert_one_line_error(
            main(["compress", "default", "--set", f"model.pretrained={path}", "--run-dir", str(tmp_path / "run")]),
            capsys.readouterr().err,
            "Weights only load failed",
        )
    assert not (tmp_path / MARKER).exists(), "the payload ran"
    # the same payload does run when unpickled without weights_only: the test would notice a regression
    torch.load(malicious_checkpoints[1], weights_only=False)
    assert (tmp_path / MARKER).exists()


def test_text_named_checkpoint_is_one_line(capsys, tmp_path):
    assert_one_line_error(
        main(["export", str(FILES / "checkpoints/text_named.pt"), "--out", str(tmp_path / "m.onnx")]),
        capsys.readouterr().err,
        "cannot read checkpoint",
        "text_named.pt",
    )


@pytest.mark.parametrize("name", sorted(ARCHIVES))
def test_unsafe_or_broken_archives_are_refused(name, tmp_path, capsys):
    archive = FILES / "archives" / name
    with pytest.raises(
        EffvisionError, match=ARCHIVES[name].replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")
    ):
        ImageFolderDataset(archive)
    assert_one_line_error(main(["data", "inspect", str(archive)]), capsys.readouterr().err, ARCHIVES[name])
    out = tmp_path / "deep" / "copy"
    assert_one_line_error(
        main(["data", "compress", str(archive), str(out), "--quality", "50"]), capsys.readouterr().err, ARCHIVES[name]
    )
    if zipfile.is_zipfile(archive):
        with pytest.raises(ArchiveError):
            extract_once(archive, tmp_path / "cache")
        assert not list((tmp_path / "cache" / "extracted").glob("*/cat/ok.png")), (
            "part of a refused archive was extracted"
        )
    escaped = [p for p in tmp_path.rglob("escaped.png")] + [
        p for p in [Path("/tmp/effvision-absolute.png")] if p.exists()
    ]
    assert not escaped, escaped


def test_member_names_cannot_leave_their_folder(tmp_path):
    for name in ("../x.png", "a/../../x.png", "/etc/x.png", "C:\\x.png", "a\\..\\..\\x.png", ""):
        with pytest.raises(ArchiveError):
            inside(tmp_path, name)
    (tmp_path / "link").symlink_to("/")
    with pytest.raises(ArchiveError, match="resolves outside"):
        inside(tmp_path, "link/etc/x.png")
    assert inside(tmp_path, "a/b/x.png") == (tmp_path / "a/b/x.png").resolve()


def test_zip_bomb_member_is_refused_before_it_is_read(tmp_path):
    with pytest.raises(ArchiveError, match="expands"):
        FileSource(FILES / "archives/zip_bomb.zip").names()


def test_video_archive_is_extracted_once_and_whole(tmp_path):
    """A video or point-cloud dataset given as a .zip is extracted into the cache once; a
    half-done extraction (killed) is not taken for a finished one."""
    from effvision.data.cards import DatasetCard
    from effvision.data.layouts import data_root
    from effvision.recipe import DataConfig

    archive = tmp_path / "clips.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for split in ("train", "val"):
            z.write(FILES / "videos/mp4_named.avi", f"{split}/a/clip.mp4")
    card = DatasetCard(name="clips", modality="video", source="videofolder", cache_dir=str(tmp_path / "cache"))
    config = DataConfig(name="clips", root=str(archive))
    half_done = tmp_path / "cache" / "extracted" / ".clips-x.partial"
    half_done.mkdir(parents=True)
    root = data_root(card, config)
    assert (root / "train/a/clip.mp4").read_bytes() == (FILES / "videos/mp4_named.avi").read_bytes()
    stamp = (root / "train/a/clip.mp4").stat().st_mtime_ns
    assert data_root(card, config) == root and (root / "train/a/clip.mp4").stat().st_mtime_ns == stamp  # reused
    (root / ".effvision-extracted").unlink()  # as if the extraction had been killed before its marker
    assert data_root(card, config) == root and (root / ".effvision-extracted").is_file()
