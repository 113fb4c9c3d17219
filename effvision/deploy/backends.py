"""Benchmark backends (the BACKENDS registry): what runs a model or an artifact, on which device
and in which precisions. Each backend loads its target into a `Loaded` runner: a function that
makes an input batch on the right device in the right dtype/layout, and one that runs it."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import nn

from ..errors import EffvisionError
from ..registry import BACKENDS
from .torch_precision import input_dtype, math_mode, prepare_model


@dataclass
class BenchOptions:
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: str = "fp32"
    channels_last: bool = False
    compile_mode: str = "default"  # torch.compile mode: default, reduce-overhead (CUDA graphs), max-autotune ...
    threads: int | None = None
    calibration: Iterable[torch.Tensor] = ()  # batches for static int8 (pt2e)
    side_by_side: bool = False  # timed interleaved with other targets in this process (bench.compare)


@dataclass
class Loaded:
    run: Callable[[Any], Any]
    make_input: Callable[[int], Any]
    notes: dict = field(default_factory=dict)


def random_batch(batch: int, shape: list[int]) -> torch.Tensor:
    return torch.randn(batch, *shape, generator=torch.Generator().manual_seed(0))


class BackendUnavailable(EffvisionError):
    """The backend cannot run on this machine (a package or provider absent or inactive)."""


class Backend:
    takes = "model"  # "model" (a torch nn.Module) or a file suffix
    supports: dict[str, tuple[str, ...]] = {}  # device type -> precisions
    packages: tuple[str, ...] = ()  # the distributions that run it beside torch (their versions key its timings)

    @classmethod
    def versions(cls) -> list[str]:
        """'name version' of each package it runs on: a timing measured under other versions is not reused."""
        from importlib import import_module
        from importlib.metadata import PackageNotFoundError, version

        def one(name: str) -> str:
            try:
                return version(name)
            except PackageNotFoundError:  # (a build under another distribution name, e.g. onnxruntime-gpu)
                try:
                    return import_module(name).__version__
                except (ImportError, AttributeError):
                    return "absent"

        return [one(name) for name in cls.packages]

    @classmethod
    def missing(cls) -> str | None:
        """Why this backend cannot run here (a package or provider absent), or None."""
        return None

    def load(self, target, shape: list[int], opts: BenchOptions) -> Loaded:
        raise NotImplementedError

    def check_file(self, path, opts: BenchOptions) -> None:
        """A file backend's target: a path of its runtime's kind, in the precision asked for (read off
        the file by its runtime); else one line."""
        from .runtimes import runtime_taking

        runtime = runtime_taking(self.takes)
        if not isinstance(path, (str, Path)):
            raise EffvisionError(f"{self.name} runs {runtime.describes}")
        found = runtime.precision(path)
        if found != opts.precision:
            raise EffvisionError(f"{path} is a {found} model, not {opts.precision}")


@BACKENDS.register("torch-eager")
class TorchEager(Backend):
    """PyTorch eager under inference_mode. int8/float8 on a GPU via torchao."""

    supports = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "tf32", "bf16", "fp16", "int8", "float8")}

    def wrap(self, model: nn.Module, opts: BenchOptions) -> Callable:
        return model

    def load(self, model, shape, opts):
        if not isinstance(model, nn.Module):
            raise EffvisionError(f"{self.name} runs a torch model, not a file ({model})")
        dev = opts.device
        if opts.threads:
            torch.set_num_threads(opts.threads)
        model, notes = prepare_model(
            model, opts.precision, dev, random_batch(1, shape), opts.calibration, opts.channels_last
        )
        fn = self.wrap(model, opts)
        dtype = input_dtype(opts.precision, dev)
        cudagraphs = dev.type == "cuda" and self.uses_cudagraphs(opts)
        ctx = self.context(opts)

        def make_input(batch: int):
            x = random_batch(batch, shape).to(dev, dtype)
            return x.contiguous(memory_format=torch.channels_last) if opts.channels_last and x.dim() == 4 else x

        def run(x):
            with torch.inference_mode(), math_mode(opts.precision), ctx():
                if cudagraphs:
                    torch.compiler.cudagraph_mark_step_begin()
                return fn(x)

        return Loaded(run, make_input, notes)

    def uses_cudagraphs(self, opts: BenchOptions) -> bool:
        return False

    def context(self, opts: BenchOptions):
        return contextlib.nullcontext


@BACKENDS.register("torch-compile")
class TorchCompile(TorchEager):
    """torch.compile with inductor (mode from --compile-mode; reduce-overhead = CUDA graphs on a
    GPU). On the CPU weights are frozen (constant-folded and pre-packed), which int8 needs."""

    supports = {"cpu": ("fp32", "bf16", "int8"), "cuda": ("fp32", "tf32", "bf16", "fp16", "int8", "float8")}

    def wrap(self, model, opts):
        # a fresh dynamo per compiled model: its recompile limit (8 per code object) is shared by
        # every model of one class, and past it later models would silently run eager
        torch._dynamo.reset()
        return torch.compile(model, mode=None if opts.compile_mode == "default" else opts.compile_mode, dynamic=False)

    def uses_cudagraphs(self, opts):
        return opts.compile_mode in ("reduce-overhead", "max-autotune")

    def context(self, opts):
        if opts.device.type != "cpu":
            return contextlib.nullcontext
        import torch._inductor.config as inductor_config

        return lambda: inductor_config.patch(freezing=True)


class OnnxRuntime(Backend):
    takes = ".onnx"
    packages = ("onnxruntime",)
    provider = "CPUExecutionProvider"

    @classmethod
    def missing(cls):
        import onnxruntime as ort

        if cls.provider not in ort.get_available_providers():
            return f"onnxruntime has no {cls.provider} here (providers: {', '.join(ort.get_available_providers())})"
        return None

    def load(self, path, shape, opts):
        from .runtime import ort_session

        self.check_file(path, opts)
        providers = [self.provider] + (["CPUExecutionProvider"] if self.provider != "CPUExecutionProvider" else [])
        session = ort_session(path, threads=opts.threads, providers=providers, spinning=not opts.side_by_side)
        if session.get_providers()[0] != self.provider:  # ORT falls back to the CPU with only a warning
            raise BackendUnavailable(
                f"onnxruntime did not start {self.provider} (session runs on {', '.join(session.get_providers())})"
            )
        name = session.get_inputs()[0].name
        return Loaded(
            lambda x: session.run(None, {name: x}),
            lambda b: random_batch(b, shape).numpy(),
            {"providers": session.get_providers()},
        )


@BACKENDS.register("onnxruntime-cpu")
class OnnxRuntimeCpu(OnnxRuntime):
    """ONNX Runtime's CPU execution provider (int8: QDQ U8S8 kernels)."""

    supports = {"cpu": ("fp32", "fp16", "int8")}


