"""Caches that several runs share: every kind (decoded images, point clouds, farthest-point
orders, latency tables) detects a truncated or bit-flipped entry, says so in one line and builds
it again to the same result; two processes building the same entries at once end with one good
entry each and the results of a run alone. And a full disk under a run: one line naming the file,
the finished stages kept, and the rerun completes once there is space."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_recipe, write_image_folder
from test_points import _card, _off

from effvision import cache
from effvision.recipe import DataConfig


def _points(tmp_path: Path):
    """A point-folder dataset (its clouds and FPS orders cached); returns the training split."""
    from effvision.data.points import datasets as points

    root = tmp_path / "data"
    if not root.exists():
        for c, scale in (("cone", 1.0), ("desk", 2.0)):
            for split, n in (("train", 3), ("test", 1)):
                for i in range(n):
                    _off(root / c / split / f"{c}_{i:04d}.off", scale * (1 + i))
    return points.pointfolder(_card(tmp_path), DataConfig(name="t"))[0]


def _images(tmp_path: Path):
    from effvision.data.images.folders import ImageFolderDataset
    from effvision.data.tensor_batches import mapped_images

    folder = tmp_path / "imgs"
    if not folder.exists():
        write_image_folder(folder, classes=("a", "b"), per_class=4, size=24)
    images, _ = mapped_images(ImageFolderDataset(folder), 16, tmp_path / "cache")
    return np.array(images)


def _latency(tmp_path: Path) -> dict:
    path = tmp_path / "cache" / "latency" / "machine.json"
    return cache.update(path, lambda t: {**t, "conv": {**t.get("conv", {}), "8,8": 0.125}}, "latency-table")


def _entries(tmp_path: Path, suffix: str) -> list[Path]:
    return sorted(p for p in (tmp_path / "cache").rglob(f"*{suffix}") if not p.name.startswith("."))


KINDS = {
    "decoded images": (_images, ".npy", lambda r: r),
    "point clouds": (_points, ".npz", lambda ds: np.asarray(ds.clouds)[ds.rows]),
    "point-cloud rows": (_points, "clouds.npy", lambda ds: np.asarray(ds.clouds)[ds.rows]),
    "farthest-point orders": (_points, "x8.npy", lambda ds: np.array(ds.orders)),  # a copy, not the mapping
    "latency tables": (_latency, ".json", lambda r: r),
}


@pytest.mark.parametrize("damage", ["truncate", "flip"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_cache_entry_is_said_and_built_again(kind, damage, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("EFFVISION_QUIET", raising=False)
    build, suffix, result = KINDS[kind]
    clean = result(build(tmp_path))
    if suffix == "clouds.npy":  # the clouds beside the labels: <key>.npy, not <key>.fps...npy
        files = [p for p in _entries(tmp_path, ".npy") if ".fps" not in p.name]
    else:
        files = _entries(tmp_path, suffix)
    assert files, kind
    target = files[0]
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(bytes(data[: len(data) // 3]))
    else:
        data[len(data) // 2] ^= 0x40
        target.write_bytes(bytes(data))
    capsys.readouterr()
    again = result(build(tmp_path))
    said = capsys.readouterr()
    text = (said.out + said.err).replace("\n", "")  # one line, wrapped at the console's width
    assert f"{target}" in text and "is damaged" in text, text
    assert np.array_equal(np.asarray(again), np.asarray(clean)) if not isinstance(clean, dict) else again == clean
    assert cache.damage(target) is None  # sealed again


def _build_all(root: str, offset: float) -> str:
    """One process of the concurrency test: every kind of entry built under `root`."""
    time.sleep(offset)
    tmp = Path(root)
    images = _images(tmp)
    ds = _points(tmp)
    tables = _latency(tmp)
    return json.dumps(
        [
            float(images.sum()),
            float(np.asarray(ds.clouds)[ds.rows].sum()),
            int(np.array(ds.orders, dtype=np.int64).sum()),
            tables,
        ]
    )


def _data(root: Path) -> Path:
    """The source files (images, meshes) of a cache test, written before any process builds."""
    write_image_folder(root / "imgs", classes=("a", "b"), per_class=4, size=24)
    for c, scale in (("cone", 1.0), ("desk", 2.0)):
        for split, n in (("train", 3), ("test", 1)):
            for i in range(n):
                _off(root / "data" / c / split / f"{c}_{i:04d}.off", scale * (1 + i))
    return root


def test_two_processes_building_the_same_entries_end_with_good_entries_and_equal_results(tmp_path):
    alone = _build_all(str(_data(tmp_path / "alone")), 0)
    rng = random.Random(0)
    # spawned, not forked: a fork of a process whose OpenMP pool ran (open3d's sampling) may hang
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.starmap(time.sleep, [(0,), (0,)])  # both workers started before the first repetition
        for rep in range(10):
            root = _data(tmp_path / f"shared{rep}")
            results = pool.starmap(_build_all, [(str(root), rng.random() * 0.05) for _ in range(2)])
            assert results == [alone, alone], rep
            # decoded images; clouds, labels and FPS orders of both splits; the latency table
            entries = [p for p in (root / "cache").rglob("*") if p.suffix in (".npy", ".npz", ".json")]
            assert len(entries) == 8 and all(cache.damage(p) is None for p in entries), rep
            assert not [p for p in (root / "cache").rglob(".*.tmp")], rep


# --------------------------------------------------------------------------- a full disk


def _tiny_recipe(tmp_path: Path) -> Path:
    import yaml

    raw = tiny_recipe()
    raw["stages"] = raw["stages"][:1] + raw["stages"][3:5]  # baseline, export, quantize
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    return recipe


def _one_line(stderr: str, *fragments: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


@pytest.mark.skipif(os.geteuid() != 0 or sys.platform != "linux", reason="mounting a small tmpfs needs root on Linux")
@pytest.mark.slow  # 25-30 s: a whole run on a small tmpfs, then resumed
def test_a_run_on_a_full_disk_says_which_file_keeps_its_stages_and_resumes(tmp_path):
    """A real full disk (a 420 kB tmpfs): the run stops writing an epoch checkpoint of its first
    training stage (two copies of model and optimizer do not fit), keeps the epoch before, and
    once the disk is larger the same command finishes the run."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=420k", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("this machine does not let the test mount a tmpfs")
    try:
        env = {**os.environ, "EFFVISION_QUIET": "1"}
        cmd = [sys.executable, "-m", "effvision.cli", "compress", str(_tiny_recipe(tmp_path)), "--run-dir"]
        cmd.append(str(disk / "run"))
        full = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert full.returncode == 1, full.stderr
        _one_line(full.stderr, "cannot write", "no space left on the device", "keeps", "free space and run")
        assert not list(disk.rglob(".*.tmp")), "a half-written file was left"
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert again.returncode == 0, again.stderr
        report = json.loads((disk / "run/report.json").read_text())
        assert [s["name"] for s in report["stages"]] == ["baseline", "export", "quantize"]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# Where a run writes, by the file's path: each fails once with ENOSPC (a write shim on the rename
