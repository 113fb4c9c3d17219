"""The runtime registry: one table from a kind of file to what writes it and what runs it, read by
export, bench, predict, evaluation, metadata, a run's reference and its shipped file."""

import pytest
import torch
from conftest import needs_openvino

from effvision import runtimes
from effvision.deploy.bench import default_backend
from effvision.errors import EffvisionError
from effvision.registry import BACKENDS, RUNTIMES


def test_every_backend_runs_the_files_of_one_runtime_and_is_listed_there():
    """A backend no runtime lists would be skipped by the bench stage without a word."""
    for name in BACKENDS.names():
        runtime = runtimes.runtime_of_backend(name)
        assert BACKENDS.get(name).takes == runtime.takes, (name, runtime.name)
        assert BACKENDS.get(name).supports == runtimes.target_of(name).supports
    for name in RUNTIMES.names():
        runtime = runtimes.runtime_named(name)
        assert runtime.backends()[0] == runtime.default_backend
        assert BACKENDS.get(runtime.default_backend).takes == runtime.takes


def test_a_file_is_run_by_its_suffix_and_anything_else_is_a_torch_model():
    assert runtimes.runtime_of_path("m.onnx").name == "onnxruntime"
    assert runtimes.runtime_of_path("m.pte").name == "executorch"
    assert runtimes.runtime_of_path("runs/x/model.pt").name == "torch"
    assert runtimes.runtime_of_path("tf_efficientnet_lite0.cifar10").kind == "model"
    assert runtimes.runtime_of_kind("onnx").backend_for("cpu") == "onnxruntime-cpu"
    with pytest.raises(EffvisionError, match="does not run an ONNX file.*onnxruntime-cpu"):
        runtimes.runtime_of_path("m.onnx").check_backend("executorch")
    with pytest.raises(EffvisionError, match="expected a file"):
        default_backend("model.pt")


def test_the_shipped_file_is_the_last_exported_one_else_the_last_model():
    records = [
        {"name": "prune", "artifacts": {"model": "p.pt"}},
        {"name": "export", "artifacts": {"onnx": "m.onnx", "pte": "m.pte"}},
        {"name": "distill", "artifacts": {"model": "d.pt"}},
    ]
    shipped = runtimes.shipped_record(records)
    assert shipped["name"] == "export"
    assert runtimes.shipped_artifact(shipped["artifacts"]) == ("onnx", "m.onnx")
    assert runtimes.shipped_record(records[:1])["name"] == "prune"
    assert runtimes.shipped_artifact({"model": "d.pt"}) == ("model", "d.pt")


class _FakeRuntime(runtimes.Runtime):
    kind, suffix, format, describes, label, rank = "fake", ".fake", None, "a fake file", "fake file", 0
    batch_rule = "fixed"
    targets = (runtimes.Target("fake-cpu", {"cpu": ("fp32",)}),)


@pytest.fixture
def fake_runtime(monkeypatch):
    """A runtime added as one entry, as a new runtime is."""
    monkeypatch.setitem(RUNTIMES._entries, "fake", _FakeRuntime)
    monkeypatch.setattr(runtimes, "_made", {})


def test_a_new_runtime_is_one_entry_that_every_reader_sees(fake_runtime):
    assert runtimes.runtime_of_path("m.fake").name == "fake"
    assert default_backend("m.fake") == "fake-cpu"
    assert runtimes.runtime_of_backend("fake-cpu").name == "fake"
    assert "fake" in runtimes.artifact_kinds() and "fake" in runtimes.file_kinds()
    records = [{"name": "export", "artifacts": {"fake": "m.fake"}}, {"name": "distill", "artifacts": {"model": "d.pt"}}]
    assert runtimes.shipped_record(records)["name"] == "export"
    fake = runtimes.runtime_named("fake")
    assert fake.batch_groups([1, 8]) == [(1,), (8,)] and fake.file_name("fp32", 8) == "model.fp32.b8.fake"
    assert runtimes.runtime_named("onnxruntime").batch_groups([1, 8]) == [(1, 8)]


def test_latency_tables_are_keyed_by_the_version_of_what_runs_the_backend(monkeypatch):
    """Tables timed under one onnxruntime (or ExecuTorch) are not reused under another."""
    from effvision.compression.latency import machine_key

    cpu = torch.device("cpu")
    OnnxRuntime, Executorch = BACKENDS.get("onnxruntime-cpu"), BACKENDS.get("executorch")
    ort, pte = machine_key("onnxruntime-cpu", 1, cpu), machine_key("executorch", 1, cpu)
    monkeypatch.setattr(OnnxRuntime, "versions", classmethod(lambda cls: ["0.0.1"]))
    assert machine_key("onnxruntime-cpu", 1, cpu) != ort
    assert machine_key("executorch", 1, cpu) == pte
    monkeypatch.setattr(Executorch, "versions", classmethod(lambda cls: ["0.0.1"]))
    assert machine_key("executorch", 1, cpu) != pte


@pytest.mark.parametrize(
    "other",
    [
        pytest.param("openvino", marks=needs_openvino),  # IRs run any batch: one file per precision
        # ExecuTorch's programs run the batch they were exported for: four exports of about 10 s each
        pytest.param("executorch", marks=pytest.mark.slow),
    ],
)
def test_bench_runtimes_times_every_file_side_by_side_with_its_parity_and_top1(tmp_path, other):
    """bench --runtimes: each runtime's file in each precision, verified and scored on digits, timed
    interleaved per batch against ONNX Runtime's fp32 file (in a child process: the other runtimes'
    native libraries stay out of the suite's process)."""
    import json
    import subprocess
    import sys

    from effvision.runtimes.executorch import executorch_missing

    if other == "executorch" and executorch_missing():
        pytest.skip(executorch_missing())
    names = f"onnxruntime,{other}"
    out = tmp_path / "cmp.json"
    cmd = [sys.executable, "-m", "effvision.cli", "bench", "cifar_resnet8", "--runtimes", names, "--data", "digits"]
    cmd += ["--batch", "1,2", "--repeats", "4", "--rounds", "2", "--warmup", "1", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(out.read_text())
    files = {f["target"]: f for f in found["files"]}
    assert {"onnxruntime fp32", "onnxruntime int8"} <= set(files)
    if other == "executorch":  # a .pte runs the batch it was exported for: one file per batch
        assert {"executorch fp32 b1", "executorch fp32 b2", "executorch int8 b1"} <= set(files)
    else:
        assert {"openvino fp32", "openvino int8"} <= set(files) and files["openvino fp32"]["relative_diff"] < 1e-4
    assert files["onnxruntime fp32"]["relative_diff"] < 1e-4 and 0 <= files["onnxruntime int8"]["top1"] <= 1
    rows = {(r["target"], r["batch"]): r for r in found["results"]}
    for b in (1, 2):
        assert rows[("onnxruntime fp32", b)]["speedup_vs_onnxruntime_fp32"] == 1.0
        here = [t for t in files if not t.split()[-1].startswith("b") or t.split()[-1] == f"b{b}"]
        assert {t for t, batch in rows if batch == b} == set(here)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["cifar_resnet8", "--runtimes", "openvno"], "unknown runtime 'openvno'; did you mean 'openvino'"),
        (["cifar_resnet8", "--runtimes", "executorch"], "against ONNX Runtime's fp32 file"),
        (["m.onnx", "--runtimes", "all"], "give a checkpoint or a model name"),
    ],
)
def test_bench_runtimes_bad_input_is_one_line(args, fragment, capsys):
    from effvision.cli import main

    assert main(["bench", *args]) == 1
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], lines
