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
from ..runtimes import Runtime, RuntimeUnavailable, file_runtimes, runtime_named, target_of
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


BackendUnavailable = RuntimeUnavailable  # the backend cannot run here (a package or provider absent)


class Backend:
    """A benchmark backend: a runtime's target (runtimes/), which loads its model or file into a Loaded runner."""

    runtime: Runtime
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
        return cls.runtime.missing("run", next(iter(cls.supports)))

    def load(self, target, shape: list[int], opts: BenchOptions) -> Loaded:
        raise NotImplementedError


class FileBackend(Backend):
    """A file runtime's target: the file opened by its runtime (the one way files are opened)."""

    def load(self, path, shape, opts):
        runtime = self.runtime
        if not isinstance(path, (str, Path)):
            raise EffvisionError(f"{self.name} runs {runtime.describes}, not a torch model")
        found = runtime.precision(path, said=opts.precision)  # (a .pte does not say: taken as asked)
        if found != opts.precision:
            raise EffvisionError(f"{path} is a {found} model, not {opts.precision}")
        session = runtime.open(path, opts.device.type, opts.threads, spinning=not opts.side_by_side)
        fixed = runtime.input_shape(path)[0] if runtime.batch_rule == "fixed" else None

        def make_input(batch: int):
            if fixed is not None and batch != fixed:
                raise EffvisionError(
                    f"{path} is exported for batch {fixed}, not {batch} (export one file per batch size)"
                )
            return random_batch(batch, shape).numpy()

        return Loaded(session.run, make_input, session.notes)


def _register_file_backends() -> None:
    """One backend per target of every file runtime, named as the runtime names it."""
    for runtime in file_runtimes():
        for target in runtime.targets:
            attrs = {"runtime": runtime, "takes": runtime.suffix, "supports": target.supports}
            attrs.update(packages=runtime.packages, __doc__=f"{runtime.describes} on {target.backend}")
            BACKENDS.register(target.backend, type(f"Backend_{target.backend}", (FileBackend,), attrs))


@BACKENDS.register("torch-eager")
class TorchEager(Backend):
    """PyTorch eager under inference_mode. int8/float8 on a GPU via torchao."""

    runtime = runtime_named("torch")
    supports = target_of("torch-eager").supports

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

    supports = target_of("torch-compile").supports

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


_register_file_backends()


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


def default_pairs(names: list[str], precisions: list[str], device: torch.device) -> tuple[list, list[str]]:
    """The (backend, precision) pairs among default backends that run on `device`, and the ones
    left out ('torch-eager int8'): with no backend named, a precision runs where it can. None at all
    is a one-line error."""
    pairs, skipped = [], []
    for name in names:
        runs = BACKENDS.get(name).supports.get(device.type, ())
        for precision in precisions:
            (pairs if precision in runs else skipped).append((name, precision))
    if not pairs:
        raise BackendUnavailable(
            f"no default backend ({', '.join(names)}) runs {', '.join(precisions)} on {device.type}; "
            f"name one with --backend (supported on {device.type}: {supported_pairs(device.type)})"
        )
    return pairs, [f"{n} {p}" for n, p in skipped]