# that puts a finished file in place), then the rerun must complete.
WRITE_SITES = {
    "epoch checkpoint": "stages/1-baseline/resume/baseline.pt",
    "stage checkpoint": "stages/1-baseline/model.pt",
    "stage record": "stages/1-baseline/metrics.json",
    "ONNX export": "stages/2-export/model.onnx",
    "export parity": "stages/2-export/model.onnx.parity.json",
    "int8 file": "stages/3-quantize/model.onnx",
    "report": "report.json",
    "bundle": "bundle",
}


@pytest.mark.slow  # about 2 minutes: a run per site
@pytest.mark.parametrize("site", WRITE_SITES)
def test_enospc_at_each_write_site_is_one_line_and_the_rerun_completes(site, tmp_path, capsys, monkeypatch):
    from effvision.cli import main

    run = tmp_path / "run"
    target = run / WRITE_SITES[site]
    real_replace, real_rename, hit = os.replace, os.rename, []

    def full(real):
        def move(src, dst, *a, **k):
            if Path(dst) == target and not hit:
                hit.append(dst)
                raise OSError(28, "No space left on device", str(dst))
            return real(src, dst, *a, **k)

        return move

    monkeypatch.setattr(os, "replace", full(real_replace))
    monkeypatch.setattr(os, "rename", full(real_rename))
    recipe = _tiny_recipe(tmp_path)
    code = main(["compress", str(recipe), "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 1 and hit, (site, err)
    _one_line(err, f"cannot write {target}", "no space left on the device", f"{run} keeps")
    assert not list(run.rglob(".*.tmp")), "a half-written file was left"
    finished = {p: p.stat().st_mtime_ns for p in run.glob("stages/*/metrics.json")}
    monkeypatch.setattr(os, "replace", real_replace)
    monkeypatch.setattr(os, "rename", real_rename)
    assert main(["compress", str(recipe), "--run-dir", str(run)]) == 0, capsys.readouterr().err
    assert (run / "bundle/model.onnx").is_file() and (run / "report.json").is_file()
    assert {p: p.stat().st_mtime_ns for p in finished} == finished, "a finished stage ran again"


def test_enospc_writing_a_cache_entry_leaves_no_entry_and_the_next_build_makes_it(tmp_path, monkeypatch):
    import errno

    from effvision.errors import EffvisionError

    path = tmp_path / "cache" / "entry.npy"

    def full(tmp):
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    with pytest.raises(EffvisionError, match="no space left on the device"):
        cache.entry(path, full, "test")
    assert not path.exists() and not cache.seal_path(path).exists() and not list(path.parent.glob(".*.tmp"))
    cache.entry(path, lambda tmp: tmp.write_bytes(b"whole"), "test")
    assert path.read_bytes() == b"whole" and cache.damage(path) is None


def test_enospc_saving_a_study_row_keeps_the_rows_before_and_the_rerun_measures_the_rest(tmp_path, monkeypatch):
    from effvision.fileio import WriteFailed
    from effvision.studies.common import Rows

    rows = Rows(tmp_path / "study", {"seeds": 1})
    rows.measure({"cell": "a"}, lambda: {"top1": 0.5})
    real = os.replace

    def full(src, dst, *a, **k):
        if Path(dst).name == "results.json":
            raise OSError(28, "No space left on device", str(dst))
        return real(src, dst, *a, **k)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(WriteFailed, match="results.json: no space left on the device"):
        rows.measure({"cell": "b"}, lambda: {"top1": 0.6})
    monkeypatch.setattr(os, "replace", real)
    again = Rows(tmp_path / "study", {"seeds": 1})
    assert again.get(cell="a") == {"cell": "a", "top1": 0.5} and again.get(cell="b") is None
    again.measure({"cell": "b"}, lambda: {"top1": 0.6})
    assert [r["cell"] for r in Rows(tmp_path / "study", {"seeds": 1}).rows] == ["a", "b"]
    assert not list((tmp_path / "study").glob(".*.tmp"))
