"""Crash safety: a pipeline killed with SIGKILL at random points resumes and finishes with a complete,
valid report that lost none of the stages finished before the kill; a second pipeline started on a
busy run folder refuses.

The runs are `effvision compress` itself (cli.main) in processes forked from a server that has
imported torch and effvision once, so the kill-and-resume trials cost seconds of start-up, not
minutes."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import onnx
import pytest
from conftest import INT8_ALWAYS
from forked_cli import checkpoint_epoch, finish, recipe_runs, wait_for_checkpoint

from effvision.cli import main
from effvision.models import load_checkpoint
from effvision.runlock import run_lock

KILLS = 4  # one kill point at random in each quarter of a run (stratified below); a kill costs ~13 s
RECIPE = {
    "name": "crash",
    "seed": 0,
    "data": {"name": "digits", "max_train_samples": 200, "max_val_samples": 100, "batch_size": 32},
    "model": {"name": "cifar_resnet8", "kwargs": {"width": 0.25}},
    "stages": [
        # five epochs: random kill points land inside epochs too (epoch checkpoints, test_resume.py)
        {"name": "baseline", "type": "train", "epochs": 5, "optimizer": "adamw", "lr": 3e-3},
        {"type": "prune", "ratio": 0.5},
        {"type": "export"},
        {"type": "quantize", "calibration": {"n": 32}, **INT8_ALWAYS},
        {
            "type": "bench",
            "backends": ["onnxruntime-cpu"],
            "batches": [1],
            "warmup": 1,
            "repeats": 3,
            "roofline": False,
            "reference": False,  # the reference's export is tested in test_pipeline; here it only costs time
        },
    ],
}
STAGES = ["baseline", "prune", "export", "quantize", "bench"]


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return recipe_runs(tmp_path_factory, RECIPE)


def _finished_stages(run_dir: Path) -> dict[str, str]:
    """metrics.json of every stage that had completed (the marker is written last)."""
    return {p.parent.name: p.read_text() for p in sorted(run_dir.glob("stages/*/metrics.json"))}


def assert_complete(run_dir: Path) -> dict:
    """A finished run folder: the report names every stage, every artifact exists and loads,
    nothing half-written is left, and the lock is free."""
    report = json.loads((run_dir / "report.json").read_text())
    assert [s["name"] for s in report["stages"]] == STAGES
    for s in report["stages"]:
        assert 0.0 <= s["accuracy"] <= 1.0 and s["params"] > 0 and s["size_bytes"] > 0, s
    for name, metrics in _finished_stages(run_dir).items():
        record = json.loads(metrics)
        for kind, rel in record.get("artifacts", {}).items():
            path = run_dir / rel
            assert path.is_file(), f"{name}: {rel} missing"
            if kind == "model":
                assert load_checkpoint(path).num_classes == 10
            elif kind == "onnx":
                onnx.checker.check_model(onnx.load(str(path)))
    assert not list(run_dir.rglob("*.tmp")), "a temporary file was left behind"
    assert not list(run_dir.glob("stages/*/resume")), "a completed stage kept its epoch checkpoints"
    assert (run_dir / "report.md").is_file() and (run_dir / "report.html").is_file()
    with run_lock(run_dir):  # free again once the run ended
        pass
    return report


def _epoch_checkpoints(run_dir: Path) -> dict[str, int]:
    """The epochs each unfinished stage's epoch checkpoints had finished, by stage folder."""
    found = {}
    for path in run_dir.glob("stages/*/resume/*.pt"):
        if not (path.parent.parent / "metrics.json").is_file():
            found[path.parent.parent.name] = checkpoint_epoch(path)
    return found


