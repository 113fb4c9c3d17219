"""The GPU plan, rehearsed on the CPU: the same entry points the GPU machine runs, in a Python that
imports like that machine's (tests/gpu_machine/sitecustomize.py hides what it lacks and the plan
does not carry), with a tiny model list: the run completes, every planned cell ends with a
status, SIGTERM and the budget leave a loadable results file, a broken library is recorded, the
output folder obeys the device's return limits, and the preflight names what is missing."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from effvision.gpu_plan import COMMANDS, GPU_MACHINE, WHEELS
from effvision.studies.deploy_suite import SUITES, run_suite
from effvision.studies.suite_cells import Clock, Predictor

REPO = Path(__file__).resolve().parents[1]
HIDER = Path(__file__).parent / "gpu_machine"
TINY = ["--model", "tiny=cifar_resnet8", "--model", "pruned=variant", "--batches", "1,2", "--input-size", "3,32,32"]
FINAL = {"measured", "failed", "skipped", "unavailable"}
SAFE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def gpu_machine_env(tmp_path, mode="wheels-from-venv", **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "PYTHONPATH")}
    env.update(
        EFFVISION_GPU_MACHINE=mode,
        EFFVISION_GPU_MACHINE_MODULES=str(tmp_path / "imported.txt"),
        PYTHONPATH=os.pathsep.join([str(HIDER), str(REPO)]),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        **extra,
    )
    return env


def plan(*args, env, timeout=300, cwd=REPO) -> subprocess.CompletedProcess:
    if args[0] in ("bench", "speed"):  # the wheels are this environment's own (cp312 ones would not install)
        args = (args[0], "--wheels", "/nonexistent", *args[1:])
    return subprocess.run(
        [sys.executable, "-m", "effvision.gpu_plan", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def assert_returnable(out: Path) -> None:
    """What the device machine brings back: at most 8 files, 16 MiB each, two folders down, plain names."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert 0 < len(files) <= 8, files
    for p in files:
        rel = p.relative_to(out)
        assert len(rel.parts) <= 3 and all(SAFE_NAME.match(part) for part in rel.parts), rel
        assert p.stat().st_size <= 16 << 20, (rel, p.stat().st_size)


def imported_modules(tmp_path) -> set[str]:
    """Top-level modules imported by any process of a rehearsal."""
    return {m for f in tmp_path.glob("imported.txt.*") for m in f.read_text().split()}


def wheel_modules() -> set[str]:
    """Import names of the distributions the plan carries as wheels."""
    from importlib import metadata

    carried = {d.lower() for d in WHEELS}
    return {
        m
        for m, dists in metadata.packages_distributions().items()
        if any(d.lower().replace("_", "-") in carried for d in dists)
    }


