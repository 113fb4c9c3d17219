"""The runtime registry: one table from a kind of file to what writes it and what runs it, read by
export, bench, predict, evaluation, metadata, a run's reference and its shipped file."""

import pytest
import torch

from effvision.deploy import runtimes
from effvision.deploy.backends import Backend
from effvision.errors import EffvisionError
from effvision.registry import BACKENDS, RUNTIMES


def test_every_backend_runs_the_files_of_one_runtime_and_is_listed_there():
    """A backend no runtime lists would be skipped by the bench stage without a word."""
    for name in BACKENDS.names():
        runtime = runtimes.runtime_taking(BACKENDS.get(name).takes)
        assert name in runtime.backends(), (name, runtime.name)
    for name in RUNTIMES.names():
        runtime = runtimes.runtime_named(name)
        assert runtime.backends()[0] == runtime.default_backend
        assert BACKENDS.get(runtime.default_backend).takes == runtime.takes


def test_a_file_is_run_by_its_suffix_and_anything_else_is_a_torch_model():
    assert runtimes.runtime_of_path("m.onnx").name == "onnxruntime"
    assert runtimes.runtime_of_path("m.pte").name == "executorch"
    assert runtimes.runtime_of_path("runs/x/model.pt").name == "torch"
    assert runtimes.runtime_of_path("tf_efficientnet_lite0.cifar10").kind == "model"
    assert runtimes.runtime_of_kind("onnx").backend_for(torch.device("cpu")) == "onnxruntime-cpu"
    with pytest.raises(EffvisionError, match="does not run an ONNX file.*onnxruntime-cpu"):
        runtimes.runtime_of_path("m.onnx").check_backend("executorch")
    with pytest.raises(EffvisionError, match="expected a file"):
        runtimes.default_backend_of("model.pt")


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


class _FakeBackend(Backend):
    takes = ".fake"
    supports = {"cpu": ("fp32",)}


class _FakeRuntime(runtimes.Runtime):
    kind, suffix, export_format, default_backend = "fake", ".fake", None, "fake-cpu"
    describes, label, rank = "a fake file", "fake file", 0


@pytest.fixture
def fake_runtime(monkeypatch):
    """A runtime and its backend added as one entry each, as a new runtime is."""
    monkeypatch.setitem(BACKENDS._entries, "fake-cpu", _FakeBackend)
    monkeypatch.setitem(RUNTIMES._entries, "fake", _FakeRuntime)


def test_a_new_runtime_is_one_entry_that_every_reader_sees(fake_runtime):
    assert runtimes.runtime_of_path("m.fake").name == "fake"
    assert runtimes.default_backend_of("m.fake") == "fake-cpu"
    assert "fake" in runtimes.artifact_kinds() and "fake" in runtimes.file_kinds()
    records = [{"name": "export", "artifacts": {"fake": "m.fake"}}, {"name": "distill", "artifacts": {"model": "d.pt"}}]
    assert runtimes.shipped_record(records)["name"] == "export"
    from effvision.deploy.bench import batch_groups

    assert batch_groups(".fake", [1, 8]) == [(1, 8)]


def test_latency_tables_are_keyed_by_the_version_of_what_runs_the_backend(monkeypatch):
    """Tables timed under one onnxruntime (or ExecuTorch) are not reused under another."""
    from effvision.compression.latency import machine_key
    from effvision.deploy.backends import Executorch, OnnxRuntime

    cpu = torch.device("cpu")
    ort, pte = machine_key("onnxruntime-cpu", 1, cpu), machine_key("executorch", 1, cpu)
    monkeypatch.setattr(OnnxRuntime, "versions", classmethod(lambda cls: ["0.0.1"]))
    assert machine_key("onnxruntime-cpu", 1, cpu) != ort
    assert machine_key("executorch", 1, cpu) == pte
    monkeypatch.setattr(Executorch, "versions", classmethod(lambda cls: ["0.0.1"]))
    assert machine_key("executorch", 1, cpu) != pte