def _trial(start, run_dir: Path, kill_at: float) -> tuple[dict, dict, dict]:
    """Start a run, SIGKILL it after kill_at seconds (or, with kill_at None, as soon as the
    baseline's epoch checkpoint has 2 epochs: in its 3rd), run the same command again to the end. A
    run that ended before its kill point (this machine was faster than the reference run) is tried
    again from scratch with an earlier one."""
    for _ in range(4):
        proc = start(run_dir)
        if kill_at is None:
            wait_for_checkpoint(proc, run_dir / "stages" / "1-baseline" / "resume" / "baseline.pt", 2)
        else:
            proc.join(kill_at)
        killed = proc.exitcode is None
        if killed:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
            break
        shutil.rmtree(run_dir)
        kill_at /= 2
    before, checkpoints = _finished_stages(run_dir), _epoch_checkpoints(run_dir)
    finish(start, run_dir)
    after = _finished_stages(run_dir)
    info = {"killed": killed, "kill_at": kill_at and round(kill_at, 2), "checkpoints": checkpoints}
    return info, before, after


@pytest.mark.slow  # a reference run and six killed ones (about a minute on 2 cores): test_resume kills in make test
def test_runs_killed_at_random_points_resume_to_a_complete_report(launcher, tmp_path, capsys):
    # The reference run, uninterrupted; while it runs, a second pipeline on its folder is refused.
    start = time.perf_counter()
    first = launcher(tmp_path / "reference")
    lock = tmp_path / "reference" / ".lock"
    while not (lock.is_file() and lock.read_text()):
        assert first.exitcode is None and time.perf_counter() - start < 120, "the pipeline never took its lock"
        time.sleep(0.05)
    capsys.readouterr()
    code = main(["compress", str(launcher.recipe), "--run-dir", str(tmp_path / "reference")])
    err = capsys.readouterr().err.strip()
    assert (
        code == 1
        and "is in use by another effvision run" in err
        and f"pid {first.pid}" in err
        and len(err.splitlines()) == 1
    ), err
    first.join(600)
    duration = time.perf_counter() - start
    assert first.exitcode == 0, (tmp_path / "reference.log").read_text()[-2000:]
    reference = assert_complete(tmp_path / "reference")

    # Kill points spread over the whole run (one per KILLS-th of its length, at random inside it),
    # two trials at a time; each rerun must finish, keeping what was finished before the kill.
    seed = int(os.environ.get("EFFVISION_KILL_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    points = [duration * (i + rng.random()) / KILLS for i in range(KILLS)]
    points.append(None)  # and one kill in the baseline's 3rd epoch, wherever that falls
    with ThreadPoolExecutor(2) as pool:
        trials = list(pool.map(lambda ik: _trial(launcher, tmp_path / f"kill{ik[0]}", ik[1]), enumerate(points)))
    for i, (info, before, after) in enumerate(trials):
        where = f"trial {i} (EFFVISION_KILL_SEED={seed}, killed at {info['kill_at']} s of a {duration:.1f} s run)"
        if info["kill_at"] is None:
            where = f"trial {i} (killed in the baseline's 3rd epoch)"
            assert info["checkpoints"] == {"1-baseline": 2}, f"{where}: {info['checkpoints']}"
        report = assert_complete(tmp_path / f"kill{i}")
        for stage, metrics in before.items():
            assert after.get(stage) == metrics, f"{where}: stage {stage}, finished before the kill, was lost or redone"
        for stage, epoch in info["checkpoints"].items():  # a stage killed inside an epoch went on from its checkpoint
            record = json.loads(after[stage])
            assert record.get("resumed_from_epoch", epoch) == epoch, f"{where}: {stage} did not resume epoch {epoch}"
        # The resumed run computes what an uninterrupted one does (same seed, one thread).
        got = [(s["name"], s["accuracy"], s["params"]) for s in report["stages"]]
        assert got == [(s["name"], s["accuracy"], s["params"]) for s in reference["stages"]], where
    kills = [info for info, _, _ in trials if info["killed"]]
    assert len(kills) == KILLS + 1, f"only {len(kills)} of {KILLS + 1} runs were still running at their kill point"
    inside = sum(bool(k["checkpoints"]) for k in kills)
    print(
        f"kill seed {seed}: kills at {[k['kill_at'] for k in kills]} s "
        f"of a {duration:.1f} s run, {inside} inside epochs"
    )
