"""The runtimes a shipped file runs in (the RUNTIMES registry): the one table from a kind of file to
what writes it and what runs it. A runtime declares the key a stage's record gives its files
(`kind`), their suffix, the export format that writes them, the benchmark backend that runs them by
default (every backend whose `takes` is the suffix runs them), and how a file is opened as a
predictor and read for its input shape and precision. Export, bench, predict, evaluation, metadata,
a run's reference and its shipped file all read it; a new runtime is one entry here and its
backend in backends.py."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from ..errors import EffvisionError
from ..registry import BACKENDS, RUNTIMES
from . import backends as _backends  # noqa: F401  (the backends a runtime's files are run by register there)


class Runtime:
    name = ""  # its RUNTIMES name, which metadata and records call it by
    kind = ""  # the key of its files in a stage's artifacts (and in report.json's)
    suffix: str | None = None  # None: a torch model, not a file
    export_format: str | None = None  # the EXPORTERS entry that writes its files
    default_backend = ""
    describes = ""  # "an ONNX file", for messages
    label = ""  # "ONNX", as in "fp32 ONNX"
    rank = 0  # which file of one stage ships when it has several: the lowest rank
    fixed_batch = False  # a file runs the one batch size it was exported for (one file per batch)
    int8_tool = ""  # what makes its int8 files, as reports name it

    @property
    def takes(self) -> str:
        return self.suffix or "model"

    def backends(self) -> list[str]:
        """Every benchmark backend that runs this runtime's files, the default first."""
        others = [n for n in BACKENDS.names() if BACKENDS.get(n).takes == self.takes and n != self.default_backend]
        return [self.default_backend, *others]

    def backend_for(self, device: torch.device) -> str:
        """The backend a file is timed and scored on for `device`: the first of backends() that
        runs on that device and is installed here, else the default."""
        for name in self.backends():
            cls = BACKENDS.get(name)
            if device.type in cls.supports and not cls.missing():
                return name
        return self.default_backend

    def check_backend(self, name: str | None) -> str:
        """`name` (None: the default) when it runs this runtime's files; else one line naming those that do."""
        if name is None:
            return self.default_backend
        if name not in self.backends():
            BACKENDS.get(name)  # an unknown name is said as unknown first, with the names it is near
            raise EffvisionError(f"--backend {name} does not run {self.describes} (use {', '.join(self.backends())})")
        return name

    def predictor(self, path: str | Path, backend: str | None = None) -> Callable:
        """numpy batch -> numpy logits, running the file in this runtime."""
        raise NotImplementedError

    def input_shape(self, path: str | Path) -> list[int]:
        """The file's input shape, its batch dimension first (0 where the batch is dynamic)."""
        raise NotImplementedError

    def precision(self, path: str | Path, said: str | None = None) -> str:
        """The file's precision, read off the file where it says; `said`, its exporter's word, where not."""
        return said or "fp32"

    bundle_package: str | None = None  # the one package a bundle's predict.py runs its files with (None: no bundle)

    def files(self, path: str | Path) -> list[Path]:
        """The file and those it needs beside it (an IR's weights), as shipped."""
        return [Path(path)]

    def copy(self, src: str | Path, dst: str | Path) -> Path:
        """The file and those it needs beside it, copied under dst's name."""
        import shutil

        for a, b in zip(self.files(src), self.files(dst), strict=True):
            shutil.copyfile(a, b)
        return Path(dst)

    def file_bytes(self, path: str | Path) -> int:
        """What the file weighs as shipped (with the files it needs beside it)."""
        return sum(f.stat().st_size for f in self.files(path))

    keeps_metadata_inside = False  # else effvision's metadata is a JSON file beside it

    def read_metadata(self, path: str | Path, key: str) -> str | None:
        """The text stored under `key` inside the file (a runtime that keeps metadata inside)."""
        raise NotImplementedError

    def write_metadata(self, path: str | Path, key: str, text: str) -> bool:
        """Store `text` under `key` inside the file; False: this runtime's files cannot hold it."""
        return False


@RUNTIMES.register("onnxruntime")
class OnnxRuntimeFiles(Runtime):
    kind, suffix, export_format, default_backend = "onnx", ".onnx", "onnx", "onnxruntime-cpu"
    describes, label, bundle_package = "an ONNX file", "ONNX", "onnxruntime"
    int8_tool = "effvision's int8 search (ONNX Runtime QDQ)"

    def predictor(self, path, backend=None):
        from .runtime import ort_session, run_session

        cuda = self.check_backend(backend).endswith("cuda")
        session = ort_session(path, providers=["CUDAExecutionProvider"] if cuda else None)
        return lambda x: run_session(session, x)

    def input_shape(self, path):
        from .runtime import onnx_input_shape

        return [0, *onnx_input_shape(path)]

    keeps_metadata_inside = True  # the model's metadata_props

    def read_metadata(self, path, key):
        from .runtime import load_onnx

        return next((p.value for p in load_onnx(path, external=False).metadata_props if p.key == key), None)

    def write_metadata(self, path, key, text):
        import onnx

        from ..fileio import atomic_write

        model = onnx.load(str(path))
        kept = [p for p in model.metadata_props if p.key != key]
        del model.metadata_props[:]
        model.metadata_props.extend(kept)
        entry = model.metadata_props.add()
        entry.key, entry.value = key, text
        atomic_write(Path(path), lambda tmp: onnx.save(model, str(tmp)))
        return True

    def precision(self, path, said=None):
        from .runtime import onnx_precision

        return onnx_precision(path)