def test_rehearsal_runs_the_gpu_bench_to_a_complete_table(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    # torch.compile raises AttributeError, as a library built for another torch would
    env = gpu_machine_env(tmp_path, EFFVISION_GPU_MACHINE_FAULT="torch.compile:AttributeError")
    args = ["bench", "--device", "cpu", "--out", str(out), "--work", str(work), "--budget", "240", "--"]
    done = plan(*args, *TINY, "--repeats", "3", "--warmup", "1", env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"preflight bench: ok in 0\.\d\d s", done.stdout), done.stdout

    res = results(out)
    cells = res["results"]
    runs = SUITES["gpu"]["runs"]
    assert len(cells) == len(runs) * 2 * 2  # every planned cell, in the table
    assert {c["status"] for c in cells} <= FINAL and res["cells"]["pending"] == 0
    by = {(c["model"], c["backend"], c["precision"], c.get("compile_mode"), c["batch"]): c for c in cells}
    for model in ("tiny", "pruned"):
        for b in (1, 2):
            for precision in ("bf16", "fp32"):
                assert by[(model, "torch-eager", precision, None, b)]["status"] == "measured"
                assert by[(model, "torch-eager", precision, None, b)]["p50"] > 0
            compiled = by[(model, "torch-compile", "bf16", "reduce-overhead", b)]
            assert compiled["status"] == "failed" and compiled["reason"].startswith("AttributeError: torch.compile")
            assert by[(model, "torch-eager", "tf32", None, b)]["status"] == "unavailable"  # no TF32 on a CPU
            assert by[(model, "onnxruntime-cuda", "fp32", None, b)]["status"] == "unavailable"
    # the run went on after the first broken cell: each later compile cell, of either model and
    # of every later compile run, was tried and recorded on its own
    failed = [(c["model"], c["precision"], c["compile_mode"], c["batch"]) for c in cells if c["status"] == "failed"]
    assert len(failed) == 2 * 2 * 3 and cells[-1]["status"] == "unavailable", failed  # 3 compile runs on a CPU
    assert res["models"]["pruned"]["weights"].startswith("random init, pruned") and res["models"]["tiny"]["macs"] > 0
    assert "failed: AttributeError" in (out / "results.md").read_text()
    assert_returnable(out)
    # the imports the run made that the GPU machine lacks all travel as wheels, and the preflight checks them
    imported = imported_modules(tmp_path)
    carried = wheel_modules() & imported
    assert {"torch_pruning", "pydantic"} <= carried and carried <= set(COMMANDS["bench"].modules), carried


def test_rehearsal_sigterm_leaves_a_loadable_table(tmp_path):
    out = tmp_path / "out"
    env = gpu_machine_env(tmp_path)
    # slow cells (200 timed calls each, about 3 s), so the signal lands mid-run
    args = ["bench", "--wheels", "/nonexistent", "--device", "cpu", "--out", str(out), "--work", str(tmp_path / "w")]
    args += ["--"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "effvision.gpu_plan", *args, *TINY, "--repeats", "200", "--warmup", "1"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (out / "results.json").is_file() and results(out)["cells"]["measured"] >= 1:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    log = proc.communicate(timeout=60)[0]
    assert proc.returncode == 128 + signal.SIGTERM, log[-2000:]
    res = results(out)
    statuses = [c["status"] for c in res["results"]]
    assert set(statuses) <= FINAL and statuses.count("measured") >= 1, statuses
    assert res["stopped"]["reason"] == "interrupted by SIGTERM"
    stopped = [c for c in res["results"] if c.get("reason") == "interrupted by SIGTERM"]
    assert stopped and [c["status"] for c in stopped].count("failed") <= 1  # the cell in flight
    assert (out / "bench.png").is_file()
    assert_returnable(out)


def tiny_gpu_suite_on_cpu(tmp_path, budget_s: float, repeats: int) -> dict:
    """The gpu suite in this process, on the CPU, one tiny model at batch 1, results in tmp_path/out."""
    overrides = {"device": "cpu", "models": {"tiny": "cifar_resnet8"}, "batches": [1], "input_size": [3, 32, 32]}
    return run_suite(
        "gpu",
        tmp_path / "out",
        budget_s=budget_s,
        repeats=repeats,
        warmup=1,
        log=lambda m: None,
        overrides=overrides,
        work_dir=tmp_path / "work",
    )


def test_budget_end_stops_the_cell_in_flight_and_keeps_the_table(tmp_path):
    """The budget's end (SIGALRM at the deadline) stops the cell still running (200,000 timed
    calls, minutes, against a 3 s budget; 2,000 finished inside it once on an AVX-512 Xeon), skips
    the rest with the reason and keeps a complete table."""
    meta = tiny_gpu_suite_on_cpu(tmp_path, budget_s=3, repeats=200_000)
    res = results(tmp_path / "out")
    cells = [c for c in res["results"] if c["status"] != "unavailable"]
    assert meta["stopped"] == {"reason": "stopped at the time budget", "exit_code": 0} == res["stopped"]
    assert res["cells"]["pending"] == 0 and cells[0]["status"] == "failed", cells[0]
    assert cells[0]["reason"] == "stopped at the time budget"
    assert all(c["status"] == "skipped" and c["reason"] == "stopped at the time budget" for c in cells[1:])
    # ten times the budget: far under the minutes the cell would run unstopped, and room for a
    # loaded machine
    assert res["elapsed_s"] < 30 and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL


def test_suite_skips_cells_predicted_to_overrun(tmp_path, monkeypatch):
    """The prediction (unit-tested below) decides in the run: cells it says would overrun what is
    left are skipped with its figures, the others measured."""
    slow = {"torch-compile": 1e6}
    monkeypatch.setattr(Predictor, "predict", lambda self, cell: slow.get(cell["backend"]))
    meta = tiny_gpu_suite_on_cpu(tmp_path, budget_s=600, repeats=2)
    cells = results(tmp_path / "out")["results"]
    compiled = [c for c in cells if c["backend"] == "torch-compile" and c["status"] != "unavailable"]
    assert compiled and all(c["status"] == "skipped" for c in compiled)
    assert all(
        re.fullmatch(r"predicted 1000000 s \(from cells already timed\) > \d+ s left of 600 s", c["reason"])
        for c in compiled
    ), compiled[0]["reason"]
    assert meta["cells"]["measured"] == 2 and "stopped" not in meta  # eager bf16 and fp32


@pytest.mark.parametrize("hidden", ["torch_pruning", "pydantic", "timm"])
def test_preflight_stops_in_one_line_naming_the_missing_module(tmp_path, hidden):
    env = gpu_machine_env(tmp_path, EFFVISION_GPU_MACHINE_HIDE=hidden)
    out = tmp_path / "out"
    done = plan("bench", "--device", "cpu", "--out", str(out), "--", *TINY, env=env, timeout=120)
    assert done.returncode != 0 and not out.exists()  # stopped before any work
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effvision: preflight failed for bench: ")
    assert f"no module {hidden} " in lines[0], lines


def test_preflight_checks_data_and_gpu(tmp_path):
    env = gpu_machine_env(tmp_path)
    (tmp_path / "empty").mkdir()
    done = plan("preflight", "speed", "--device", "cpu", "--data", str(tmp_path / "empty"), env=env)
    assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1
    assert "no CIFAR-10 zips (or .xz) in " in done.stderr
    data = cifar_like_zips(tmp_path / "zips")
    done = plan("preflight", "speed", "--device", "cpu", "--data", str(data), env=env)
    assert done.returncode == 0 and "preflight speed: ok" in done.stdout, done.stderr
    if not Path("/dev/nvidia0").exists():
        done = plan("preflight", "bench", env=env)
        assert done.returncode != 0 and "no NVIDIA GPU" in done.stderr


def cifar_like_zips(folder: Path) -> Path:
    """Two zips in the cifar10 card's layout: 10 classes, 32 px JPEGs, 6 train and 2 test images each."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    classes = "airplane automobile bird cat deer dog frog horse ship truck".split()
    for split, n in (("train", 6), ("test", 2)):
        with zipfile.ZipFile(folder / f"cifar10-jpeg-{split}.zip", "w") as z:
            for c in classes:
                for i in range(n):
                    buf = io.BytesIO()
                    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, "JPEG")
                    z.writestr(f"{split}/{c}/{i:04d}.jpg", buf.getvalue())
    return folder


def test_rehearsal_runs_the_speed_command_from_packed_data(tmp_path):
    env = gpu_machine_env(tmp_path)
    plain = cifar_like_zips(tmp_path / "plain")
    packed = tmp_path / "packed"
    done = plan("pack-data", str(plain), str(packed), env=env)
    assert done.returncode == 0 and sorted(p.name for p in packed.iterdir()) == [
        "cifar10-jpeg-test.zip.xz",
        "cifar10-jpeg-train.zip.xz",
    ], done.stderr
    out = tmp_path / "out"
    args = ["speed", "--device", "cpu", "--data", str(packed), "--out", str(out), "--work", str(tmp_path / "work")]
    args += ["--seeds", "2", "--set", "stages.train.epochs=1", "--set", "stages.train.compile=false"]
    args += ["--set", "data.batch_size=20", "--set", "data.eval_batch_size=20"]
    done = plan(*args, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "time_to_accuracy.json").read_text())
    assert summary["seeds"] == 2 and summary["target_accuracy"] == 0.94 and len(summary["rows"]) == 2
    assert all(r["train_s"] > 0 and 0 <= r["accuracy"] <= 1 for r in summary["rows"])
    # unpacked byte for byte
    for z in ("cifar10-jpeg-train.zip", "cifar10-jpeg-test.zip"):
        assert (tmp_path / "work/data" / z).read_bytes() == (plain / z).read_bytes()
    assert_returnable(out)
    imported = imported_modules(tmp_path)  # the training process's too
    assert "typer" in imported and "pydantic" in imported
    assert wheel_modules() & imported <= set(COMMANDS["speed"].modules)


def test_predictor_and_clock_skip_a_cell_that_would_overrun():
    p, clock = Predictor(), Clock(budget_s=100)
    eager = {"model": "a", "backend": "torch-eager", "precision": "bf16", "batch": 1}
    compiled = {"model": "a", "backend": "torch-compile", "precision": "bf16", "compile_mode": "default", "batch": 1}
    assert p.predict(eager) is None and clock.would_overrun(None) is None
    p.record(eager, 2.0)
    assert p.predict(compiled) == 2.0  # nothing compiled yet: the slowest cell so far
    p.record(compiled, 70.0)
    other = {**compiled, "model": "b", "precision": "fp16", "batch": 256}
    assert p.predict(other) == 70.0 and p.predict({**eager, "model": "b"}) == 2.0
    clock.start -= 50  # 50 s gone, 50 left
    assert "predicted 70 s" in clock.would_overrun(70.0) and clock.would_overrun(2.0) is None
    clock.start -= 60
    assert "spent" in clock.would_overrun(None)


def test_the_plan_carries_what_the_gpu_machine_lacks():
    # what the preflight checks and is not on that machine travels as a pinned wheel, of the
    # version this project is tested with here
    from importlib import metadata

    for command in COMMANDS.values():
        for module, dist in command.modules.items():
            assert dist in GPU_MACHINE or dist in WHEELS, (module, dist)
    assert {d: metadata.version(d) for d in WHEELS} == WHEELS

    # each command's transfer fits the device's 64 MiB: the tree (tracked and untracked files that
    # git does not ignore) plus what it carries (measured when here, else BENCHMARKS.md's sizes)
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True)
    tree = sum((REPO / f).stat().st_size for f in listed.stdout.decode().split("\0") if f and (REPO / f).is_file())
    documented = {".whl": 2.8 * 2**20, ".data/cifar10-xz": 18.3 * 2**20}
    for name, command in COMMANDS.items():
        carried = 0
        for path in command.carry:
            files = [p for p in (REPO / path).rglob("*") if p.is_file()] if (REPO / path).is_dir() else []
            carried += sum(p.stat().st_size for p in files) if files else documented[path]
        assert tree + carried < 60 * 2**20, (name, tree, carried)  # 4 MiB to spare
    makefile = (REPO / "Makefile").read_text()
    assert "effvision.gpu_plan wheels" in makefile and "effvision.gpu_plan bench" in makefile


def test_carried_wheels_pass_the_preflight(tmp_path):
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if not wheels:
        pytest.skip("no .whl/ here: `make gpu-wheels` fetches them (then `make gpu-rehearse`)")
    names = {w.name.split("-")[0].lower().replace("_", "-"): w for w in wheels}
    assert sorted(names) == sorted(WHEELS), sorted(names)
    site = tmp_path / "site"
    for dist, wheel in names.items():
        _, version, *_, tag = wheel.stem.split("-")
        assert version == WHEELS[dist] and (tag == "any" or "x86_64" in tag), wheel.name
        assert wheel.stem.split("-")[-3] in ("py3", "cp312"), wheel.name  # the machine's Python 3.12
        with zipfile.ZipFile(wheel) as z:  # pip refuses cp312 wheels on another Python: unpack as pip would
            z.extractall(site)
    env = gpu_machine_env(tmp_path, mode="bare")
    env["PYTHONPATH"] = os.pathsep.join([str(HIDER), str(site), str(REPO)])
    # the compiled pydantic-core is for 3.12, so nothing is imported here: the modules are found in
    # the unpacked wheels and their requirements are met
    code = (
        "import sys, importlib.util; from effvision.gpu_plan import preflight, COMMANDS\n"
        "bad = {n: preflight(n, 'cpu', import_now=False, data=sys.argv[1]) for n in COMMANDS}\n"
        "print(bad)\n"
        "assert bad == {'bench': [], 'speed': []}, bad\n"
        "origin = importlib.util.find_spec('torch_pruning').origin\n"
        f"assert origin.startswith({str(site)!r}), origin\n"
    )
    data = cifar_like_zips(tmp_path / "data")
    done = subprocess.run([sys.executable, "-c", code, str(data)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_stop_while_the_table_is_written_waits_for_the_write(tmp_path):
    from effvision.interrupts import Interrupted, deferred_signals, interruptible

    with pytest.raises(Interrupted, match="SIGTERM"), interruptible():
        with deferred_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            (tmp_path / "written").write_text("whole")  # runs: the signal waits for the block's end
        pytest.fail("the held SIGTERM was not delivered after the block")
    assert (tmp_path / "written").read_text() == "whole"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored
