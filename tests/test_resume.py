"""Resume inside a training stage: a run killed (SIGKILL), interrupted (SIGINT) or stopped
(SIGTERM) in the middle of a training or distillation stage continues from its last epoch
checkpoint and ends with the weights, history and figures of a run that was never stopped — bit
for bit (same seed, same machine, one thread). The history's `train_s` (training seconds so far)
is the one figure that differs: it is timed.

The runs are `effvision compress` itself (forked_cli); the two-process run is `effvision train
--nproc 2` under torchrun, killed as a process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_recipe
from forked_cli import checkpoint_epoch, finish, log_of, recipe_runs, wait_for_checkpoint

from effvision import pipeline
from effvision.cli import main
from effvision.data import load_dataset
from effvision.interrupts import Interrupted
from effvision.models import create_model
from effvision.recipe import DataConfig
from effvision.train import TrainSettings, fit
from effvision.train import checkpoint as ckpt

CPU = torch.device("cpu")

EPOCHS = 5
RECIPE = tiny_recipe(
    name="resume",
    stages=[
        # EMA, label smoothing and a target: every piece of the loop's state has to come back
        # (seed 0 reaches 0.15 in epoch 4, after the kills below). The per-sample DataLoader: its
        # shuffling and augmentations draw on the random states the checkpoint restores (the
        # batched path, distillation's below, draws from (seed, epoch) alone)
        {
            "name": "baseline",
            "type": "train",
            "epochs": EPOCHS,
            "optimizer": "adamw",
            "lr": 3e-3,
            "ema": True,
            "ema_decay": 0.9,
            "label_smoothing": 0.1,
            "target_accuracy": 0.15,
            "tensor_data": False,
        },
        {"type": "prune", "ratio": 0.5},
        # feature distillation: its 1x1 adapters train too, and are in the checkpoint
        {"type": "distill", "epochs": EPOCHS, "optimizer": "adamw", "lr": 3e-3, "features": {"method": "fitnet"}},
    ],
)
STAGES = {"baseline": "1-baseline", "prune": "2-prune", "distill": "3-distill"}
TIMED = "train_s"  # the one history field that is a measurement


@pytest.fixture(scope="module")
def digits():
    return load_dataset(DataConfig(name="digits", max_train_samples=200, max_val_samples=60, batch_size=32))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """start(run_dir) -> the running `effvision compress` of RECIPE into run_dir; .recipe its file."""
    return recipe_runs(tmp_path_factory, RECIPE)


@pytest.fixture(scope="module")
def reference(runs, tmp_path_factory):
    """The run never stopped."""
    run_dir = tmp_path_factory.mktemp("reference") / "run"
    finish(runs, run_dir)
    return run_dir


def _checkpoint(run_dir: Path, stage: str) -> Path:
    return run_dir / "stages" / STAGES[stage] / ckpt.RESUME_DIR / f"{stage}.pt"


def _metrics(run_dir: Path, stage: str) -> dict:
    return json.loads((run_dir / "stages" / STAGES[stage] / "metrics.json").read_text())


def _untimed(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k != TIMED} for h in history]


def assert_same_as(reference: Path, run_dir: Path, resumed: dict[str, int]) -> None:
    """run_dir ended as the reference did: every stage's weights bit for bit, its history but for
    the timing, its accuracy; the stages in `resumed` went on from that many epochs; no epoch
    checkpoint is left."""
    for stage, sdir in STAGES.items():
        want = torch.load(reference / "stages" / sdir / "model.pt", map_location="cpu", weights_only=False)
        got = torch.load(run_dir / "stages" / sdir / "model.pt", map_location="cpu", weights_only=False)
        want, got = want["state_dict"], got["state_dict"]
        assert want.keys() == got.keys(), stage
        differ = [k for k in want if not torch.equal(want[k], got[k])]
        assert not differ, (
            f"{stage}: {len(differ)} of {len(want)} tensors differ from the uninterrupted run, {differ[:3]}"
        )
        m_ref, m = _metrics(reference, stage), _metrics(run_dir, stage)
        assert m["accuracy"] == m_ref["accuracy"], stage
        if stage == "prune":
            continue
        assert _untimed(m["history"]) == _untimed(m_ref["history"]), f"{stage}: history differs"
        assert m["resumed_from_epoch"] == resumed.get(stage), stage
        assert m_ref["resumed_from_epoch"] is None
        assert m["epochs_to_accuracy"] == m_ref["epochs_to_accuracy"], stage
        seconds = [h[TIMED] for h in m["history"]]
        assert seconds == sorted(seconds), f"{stage}: training seconds went back at the resume: {seconds}"
        if m["epochs_to_accuracy"] is not None:  # time-to-accuracy: training seconds across the interruption
            assert m["time_to_accuracy_s"] == m["history"][int(m["epochs_to_accuracy"]) - 1][TIMED]
    assert not list(run_dir.glob("stages/*/resume")), "a completed stage kept its epoch checkpoints"
    assert not list(run_dir.rglob("*.tmp")), "a temporary file was left behind"


def _kill_in_epoch_3(proc, path: Path, sig=signal.SIGKILL) -> int:
    """Send sig as soon as the checkpoint at path has 2 epochs (the run is then in its 3rd); the
    epochs the checkpoint holds once the run has ended."""
    wait_for_checkpoint(proc, path, 2)
    os.kill(proc.pid, sig)
    proc.join(120)
    assert proc.exitcode is not None, "the run did not end"
    epoch = checkpoint_epoch(path)
    assert epoch is not None and 2 <= epoch < EPOCHS, epoch
    return epoch


def test_a_run_killed_inside_training_and_inside_distillation_ends_as_if_never_stopped(runs, reference, tmp_path):
    run_dir = tmp_path / "killed"
    proc = runs(run_dir)
    in_baseline = _kill_in_epoch_3(proc, _checkpoint(run_dir, "baseline"))
    assert proc.exitcode == -signal.SIGKILL
    kept = torch.load(_checkpoint(run_dir, "baseline"), map_location="cpu", weights_only=True)["result"]["history"]

    proc = runs(run_dir)  # goes on in the baseline's epoch in_baseline + 1, then is killed in distillation
    in_distill = _kill_in_epoch_3(proc, _checkpoint(run_dir, "distill"))
    assert (run_dir / "stages" / "2-prune" / "metrics.json").is_file()
    finish(runs, run_dir)

    assert_same_as(reference, run_dir, {"baseline": in_baseline, "distill": in_distill})
    # the epochs before the kill were not trained again: their timings are the checkpoint's
    assert _metrics(run_dir, "baseline")["history"][: len(kept)] == kept


@pytest.mark.parametrize("sig,code,stage", [(signal.SIGTERM, 143, "baseline"), (signal.SIGINT, 130, "distill")])
def test_sigterm_and_sigint_say_what_was_kept_and_the_run_continues(runs, reference, tmp_path, sig, code, stage):
    run_dir = tmp_path / "stopped"
    proc = runs(run_dir)
    epoch = _kill_in_epoch_3(proc, _checkpoint(run_dir, stage), sig)
    assert proc.exitcode == code
    done = list(STAGES).index(stage)
    line = (
        f"effvision: interrupted by {sig.name}; {run_dir} keeps {done} completed stage{'s' if done != 1 else ''} "
        f"and {stage} at epoch {epoch}/{EPOCHS}; "
        f"continue with: effvision compress {runs.recipe} --run-dir {run_dir}"
    )
    lines = Path(log_of(run_dir)).read_text().splitlines()
    assert lines[-1] == line, lines[-5:]
    assert "Traceback" not in "\n".join(lines)
    assert not list(run_dir.rglob("*.tmp")), "the interrupt left a temporary file"
    finish(runs, run_dir)
    assert_same_as(reference, run_dir, {stage: epoch})


def test_checkpoint_every_sets_which_epochs_are_saved(tmp_path, monkeypatch):
    """Every `checkpoint_every` epochs and after the last; 0: none at all."""
    saved = []
    real_save = ckpt.save

    def save(checkpoint, state, loader):
        saved.append((checkpoint.path.name, state["epoch"]))
        return real_save(checkpoint, state, loader)

    monkeypatch.setattr(ckpt, "save", save)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "stages": RECIPE["stages"][:1]}))
    for every, want in [(2, [2, 4, 5]), (0, []), (1, [1, 2, 3, 4, 5])]:
        saved.clear()
        sets = ["--set", f"stages.baseline.checkpoint_every={every}"]
        assert main(["train", str(recipe), *sets, "--run-dir", str(tmp_path / f"every{every}")]) == 0
        assert saved == [("baseline.pt", e) for e in want], (every, saved)
        metrics = _metrics(tmp_path / f"every{every}", "baseline")
        assert (metrics["checkpoint_s"] > 0) == bool(want), metrics["checkpoint_s"]


def test_a_checkpoint_of_another_model_or_damaged_is_set_aside(tmp_path, monkeypatch, digits):
    """Its epochs are lost, never the run: the training starts afresh and says why."""
    said = []
    monkeypatch.setattr(ckpt, "log", said.append)
    path = tmp_path / "resume" / "train.pt"
    settings = TrainSettings(epochs=1, optimizer="adamw", lr=3e-3)
    fit(create_model("cifar_resnet8", width=0.25), digits, settings, CPU, checkpoint=ckpt.EpochCheckpoint(path))
    assert checkpoint_epoch(path) == 1
    for why, spoil in [
        ("it is of a model of other layers or widths", lambda: None),
        ("unreadable", lambda: path.write_bytes(path.read_bytes()[:100])),
    ]:
        spoil()
        said.clear()
        res = fit(
            create_model("cifar_resnet8", width=0.5), digits, settings, CPU, checkpoint=ckpt.EpochCheckpoint(path)
        )
        assert res.resumed_from_epoch is None and len(res.history) == 1
        assert len(said) == 1 and why in said[0] and "training afresh" in said[0], said
        fit(create_model("cifar_resnet8", width=0.25), digits, settings, CPU, checkpoint=ckpt.EpochCheckpoint(path))


def _training_only_recipe(tmp_path: Path) -> Path:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "stages": RECIPE["stages"][:1]}))
    return recipe


def _stopped_after_epoch_2(run: list[str], monkeypatch) -> None:
    """`effvision <run>` stopped (as by SIGTERM) right after its epoch-2 checkpoint is written."""
    real_save = ckpt.save

    def save_then_stop(checkpoint, state, loader):
        took = real_save(checkpoint, state, loader)
        if state["epoch"] == 2:
            raise Interrupted("interrupted by SIGTERM", 143)
        return took

    monkeypatch.setattr(ckpt, "save", save_then_stop)
    assert main(run) == 143
    monkeypatch.setattr(ckpt, "save", real_save)


def test_checkpoints_of_other_inputs_are_not_resumed(tmp_path, monkeypatch):
    """A stage stopped with an epoch checkpoint, then run again: it goes on from the checkpoint with
    the same recipe, and trains afresh once the stage's inputs changed (here its learning rate)."""
    recipe = _training_only_recipe(tmp_path)
    for name, sets, resumed in [("same", [], 2), ("changed", ["--set", "stages.baseline.lr=0.002"], None)]:
        run = ["train", str(recipe), "--run-dir", str(tmp_path / name)]
        _stopped_after_epoch_2(run, monkeypatch)
        assert main([*run, *sets]) == 0
        assert _metrics(tmp_path / name, "baseline")["resumed_from_epoch"] == resumed, name


