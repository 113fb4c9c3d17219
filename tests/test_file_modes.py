"""Files others can read: every file and folder a run writes, and an exported artifact, has the
mode the user's umask gives a new file (0666 & ~umask) or folder (0777 & ~umask) — as `touch`
and `mkdir` would — never the 0600 / 0700 of a private temporary file.

The runs are `effvision compress` and `effvision export` under umask 0022 and 0002 (forked_cli:
the umask is the child's own, this test process keeps its)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml
from conftest import INT8_ALWAYS, tiny_recipe
from forked_cli import forked_cli

from effvision.runtimes.executorch import executorch_missing

RECIPE = tiny_recipe(
    name="modes",
    stages=[
        {"name": "baseline", "type": "train", "epochs": 2, "optimizer": "adamw", "lr": 3e-3},
        {"type": "prune", "ratio": 0.5},
        {"type": "export"},
        {"type": "quantize", "calibration": {"n": 32}, **INT8_ALWAYS},
        {"type": "bench", "backends": ["onnxruntime-cpu"], "batches": [1], "warmup": 1, "repeats": 3},
    ],
)


@pytest.fixture(scope="module")
def cli():
    return forked_cli()


def _run(cli, argv: list, log: Path, umask: int) -> None:
    proc = cli(argv, log, umask)
    proc.join(600)
    assert proc.exitcode == 0, f"effvision {' '.join(map(str, argv))} failed:\n{log.read_text()[-2000:]}"


def _wrong_modes(root: Path, umask: int) -> list[str]:
    """Every path under root (root too) whose permission bits are not those the umask gives."""
    want = {True: 0o777 & ~umask, False: 0o666 & ~umask}
    wrong = []
    for path in [root, *sorted(root.rglob("*"))]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if mode != want[path.is_dir()]:
            wrong.append(f"{path.relative_to(root.parent)} {mode:04o} (want {want[path.is_dir()]:04o})")
    return wrong


# make bench: a whole run in a forked process under each umask, 40-50 s each
@pytest.mark.slow
@pytest.mark.parametrize("umask", [0o022, 0o002], ids=["umask-0022", "umask-0002"])
def test_a_run_folder_and_exported_files_have_the_umasks_modes(cli, tmp_path, umask):
    recipe = tmp_path / "modes.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    run_dir = tmp_path / "run"
    _run(cli, ["compress", recipe, "--run-dir", run_dir], tmp_path / "run.log", umask)
    written = {p.name for p in run_dir.rglob("*")}
    for name in ["report.json", "report.html", "report.md", "metrics.json", "model.pt", "model.onnx", ".lock"]:
        assert name in written, f"the run wrote no {name}: {sorted(written)}"
    assert not _wrong_modes(run_dir, umask), _wrong_modes(run_dir, umask)

    model = run_dir / "stages" / "2-prune" / "model.pt"
    exported = tmp_path / "exported"
    exported.mkdir(mode=0o777)  # (the test's own folder: its mode is not checked)
    outputs = [("onnx", "fp32", "model.onnx"), ("onnx", "int8", "model-int8.onnx")]
    if executorch_missing() is None:
        outputs.append(("executorch", "fp32", "model.pte"))
    for fmt, precision, name in outputs:
        argv = ["export", model, "--format", fmt, "--precision", precision, "--out", exported / name]
        _run(cli, argv, tmp_path / "export.log", umask)
    files = sorted(p.name for p in exported.iterdir())
    assert {name for _, _, name in outputs} <= set(files), files
    wrong = [w for p in exported.iterdir() for w in _wrong_modes(p, umask)]
    assert not wrong, wrong
