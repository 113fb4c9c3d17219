"""The one table of runtimes (RUNTIMES): ONNX Runtime, ExecuTorch, OpenVINO, LiteRT and torch, one
object each (base.Runtime), and the look-ups every caller uses: by name, by the kind a stage's
record gives its files, by a file's suffix, by export format, by benchmark backend. A new runtime
is one module here that registers its class; nothing else maps suffixes or backends to runtimes."""

from __future__ import annotations

from pathlib import Path

from ..errors import EffvisionError
from ..registry import RUNTIMES, UnknownNameError, suggest
from . import executorch, litert, onnxruntime, openvino, torch_models  # noqa: F401  (register RUNTIMES)
from .base import Runtime, RuntimeUnavailable, Session, Target

_made: dict[str, Runtime] = {}
STANDALONE_PREDICT = Path(__file__).with_name("standalone_predict.py")  # a bundle's predict.py (no torch)


def runtime_named(name: str) -> Runtime:
    if name not in _made:
        runtime = RUNTIMES.get(name)()
        runtime.name = name
        _made[name] = runtime
    return _made[name]


def all_runtimes() -> list[Runtime]:
    """Every runtime, in shipping order (the file that ships first: ONNX, then the others, torch last)."""
    return sorted((runtime_named(n) for n in RUNTIMES.names()), key=lambda r: r.rank)


def file_runtimes() -> list[Runtime]:
    """The runtimes of files (not torch models), in shipping order."""
    return [r for r in all_runtimes() if r.suffix]


def runtime_of_kind(kind: str) -> Runtime:
    found = next((r for r in all_runtimes() if r.kind == kind), None)
    if found is None:
        raise EffvisionError(f"no runtime runs artifacts of kind '{kind}' (kinds: {', '.join(artifact_kinds())})")
    return found


def runtime_of_path(path: str | Path) -> Runtime:
    """The runtime of a file by its suffix; anything else is a torch model (a checkpoint or a card name)."""
    suffix = Path(str(path)).suffix
    return next((r for r in file_runtimes() if r.suffix == suffix), runtime_named("torch"))


def runtime_of_format(fmt: str) -> Runtime:
    """The runtime an export format writes (effvision export --format)."""
    found = next((r for r in file_runtimes() if r.format == fmt), None)
    if found is None:
        raise UnknownNameError(suggest(fmt, export_formats(), "export format"))
    return found


def runtime_of_backend(backend: str) -> Runtime:
    """The runtime whose files (or models) a benchmark backend runs."""
    found = next((r for r in all_runtimes() if backend in r.backends()), None)
    if found is None:
        raise UnknownNameError(suggest(backend, all_backends(), "backend"))
    return found


def target_of(backend: str) -> Target:
    return next(t for t in runtime_of_backend(backend).targets if t.backend == backend)


def all_backends() -> list[str]:
    return sorted(b for r in all_runtimes() for b in r.backends())


def export_formats() -> list[str]:
    return [r.format for r in file_runtimes()]


def supported_exports() -> str:
    return "; ".join(f"{r.format}: {', '.join(r.precisions)}" for r in file_runtimes())


def artifact_kinds() -> list[str]:
    """The kinds a stage's record gives its artifacts, files before models, in shipping order."""
    return [r.kind for r in all_runtimes()]


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


def open_file(path, backend: str | None = None, threads: int | None = None, spinning: bool = True) -> Session:
    """Any file in its runtime (on `backend`'s device; None: the runtime's default): the one way a
    file is opened, for predict, evaluation, benchmarks and checks alike."""
    runtime = runtime_of_path(path)
    if runtime.suffix is None:
        suffixes = ", ".join(r.suffix for r in file_runtimes())
        raise EffvisionError(f"cannot run {path}: expected a file ({suffixes})")
    backend = runtime.check_backend(backend)
    device = next(iter(target_of(backend).supports))
    runtime.require("run", device)
    return runtime.open(path, device, threads, spinning)


__all__ = [
    "Runtime",
    "RuntimeUnavailable",
    "Session",
    "Target",
    "all_backends",
    "all_runtimes",
    "artifact_kinds",
    "export_formats",
    "file_kinds",
    "file_runtimes",
    "open_file",
    "runtime_named",
    "runtime_of_backend",
    "runtime_of_format",
    "runtime_of_kind",
    "runtime_of_path",
    "shipped_artifact",
    "shipped_record",
    "supported_exports",
    "target_of",
]