@BACKENDS.register("onnxruntime-cuda")
class OnnxRuntimeCuda(OnnxRuntime):
    """ONNX Runtime's CUDA execution provider, when the installed onnxruntime has it (inputs
    are copied from the host on every call, as an application feeding numpy would)."""

    supports = {"cuda": ("fp32", "fp16", "int8")}
    provider = "CUDAExecutionProvider"


@BACKENDS.register("executorch")
class Executorch(Backend):
    """An ExecuTorch .pte program lowered to XNNPACK, run by ExecuTorch's runtime."""

    takes = ".pte"
    supports = {"cpu": ("fp32", "int8")}
    packages = ("executorch",)

    @classmethod
    def missing(cls):
        from .executorch_export import executorch_missing

        return executorch_missing()

    def load(self, path, shape, opts):
        from .executorch_export import pte_input_shape, pte_predictor

        program_batch = pte_input_shape(path)[0]

        def make_input(batch: int):
            if batch != program_batch:
                raise EffvisionError(
                    f"{path} is exported for batch {program_batch}, not {batch} (export one .pte per batch size)"
                )
            return random_batch(batch, shape)

        return Loaded(pte_predictor(path, exact=True), make_input, {"program_batch": program_batch})


@BACKENDS.register("openvino-cpu")
class OpenvinoCpu(Backend):
    """An OpenVINO IR (.xml) compiled for the CPU with the latency hint (int8: NNCF's files)."""

    takes = ".xml"
    supports = {"cpu": ("fp32", "int8")}
    packages = ("openvino",)

    @classmethod
    def missing(cls):
        from .openvino_export import openvino_missing

        return openvino_missing()

    def load(self, path, shape, opts):
        from .openvino_export import ir_predictor

        self.check_file(path, opts)
        return Loaded(ir_predictor(path, opts.threads), lambda b: random_batch(b, shape).numpy())


@BACKENDS.register("litert-cpu")
class LitertCpu(Backend):
    """A LiteRT file (.tflite) in ai-edge-litert's interpreter, XNNPACK on the CPU."""

    takes = ".tflite"
    supports = {"cpu": ("fp32", "int8")}
    packages = ("ai-edge-litert",)

    @classmethod
    def missing(cls):
        from .litert_export import litert_missing

        return litert_missing()

    def load(self, path, shape, opts):
        from .litert_export import tflite_predictor

        self.check_file(path, opts)
        return Loaded(tflite_predictor(path, opts.threads), lambda b: random_batch(b, shape).numpy())


def backend(name: str) -> Backend:
    inst = BACKENDS.get(name)()
    inst.name = name
    return inst


def supported_pairs(device_type: str) -> str:
    """'backend: precisions; ...' for one device type, for error messages and --help."""
    rows = [
        f"{n}: {', '.join(BACKENDS.get(n).supports[device_type])}"
        for n in BACKENDS.names()
        if device_type in BACKENDS.get(n).supports
    ]
    return "; ".join(rows)


def check_pair(name: str, precision: str, device: torch.device) -> Backend:
    """The backend, if it runs `precision` on `device` here; otherwise a one-line error that
    lists the pairs that are supported."""
    inst = backend(name)
    if precision not in inst.supports.get(device.type, ()):
        raise BackendUnavailable(
            f"backend '{name}' does not run {precision} on {device.type}; supported on {device.type}: "
            f"{supported_pairs(device.type)}"
        )
    reason = inst.missing()
    if reason:
        raise BackendUnavailable(f"backend '{name}' is not available: {reason}")
    return inst