@RUNTIMES.register("executorch")
class ExecutorchPrograms(Runtime):
    kind, suffix, export_format, default_backend = "pte", ".pte", "executorch", "executorch"
    describes, label, rank, fixed_batch = "an ExecuTorch program", "ExecuTorch program", 1, True
    int8_tool = "PT2E with XNNPACK's quantizer"

    def predictor(self, path, backend=None):
        from .executorch_export import pte_predictor

        self.check_backend(backend)
        return pte_predictor(path)

    def input_shape(self, path):
        from .executorch_export import pte_input_shape

        return list(pte_input_shape(path))


@RUNTIMES.register("openvino")
class OpenvinoFiles(Runtime):
    kind, suffix, export_format, default_backend = "openvino", ".xml", "openvino", "openvino-cpu"
    describes, label, rank, bundle_package = "an OpenVINO IR (.xml)", "OpenVINO IR", 2, "openvino"
    int8_tool = "NNCF"
    keeps_metadata_inside = True  # the IR's rt_info

    def files(self, path):
        return [Path(path), Path(path).with_suffix(".bin")]

    def predictor(self, path, backend=None):
        from .openvino_export import ir_predictor

        self.check_backend(backend)
        return ir_predictor(path)

    def input_shape(self, path):
        from .openvino_export import ir_input_shape

        return ir_input_shape(path)

    def precision(self, path, said=None):
        from .openvino_export import ir_precision

        return ir_precision(path)

    def read_metadata(self, path, key):
        from .openvino_export import read_rt_info

        return read_rt_info(path, key)

    def write_metadata(self, path, key, text):
        from .openvino_export import write_rt_info

        write_rt_info(path, key, text)
        return True


@RUNTIMES.register("litert")
class LitertFiles(Runtime):
    kind, suffix, export_format, default_backend = "tflite", ".tflite", "litert", "litert-cpu"
    describes, label, rank, bundle_package = "a LiteRT file (.tflite)", "LiteRT", 3, "ai-edge-litert"
    int8_tool = "the LiteRT tools (ai-edge-quantizer)"
    keeps_metadata_inside = True  # the flatbuffer's metadata table

    def predictor(self, path, backend=None):
        from .litert_export import tflite_predictor

        self.check_backend(backend)
        return tflite_predictor(path)

    def input_shape(self, path):
        from .litert_export import tflite_input_shape

        return tflite_input_shape(path)

    def precision(self, path, said=None):
        from .litert_export import tflite_precision

        return tflite_precision(path)

    def read_metadata(self, path, key):
        from .litert_export import read_tflite_metadata

        return read_tflite_metadata(path, key)

    def write_metadata(self, path, key, text):
        from .litert_export import write_tflite_metadata

        write_tflite_metadata(path, key, text)
        return True


@RUNTIMES.register("torch")
class TorchModels(Runtime):
    kind, default_backend, describes, label, rank = "model", "torch-eager", "a torch model", "PyTorch model", 9

    def check_backend(self, name):
        if name not in (None, self.default_backend):  # torch-compile is timed, not a predictor
            raise EffvisionError(f"--backend {name} does not run {self.describes} (use {self.default_backend})")
        return self.default_backend


def runtime_named(name: str) -> Runtime:
    runtime = RUNTIMES.get(name)()
    runtime.name = name
    return runtime


def _all() -> list[Runtime]:
    return sorted((runtime_named(n) for n in RUNTIMES.names()), key=lambda r: r.rank)


def runtime_of_kind(kind: str) -> Runtime:
    found = next((r for r in _all() if r.kind == kind), None)
    if found is None:
        raise EffvisionError(f"no runtime runs artifacts of kind '{kind}' (kinds: {', '.join(artifact_kinds())})")
    return found


def runtime_taking(takes: str) -> Runtime:
    """The runtime of what a backend takes (a file suffix, or "model")."""
    return next(r for r in _all() if r.takes == takes)


def runtime_of_path(path: str | Path) -> Runtime:
    """The runtime of a file by its suffix; anything else is a torch model (a checkpoint or a card name)."""
    suffix = Path(str(path)).suffix
    return next((r for r in _all() if r.suffix and r.suffix == suffix), runtime_named("torch"))


def artifact_kinds() -> list[str]:
    """The kinds a stage's record gives its artifacts, files before models, in shipping order."""
    return [r.kind for r in _all()]


def file_runtimes() -> list[Runtime]:
    """The runtimes of files (not torch models), in shipping order."""
    return [r for r in _all() if r.suffix]


def file_kinds() -> set[str]:
    return {r.kind for r in file_runtimes()}


def shipped_artifact(artifacts: dict) -> tuple[str, str] | None:
    """(kind, path) of the artifact a stage's record ships: its exported file (the lowest rank), else its model."""
    return next(((k, artifacts[k]) for k in artifact_kinds() if k in artifacts), None)


def shipped_record(records: list[dict]) -> dict:
    """The record of what a run ships: the last stage that exported a file, else the last that made
    a model (its artifact: shipped_artifact of its artifacts)."""
    files = file_kinds()
    exported = (r for r in reversed(records) if files & set(r["artifacts"]))
    models = (r for r in reversed(records) if "model" in r["artifacts"])
    return next(exported, None) or next(models, records[-1])


def default_backend_of(target) -> str:
    """The backend that times `target` (a torch model, or a file named by its suffix)."""
    if isinstance(target, torch.nn.Module):
        return runtime_named("torch").default_backend
    runtime = runtime_of_path(target)
    if runtime.suffix is None:
        suffixes = ", ".join(r.suffix for r in _all() if r.suffix)
        raise EffvisionError(
            f"cannot benchmark {target}: expected a file ({suffixes}), an effvision checkpoint or a model name"
        )
    return runtime.default_backend