def test_a_rerun_that_cannot_load_its_data_keeps_the_finished_work(tmp_path, monkeypatch, capsys):
    """A run folder stopped inside training, run again with inputs that cannot load (here a
    hold-out larger than the training split): one line, and the checkpoint is still there, so the
    original recipe goes on from it (the changed inputs were never loaded over the old work)."""
    recipe = _training_only_recipe(tmp_path)
    run = ["train", str(recipe), "--run-dir", str(tmp_path / "run")]
    _stopped_after_epoch_2(run, monkeypatch)
    capsys.readouterr()
    assert main([*run, "--set", "data.holdout=100000"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.holdout" in err[0], err
    assert main(run) == 0
    assert _metrics(tmp_path / "run", "baseline")["resumed_from_epoch"] == 2
    said = []
    monkeypatch.setattr(pipeline, "log", said.append)
    assert main([*run, "--set", "data.max_val_samples=100"]) == 0  # loads: the old stages are set aside
    assert any("data.max_val_samples changed since this run folder was written" in s for s in said), said


def _torchrun(recipe: Path, run_dir: Path, scratch: Path) -> subprocess.Popen:
    """`effvision train --nproc 2` in a session of its own (its whole process group can be killed)."""
    env = {**os.environ, "EFFVISION_QUIET": "1", "TMPDIR": str(scratch)}
    cmd = [sys.executable, "-m", "effvision.cli", "train", str(recipe), "--nproc", "2", "--run-dir", str(run_dir)]
    log = open(log_of(run_dir), "a")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _descendants(pid: int) -> list[int]:
    """Every process below pid (torchrun's ranks run in sessions of their own, below it still)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPU cores for 2 processes")
@pytest.mark.slow  # 70 s; make test kills one process inside training and distillation (above)
def test_two_processes_killed_inside_training_end_as_if_never_stopped(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({**RECIPE, "stages": RECIPE["stages"][:1]}))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    ref = tmp_path / "reference"
    assert _torchrun(recipe, ref, scratch).wait(600) == 0, Path(log_of(ref)).read_text()[-2000:]

    run_dir = tmp_path / "killed"
    proc = _torchrun(recipe, run_dir, scratch)
    path = _checkpoint(run_dir, "baseline")
    try:
        wait_for_checkpoint(proc, path, 2)
        job = _descendants(proc.pid)
        assert len(job) >= 3, f"expected torchrun and two ranks below {proc.pid}, found {job}"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the job's process group, as a scheduler's kill does
    proc.wait(120)
    deadline = time.monotonic() + 60
    while any(_running(p) for p in job):  # the ranks end with torchrun
        assert time.monotonic() < deadline, f"ranks still running after torchrun was killed: {job}"
        time.sleep(0.05)
    assert not (run_dir / "stages" / "1-baseline" / "metrics.json").is_file(), "the ranks trained on after the kill"
    epoch = checkpoint_epoch(path)
    assert 2 <= epoch < EPOCHS
    assert torch.load(path, map_location="cpu", weights_only=True)["processes"] == 2
    assert _torchrun(recipe, run_dir, scratch).wait(600) == 0, Path(log_of(run_dir)).read_text()[-2000:]

    want = torch.load(ref / "stages" / "1-baseline" / "model.pt", map_location="cpu", weights_only=False)["state_dict"]
    got = torch.load(run_dir / "stages" / "1-baseline" / "model.pt", map_location="cpu", weights_only=False)
    assert want.keys() == got["state_dict"].keys() and all(
        torch.equal(want[k], v) for k, v in got["state_dict"].items()
    )
    m_ref, m = _metrics(ref, "baseline"), _metrics(run_dir, "baseline")
    assert m["processes"] == 2 and m["max_param_difference_across_ranks"] == 0.0
    assert _untimed(m["history"]) == _untimed(m_ref["history"]) and m["accuracy"] == m_ref["accuracy"]
    assert m["resumed_from_epoch"] == epoch
    assert not list(run_dir.glob("stages/*/resume"))
