"""`effvision` commands (cli.main) in processes forked from a server that imported torch and
effvision once: a run killed and started again costs seconds of start-up, not minutes. For the
tests that kill runs (test_crash_safety, test_resume, test_file_modes)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os

PRELOAD = [
    "torch",
    "timm",
    "torch_pruning",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "sklearn",
    "effvision.cli",
    "effvision.pipeline",
    "effvision.stages",
    "effvision.models",
    "effvision.data",
    "effvision.report",
]


def _cli(argv: list[str], log: str, umask: int | None) -> None:
    """Child process: the CLI as a user runs it, one thread (two runs share the two cores, and one
    thread computes the same bits every time), its stdout and stderr appended to log."""
    import torch

    from effvision.cli import main

    if umask is not None:
        os.umask(umask)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    torch.set_num_threads(1)
    os._exit(main(argv))


def forked_cli():
    """start(argv, log, umask=None) -> a started multiprocessing.Process running `effvision <argv>`."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()  # its imports happen now, outside any timed run

    def start(argv: list[str], log, umask: int | None = None):
        proc = ctx.Process(target=_cli, args=([str(a) for a in argv], str(log), umask))
        proc.start()
        return proc

    return start


def checkpoint_epoch(path) -> int | None:
    """The epochs finished in the epoch checkpoint at path (None: none there yet)."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)["epoch"]
    except FileNotFoundError:
        return None


def wait_for_checkpoint(proc, path, epoch: int, timeout_s: float = 300.0) -> None:
    """Return as soon as the checkpoint at path has `epoch` epochs finished (the run is then in its
    next epoch); fails if the run ends first or it takes longer than timeout_s."""
    import time

    deadline = time.monotonic() + timeout_s
    while (checkpoint_epoch(path) or 0) < epoch:
        alive = proc.poll() is None if hasattr(proc, "poll") else proc.is_alive()  # a Popen or a Process
        assert alive, f"the run ended before {path} had epoch {epoch}"
        assert time.monotonic() < deadline, f"no checkpoint of epoch {epoch} at {path} after {timeout_s} s"
        time.sleep(0.01)


def log_of(run_dir) -> str:
    """Where a run's stdout and stderr go: beside its folder."""
    return str(run_dir) + ".log"


def recipe_runs(tmp_path_factory, recipe: dict):
    """start(run_dir) -> a started `effvision compress <recipe> --run-dir run_dir` (log: log_of);
    start.recipe is the recipe's file."""
    import yaml

    cli = forked_cli()
    path = tmp_path_factory.mktemp("recipe") / f"{recipe['name']}.yaml"
    path.write_text(yaml.safe_dump(recipe))

    def start(run_dir):
        return cli(["compress", path, "--run-dir", run_dir], log_of(run_dir))

    start.recipe = path
    return start


def finish(start, run_dir) -> None:
    """Run start(run_dir) to its end; it must succeed."""
    from pathlib import Path

    proc = start(run_dir)
    proc.join(600)
    log = Path(log_of(run_dir)).read_text()
    assert proc.exitcode == 0, f"run in {run_dir} failed (exit {proc.exitcode}):\n{log[-2000:]}"
